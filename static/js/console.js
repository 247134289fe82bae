// TaskPilots console: tell the server the browser's time zone, so every time is shown in it.
// The login form carries it in a hidden field; a session that does not know it yet (or whose
// browser moved to another zone) posts it once and reloads. Without JavaScript: UTC.
(function () {
  "use strict";
  var zone;
  try {
    zone = Intl.DateTimeFormat().resolvedOptions().timeZone;
  } catch (error) {
    return;
  }
  if (!zone) return;
  var field = document.querySelector("input[name=time_zone]");
  if (field) field.value = zone;
  var body = document.body;
  var url = body.getAttribute("data-time-zone-url");
  if (!url || body.getAttribute("data-time-zone-reported") === zone) return;
  var headers = JSON.parse(body.getAttribute("hx-headers") || "{}");
  headers["Content-Type"] = "application/x-www-form-urlencoded";
  fetch(url, {
    method: "POST",
    headers: headers,
    credentials: "same-origin",
    body: "time_zone=" + encodeURIComponent(zone),
  }).then(function (response) {
    // Shown in UTC until now: show this page again in the browser's zone.
    if (response.status === 204 && body.getAttribute("data-time-zone") !== zone) {
      window.location.reload();
    }
  });
})();

// Whether the person is writing in one of the page's forms (a refresh would throw it away).
function editing(root) {
  var active = document.activeElement;
  if (active && root.contains(active) && /^(INPUT|TEXTAREA|SELECT)$/.test(active.tagName)) {
    return true;
  }
  var fields = root.querySelectorAll(".action-form textarea, .action-form input[type=text]");
  for (var i = 0; i < fields.length; i++) {
    if (fields[i].value !== fields[i].defaultValue) return true;
  }
  return false;
}

// The live bar (templates/console/_live_bar.html) says when the run changed since this page
// was rendered: the page's action buttons are then disabled until it is reloaded (the server's
// version check stays the final guard).
(function () {
  "use strict";
  document.addEventListener("htmx:afterSettle", function () {
    var main = document.getElementById("run-main");
    if (!main) return;
    var stale = document.querySelector("#live [data-live-stale]") !== null;
    if (!stale && document.querySelector("#live [data-live-refresh]") && !editing(main)) {
      // The run moved on by itself or by this person's own action: show it as it is now.
      htmx.trigger(main, "tp-refresh");
    }
    main.classList.toggle("is-stale", stale);
    var buttons = main.querySelectorAll(".actions .action-form button[type=submit]");
    for (var i = 0; i < buttons.length; i++) {
      var button = buttons[i];
      if (stale && !button.disabled) {
        button.disabled = true;
        button.setAttribute("data-live-disabled", "");
      } else if (!stale && button.hasAttribute("data-live-disabled")) {
        // A poll that crossed this page's own action: the fresh page is not stale after all.
        button.disabled = false;
        button.removeAttribute("data-live-disabled");
      }
    }
  });
})();

// === Reading timeline (templates/console/timeline.html) ===================================
// A link to an event (a lane-chart marker, "next failure") opens the line it lands on, so its
// payload loads (htmx, on the <details>' toggle) and a collapsed run of attempts unfolds.
(function () {
  "use strict";
  function openTarget() {
    var id = window.location.hash.slice(1);
    if (!id || id.indexOf("event-") !== 0 && id.indexOf("attempts-") !== 0) return;
    var line = document.getElementById(id);
    if (!line) return;
    var details = line.querySelector("details");
    if (details && !details.open) details.open = true;
    line.scrollIntoView({ block: "start" });
  }
  window.addEventListener("hashchange", openTarget);
  document.addEventListener("DOMContentLoaded", openTarget);
})();
// === end Reading timeline ==================================================================

// Lists: each cell carries its column's name (a phone shows rows as cards, value under name),
// and a table wider than its card says that it scrolls sideways. Text only (textContent,
// setAttribute): no markup and no inline style is written, so the CSP needs no exception.
(function () {
  "use strict";
  function label(table) {
    var heads = table.querySelectorAll("thead th");
    var rows = table.querySelectorAll("tbody tr");
    for (var r = 0; r < rows.length; r++) {
      var cells = rows[r].children;
      for (var c = 0; c < cells.length && c < heads.length; c++) {
        var head = heads[c];
        var name = head.querySelector(".sr-only") ? "" : head.textContent.trim();
        if (name && !cells[c].hasAttribute("data-label")) cells[c].setAttribute("data-label", name);
      }
    }
  }
  function hint(wrap) {
    var scrolls = wrap.scrollWidth > wrap.clientWidth + 1;
    wrap.classList.toggle("is-scrollable", scrolls);
    var note = wrap.previousElementSibling;
    var has = note && note.classList.contains("scroll-hint");
    var text = document.getElementById("scroll-hint-text");
    if (scrolls && !has && text) {
      note = document.createElement("p");
      note.className = "scroll-hint";
      note.setAttribute("aria-hidden", "true");
      note.textContent = text.textContent;
      wrap.parentNode.insertBefore(note, wrap);
    } else if (!scrolls && has) {
      note.parentNode.removeChild(note);
    }
  }
  function update() {
    var tables = document.querySelectorAll("table.runs");
    for (var i = 0; i < tables.length; i++) label(tables[i]);
    var wraps = document.querySelectorAll(".table-wrap");
    for (var j = 0; j < wraps.length; j++) hint(wraps[j]);
  }
  document.addEventListener("DOMContentLoaded", update);
  document.addEventListener("htmx:afterSettle", update);
  window.addEventListener("resize", update);
})();

