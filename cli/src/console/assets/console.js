// Live updates for the console's pages: the server pushes the page's re-rendered live part by
// server-sent events (batched on the server); this swaps it in and keeps keyboard focus.
(function () {
  "use strict";
  var live = document.getElementById("live");
  var state = document.getElementById("live-state");
  var updated = document.getElementById("updated");
  if (!live || !live.dataset.live || !window.EventSource) {
    if (state) state.textContent = "Static page";
    return;
  }
  var updates = 0;
  var source = new EventSource(live.dataset.live);
  source.onopen = function () { state.textContent = "● Live"; };
  source.onerror = function () {
    // CLOSED: the console refused the stream (e.g. 429, too many open pages); no retry follows.
    state.textContent = source.readyState === EventSource.CLOSED ? "○ Not live (too many open pages?): reload to retry" : "○ Reconnecting…";
  };
  source.addEventListener("update", function (e) {
    var msg = JSON.parse(e.data);
    var focused = document.activeElement && document.activeElement.id;
    live.innerHTML = msg.html;
    if (focused) {
      var again = document.getElementById(focused);
      if (again) again.focus();
    }
    updates += 1;
    live.dataset.updates = String(updates);
    updated.textContent = msg.at;
    state.textContent = "● Live";
  });
  source.addEventListener("problem", function (e) {
    state.textContent = "⚠ " + JSON.parse(e.data).message;
  });
  source.addEventListener("auth", function () {
    source.close();
    window.location.assign("/login");
  });
})();
