// The overview's live panels: pushed by the server as server-sent events (/dashboard/events).
// A stream silent past STALE_MS, or dropped, marks the page stale and reconnects.
"use strict";
(function () {
  // Ages ("12 s ago") from each <time data-at>, so the server's HTML stays the same between looks.
  function ages() {
    const now = Date.now() / 1000;
    for (const el of document.querySelectorAll("time[data-at]")) {
      const s = Math.max(0, now - parseFloat(el.dataset.at));
      el.textContent = s >= 86400 ? Math.floor(s / 86400) + " d ago" : s >= 3600 ? Math.floor(s / 3600) + " h ago"
        : s >= 60 ? Math.floor(s / 60) + " min ago" : Math.floor(s) + " s ago";
    }
  }
  ages();
  setInterval(ages, 1000);

  // A panel replaced while someone types a reason in it keeps what they typed.
  function replace(el, html) {
    const typed = {};
    for (const input of el.querySelectorAll("form input:not([type=hidden])")) {
      if (input.value) typed[input.form.getAttribute("action") + " " + input.name] = input.value;
    }
    const focused = document.activeElement && el.contains(document.activeElement)
      ? document.activeElement.form.getAttribute("action") : null;
    el.innerHTML = html;
    for (const input of el.querySelectorAll("form input:not([type=hidden])")) {
      const key = input.form.getAttribute("action") + " " + input.name;
      if (key in typed) input.value = typed[key];
      if (focused && input.form.getAttribute("action") === focused) input.focus();
    }
    ages();
  }

  const live = document.getElementById("live");
  if (!live) return; // not the overview
  const STALE_MS = 8000;
  let source = null;
  let heard = 0;

  function show(state, words) {
    live.dataset.state = state;
    live.textContent = words;
  }

  function fresh() {
    heard = Date.now();
    show("live", "Live: updated " + new Date(heard).toLocaleTimeString());
  }

  function connect() {
    if (source) source.close();
    source = new EventSource("/dashboard/events");
    heard = Date.now();
    source.addEventListener("open", fresh);
    source.addEventListener("tick", fresh);
    for (const el of document.querySelectorAll("[data-panel]")) {
      source.addEventListener(el.dataset.panel, function (e) {
        replace(el, e.data);
        fresh();
      });
    }
    source.addEventListener("problem", function (e) {
      heard = Date.now();
      show("stale", "Stale: " + e.data + " (what you see may be out of date)");
    });
    source.addEventListener("signed-out", function () {
      source.close();
      window.location.assign("/dashboard/");
    });
    source.addEventListener("error", function () {
      show("stale", "Stale: the live stream dropped; reconnecting…");
    });
  }

  setInterval(function () {
    if (Date.now() - heard > STALE_MS) {
      show("stale", "Stale: nothing heard from the control plane for " +
        Math.round((Date.now() - heard) / 1000) + " s; reconnecting…");
      connect();
    }
  }, 2000);
  connect();
})();
