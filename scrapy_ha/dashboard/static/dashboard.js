// scrapy-ha dashboard: optional. Every page reads and works without it; with it, the live
// pages (overview, crawl) refresh their numbers in place, and a table's "select all"
// ticks every row at once. No build step, no library.

document.getElementById("all")?.addEventListener("change", (e) => {
  document.querySelectorAll('input[name="ids"]').forEach((box) => { box.checked = e.target.checked; });
});

(() => {
  const seconds = Number(document.body.dataset.liveSeconds || 0);
  const badge = document.getElementById("live");
  const text = document.getElementById("live-text");
  if (!seconds || !badge) return;
  let busy = false;

  const say = (state, words) => {
    badge.classList.toggle("on", state === "on");
    badge.classList.toggle("stale", state === "stale");
    text.textContent = words;
  };

  // The sections marked data-live are replaced by those of the same page fetched again:
  // what the server draws is what the browser shows, with or without this script.
  const refresh = async () => {
    if (busy || document.visibilityState !== "visible") return;
    busy = true;
    try {
      const answer = await fetch(location.href, { headers: { "X-HA-Live": "1" }, credentials: "same-origin" });
      if (!answer.ok) throw new Error(`HTTP ${answer.status}`);
      const fresh = new DOMParser().parseFromString(await answer.text(), "text/html");
      document.querySelectorAll("[data-live]").forEach((old) => {
        const now = old.id && fresh.getElementById(old.id);
        if (now) old.replaceWith(now);
      });
      say("on", `live · ${new Date().toLocaleTimeString()}`);
    } catch (error) {
      say("stale", `not refreshed (${error.message})`);
    } finally {
      busy = false;
    }
  };

  say("on", "live");
  setInterval(refresh, seconds * 1000);
  document.addEventListener("visibilitychange", refresh);
})();
