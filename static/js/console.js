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

// The live bar (templates/console/_live_bar.html) says when the run changed since this page
// was rendered: the page's action buttons are then disabled until it is reloaded (the server's
// version check stays the final guard).
(function () {
  "use strict";
  document.addEventListener("htmx:afterSettle", function () {
    var main = document.getElementById("run-main");
    if (!main) return;
    var stale = document.querySelector("#live [data-live-stale]") !== null;
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