// Keyboard shortcuts (listed in the "?" dialog, templates/console/_shortcuts.html): j/k move
// through a list of runs, o or Enter opens, a approves after a confirmation, r opens the
// rejection form (its reason is the confirmation), c claims. Never while typing in a field.
(function () {
  "use strict";
  var selected = null; // the href of the selected row, kept across the inbox's live refreshes

  function typing(target) {
    if (!target || !target.tagName) return false;
    var tag = target.tagName.toLowerCase();
    return tag === "input" || tag === "textarea" || tag === "select" || target.isContentEditable;
  }
  function rows() {
    var found = document.querySelectorAll("main table.runs tbody tr");
    var list = [];
    for (var i = 0; i < found.length; i++) if (link(found[i])) list.push(found[i]);
    return list;
  }
  function link(row) {
    return row.querySelector(".open-cell a[href]") || row.querySelector("a[href]");
  }
  function select(row) {
    var all = document.querySelectorAll("main table.runs tbody tr.is-selected");
    for (var i = 0; i < all.length; i++) all[i].classList.remove("is-selected");
    if (!row) return;
    row.classList.add("is-selected");
    selected = link(row).getAttribute("href");
    link(row).focus();
  }
  function move(step) {
    var list = rows();
    if (!list.length) return;
    var at = -1;
    for (var i = 0; i < list.length; i++) if (list[i].classList.contains("is-selected")) at = i;
    var next = at === -1 ? (step > 0 ? 0 : list.length - 1) : at + step;
    select(list[Math.max(0, Math.min(list.length - 1, next))]);
  }
  function button(selector) {
    var found = document.querySelector(selector);
    return found && !found.disabled ? found : null;
  }
  function approve() {
    var submit = button("#actions form[data-action=approve] button[type=submit]");
    var dialog = document.getElementById("shortcut-confirm");
    if (!submit || !dialog) return;
    dialog.returnValue = "";
    dialog.onclose = function () {
      if (dialog.returnValue === "confirm") submit.click();
    };
    dialog.showModal();
  }
  function reject() {
    var form = document.querySelector("#actions form[data-action=reject]");
    if (!form) return;
    var details = form.closest("details");
    if (details) details.open = true;
    var field = form.querySelector("textarea, input:not([type=hidden])");
    (field || form.querySelector("button[type=submit]")).focus();
  }
  var keys = {
    j: function () { move(1); },
    k: function () { move(-1); },
    o: function () {
      var row = document.querySelector("main table.runs tbody tr.is-selected");
      if (row) link(row).click();
    },
    a: approve,
    r: reject,
    c: function () {
      var claim = button("#live button[data-claim=claim]");
      if (claim) claim.click();
    },
    "?": function () {
      var help = document.getElementById("shortcut-help");
      if (help && !help.open) help.showModal();
    },
  };
  document.addEventListener("keydown", function (event) {
    if (event.defaultPrevented || event.ctrlKey || event.metaKey || event.altKey) return;
    if (typing(event.target) || document.querySelector("dialog[open]")) return;
    var key = event.key;
    if (key === "Enter") {
      // Enter on a focused link or button does what it always does; on the page it opens.
      if (event.target !== document.body && event.target.id !== "content") return;
      key = "o";
    }
    var action = keys[key];
    if (!action) return;
    event.preventDefault();
    action();
  });
  // The inbox refreshes itself every few seconds: keep the selection (and the focus) on the
  // same run when its row comes back.
  document.addEventListener("htmx:afterSettle", function () {
    if (!selected) return;
    var list = rows();
    for (var i = 0; i < list.length; i++) {
      if (link(list[i]).getAttribute("href") === selected) {
        var hadFocus = document.activeElement === document.body;
        list[i].classList.add("is-selected");
        if (hadFocus) link(list[i]).focus();
      }
    }
  });
})();

// === Incident desk (issue 33 §2): runs picked in the inbox survive its live refresh ========
// The list is swapped every few seconds (and when a filter changes): the ids picked are kept
// here and ticked again in the fresh rows; the button shows how many are picked. Without
// JavaScript the boxes still submit with the form (a refresh then clears them).
(function () {
  "use strict";
  var picked = {};
  var BOXES = "input[type=checkbox][name=runs][form=pick-form]";
  function show() {
    var boxes = document.querySelectorAll(BOXES);
    var n = 0;
    for (var i = 0; i < boxes.length; i++) {
      boxes[i].checked = picked[boxes[i].value] === true;
      if (boxes[i].checked) n += 1;
    }
    var count = document.querySelector("[data-pick-count]");
    if (count) count.textContent = String(n);
  }
  document.addEventListener("change", function (event) {
    var box = event.target;
    if (!box.matches || !box.matches(BOXES)) return;
    if (box.checked) picked[box.value] = true;
    else delete picked[box.value];
    show();
  });
  document.addEventListener("htmx:afterSettle", show);
})();
