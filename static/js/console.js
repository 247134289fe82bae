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
