// Safedelivr dashboard: progressive enhancement only. Every page works without this file.
// - forms with data-confirm ask before submitting (revoke a key, remove a suppression);
// - the new API key can be copied with one click;
// - a batch page whose recipients are still queued refreshes its summary and recipient
//   table in place every few seconds (keeping open timelines open) until none are queued.
"use strict";

document.addEventListener("submit", (event) => {
  const form = event.target;
  const question = form instanceof HTMLFormElement ? form.dataset.confirm : undefined;
  if (question && !window.confirm(question)) {
    event.preventDefault();
  }
});

document.querySelectorAll("[data-copy]").forEach((button) => {
  const field = document.getElementById(button.dataset.copy);
  const status = button.parentElement.querySelector(".copy-status");
  if (!field || !navigator.clipboard) return;
  button.hidden = false;
  button.addEventListener("click", async () => {
    try {
      await navigator.clipboard.writeText(field.value);
      if (status) status.textContent = "Copied.";
    } catch {
      field.select();
      if (status) status.textContent = "Press Ctrl+C to copy.";
    }
  });
});

document.querySelectorAll("[data-select-on-focus]").forEach((field) => {
  field.addEventListener("focus", () => field.select());
});

(function liveBatch() {
  const main = document.querySelector("main[data-live]");
  if (!main || !window.fetch || !window.DOMParser) return;
  const seconds = Math.max(Number(main.dataset.live) || 5, 2);
  document.querySelectorAll("[data-live-note]").forEach((note) => {
    note.textContent = `Some recipients are still queued: this page updates every ${seconds} seconds.`;
  });

  async function refresh() {
    if (document.hidden) return schedule();
    let response;
    try {
      response = await fetch(window.location.href, { credentials: "same-origin" });
    } catch {
      return schedule();
    }
    if (!response.ok) return schedule();
    const next = new DOMParser().parseFromString(await response.text(), "text/html");
    const open = new Set(
      [...document.querySelectorAll("details[data-log][open]")].map((d) => d.dataset.log),
    );
    document.querySelectorAll("[data-live-region]").forEach((region) => {
      const fresh = next.getElementById(region.id);
      if (fresh) region.replaceWith(document.importNode(fresh, true));
    });
    document.querySelectorAll("details[data-log]").forEach((d) => {
      if (open.has(d.dataset.log)) d.open = true;
    });
    const still = next.querySelector("main[data-live]");
    if (still) schedule();
  }

  function schedule() {
    window.setTimeout(refresh, seconds * 1000);
  }

  schedule();
})();
