"use strict";
// Errors are kept where a test (or a curious operator) can read them.
window.__estafetaErrors = window.__estafetaErrors || [];
window.addEventListener("error", function (e) {
  window.__estafetaErrors.push(String(e.message));
});
window.addEventListener("unhandledrejection", function (e) {
  window.__estafetaErrors.push(String(e.reason));
});
document.addEventListener("securitypolicyviolation", function (e) {
  window.__estafetaErrors.push("CSP " + e.violatedDirective + " " + e.blockedURI);
});
// Live figures: the part of the page marked data-live is fetched again
// every few seconds and swapped in.
(function () {
  var live = document.querySelector("[data-live]");
  if (!live) {
    return;
  }
  setInterval(function () {
    fetch(window.location.href, { credentials: "same-origin" })
      .then(function (r) {
        if (!r.ok) {
          throw new Error("HTTP " + r.status);
        }
        return r.text();
      })
      .then(function (html) {
        var fresh = new DOMParser().parseFromString(html, "text/html").querySelector("[data-live]");
        if (fresh) {
          live.innerHTML = fresh.innerHTML;
        }
      })
      .catch(function (e) {
        live.setAttribute("data-stale", String(e.message));
      });
  }, 3000);
})();
