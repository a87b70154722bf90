"use strict";
(function () {
  var start = performance.now();
  function fmt(s) {
    var sign = s < 0 ? "-" : "";
    s = Math.abs(s);
    function two(n) { return (n < 10 ? "0" : "") + n; }
    if (s < 10) return sign + s.toFixed(1) + "s";
    if (s < 60) return sign + Math.floor(s) + "s";
    if (s < 3600) return sign + Math.floor(s / 60) + "m" + two(Math.floor(s % 60)) + "s";
    if (s < 86400) return sign + Math.floor(s / 3600) + "h" + two(Math.floor(s % 3600 / 60)) + "m";
    return sign + Math.floor(s / 86400) + "d" + two(Math.floor(s % 86400 / 3600)) + "h";
  }
  function tick() {
    var gone = (performance.now() - start) / 1000;
    document.querySelectorAll("[data-down]").forEach(function (e) {
      var v = parseFloat(e.getAttribute("data-down")) - gone;
      e.textContent = fmt(v);
      e.classList.toggle("expired", v < 0);
    });
    document.querySelectorAll("[data-up]").forEach(function (e) {
      e.textContent = fmt(parseFloat(e.getAttribute("data-up")) + gone);
    });
  }
  tick();
  setInterval(tick, 200);
  var refresh = parseInt(document.body.getAttribute("data-refresh"), 10);
  if (refresh > 0) setTimeout(function () { location.reload(); }, refresh * 1000);
})();
