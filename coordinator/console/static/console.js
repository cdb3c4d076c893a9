// fleetcheck console: keep the page's live part fresh without reloading.
// The script asks the page's own URL again (the same filters) with a
// header that gets only the part below the filters, and swaps it in when
// it changed (ETag). No library, nothing fetched from elsewhere.
(function () {
  "use strict";
  var live = document.getElementById("live");
  var badge = document.getElementById("live-state");
  var every = live ? parseInt(live.getAttribute("data-refresh"), 10) : 0;
  if (!live || !(every > 0)) { return; }
  var etag = "";
  var busy = false;
  function mark(ok) {
    if (!badge) { return; }
    badge.textContent = ok ? "live " + new Date().toLocaleTimeString() : "stale: retrying";
    badge.className = ok ? "live-state" : "live-state stale";
  }
  function poll() {
    // A half-typed reason in an action form is not thrown away.
    var a = document.activeElement;
    if (busy || (a && live.contains(a) && a.tagName === "INPUT")) { return; }
    busy = true;
    var headers = { "X-Console-Live": "1" };
    if (etag) { headers["If-None-Match"] = etag; }
    fetch(window.location.href, { headers: headers, credentials: "same-origin", cache: "no-store" })
      .then(function (r) {
        if (r.status === 304) { mark(true); return null; }
        if (!r.ok) { throw new Error("HTTP " + r.status); }
        etag = r.headers.get("ETag") || "";
        return r.text();
      })
      .then(function (html) {
        if (html !== null) { live.innerHTML = html; live.setAttribute("data-updated", String(Date.now())); }
        mark(true);
      })
      .catch(function () { mark(false); })
      .then(function () { busy = false; });
  }
  window.setInterval(poll, every);
})();
