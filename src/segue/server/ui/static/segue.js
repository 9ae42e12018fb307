// segue web UI: refreshes a page's live part and sends the steering buttons to
// the API. No framework, no build. Responses are server-rendered HTML that
// Jinja escaped; messages go in with textContent only.
"use strict";
(function () {
  const live = document.getElementById("live");
  const msg = document.getElementById("action-msg");
  let fastUntil = 0;
  let running = false;

  function say(text, bad) {
    if (!msg) return;
    msg.textContent = text;
    msg.classList.toggle("bad", !!bad);
  }

  function root() { return live ? live.querySelector(".live-root") : null; }

  async function refresh() {
    if (!live) return;
    const url = live.dataset.url || location.pathname + location.search;
    let r;
    try {
      r = await fetch(url + (url.includes("?") ? "&" : "?") + "partial=1",
                      { credentials: "same-origin", headers: { "Accept": "text/html" }, cache: "no-store" });
    } catch (e) {
      say("connection to the server lost; retrying", true);
      return;
    }
    if (r.status === 401) {
      location.assign("/login?next=" + encodeURIComponent(location.pathname + location.search));
      return;
    }
    if (!r.ok) return;
    const html = await r.text();
    const open = Array.from(live.querySelectorAll("details[open][id]")).map((d) => d.id);
    const log = document.getElementById("log");
    const atEnd = log && log.scrollTop + log.clientHeight >= log.scrollHeight - 4;
    const tpl = document.createElement("template");
    tpl.innerHTML = html;
    live.replaceChildren(tpl.content);
    for (const id of open) {
      const d = document.getElementById(id);
      if (d) d.open = true;
    }
    const newLog = document.getElementById("log");
    if (newLog && atEnd) newLog.scrollTop = newLog.scrollHeight;
  }

  const sleep = (ms) => new Promise((ok) => setTimeout(ok, ms));

  async function loop() {
    if (running) return;
    running = true;
    try {
      for (;;) {
        const r = root();
        if (!r || r.dataset.follow !== "1") break;
        let ms = Number(r.dataset.pollMs) || 4000;
        if (Date.now() < fastUntil) ms = Math.min(ms, 400);
        await sleep(ms);
        if (!document.hidden || Date.now() < fastUntil) await refresh();
      }
    } finally {
      running = false;
    }
  }

  document.addEventListener("click", async (ev) => {
    const b = ev.target.closest("button[data-action]");
    if (!b) return;
    const action = b.dataset.action;
    const run = b.dataset.run;
    if (action === "cancel" && !window.confirm("Cancel run " + run + "? It cannot be resumed.")) return;
    b.disabled = true;
    say(action + ": sending…");
    let r;
    try {
      // A POST from this page carries its Origin; the API checks it and the role.
      r = await fetch("/api/runs/" + encodeURIComponent(run) + "/" + action, {
        method: "POST", credentials: "same-origin",
        headers: { "Content-Type": "application/json", "Accept": "application/json" }, body: "{}",
      });
    } catch (e) {
      say(action + " failed: the server cannot be reached", true);
      b.disabled = false;
      return;
    }
    let body = {};
    try { body = await r.json(); } catch (e) { body = {}; }
    if (r.ok) say(action + ": run " + run + " is " + (body.state || "?"));
    else say(action + " refused (" + r.status + "): " + (body.error || r.statusText), true);
    fastUntil = Date.now() + 15000;
    await refresh();
    loop();
  });

  if (live) loop();
})();
