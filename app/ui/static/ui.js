// jobq dashboard: the little it needs beyond HTML forms. No build step, no dependencies.
"use strict";

// A notice (?flash=...) is shown once: reloading or refreshing the page does not repeat it.
(() => {
  const here = new URL(window.location.href);
  if (here.searchParams.has("flash")) {
    here.searchParams.delete("flash");
    window.history.replaceState(null, "", here);
  }
})();

// Destructive buttons ask first: <form data-confirm="..."> or <button data-confirm="...">.
document.addEventListener("submit", (event) => {
  const pressed = event.submitter && event.submitter.dataset.confirm;
  const question = pressed || (event.target.dataset && event.target.dataset.confirm);
  if (question && !window.confirm(question)) event.preventDefault();
});

// A list's header box ticks or clears every job's box.
document.addEventListener("change", (event) => {
  if (!event.target.matches("input[data-select-all]")) return;
  for (const box of document.querySelectorAll('input[type=checkbox][form="selected"]')) {
    box.checked = event.target.checked;
  }
});

// Pages with <main data-refresh="N"> reload their content every N seconds while visible, unless the
// auto-refresh box is unticked (remembered per browser).
(() => {
  const main = document.querySelector("main[data-refresh]");
  const box = document.getElementById("auto-refresh");
  if (!main || !box) return;
  box.checked = localStorage.getItem("jobq.autoRefresh") !== "off";
  box.addEventListener("change", () => localStorage.setItem("jobq.autoRefresh", box.checked ? "on" : "off"));
  const every = Number(main.dataset.refresh) * 1000;
  setInterval(async () => {
    if (!box.checked || document.hidden) return;
    try {
      const response = await fetch(window.location.href, { headers: { Accept: "text/html" } });
      if (!response.ok) return;
      const page = new DOMParser().parseFromString(await response.text(), "text/html");
      const fresh = page.querySelector("main");
      if (fresh) main.innerHTML = fresh.innerHTML;
    } catch (error) {
      // The service is restarting or unreachable: keep what is shown, try again next time.
    }
  }, every);
})();
