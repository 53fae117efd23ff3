// Safedelivr dashboard: progressive enhancement only. Every page works without this file.
// - forms with data-confirm ask before submitting (revoke a key, remove a suppression);
// - the new API key can be copied with one click;
// - a batch page whose recipients are still queued refreshes its summary and recipient
//   table in place every few seconds (keeping open timelines open) until none are queued;
// - a list's CSV file is uploaded with fetch (the session's CSRF token in X-CSRF-Token) and
//   its import followed each second into a <progress> until it is done or failed.
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

(function csvImport() {
  const state = document.getElementById("import-state");
  const form = document.querySelector("form[data-import]");
  if (!state || !window.fetch) return;
  const bar = document.getElementById("import-progress");
  const status = document.getElementById("import-status");
  let total = null;

  function show(text) {
    status.textContent = text;
  }

  async function follow(url) {
    let response;
    try {
      response = await fetch(url, { credentials: "same-origin", headers: { Accept: "application/json" } });
    } catch {
      return window.setTimeout(() => follow(url), 2000);
    }
    const job = await response.json().catch(() => null);
    if (!response.ok || !job) {
      show((job && job.error && job.error.message) || `The import could not be read (${response.status}).`);
      return;
    }
    const read = job.progress.rows_read;
    if (total !== null) {
      bar.max = Math.max(total, 1);
      bar.value = Math.min(read, bar.max);
    } else {
      bar.removeAttribute("value"); // a page opened mid-import: how many rows is not known
    }
    bar.hidden = false;
    if (job.state === "done" || job.state === "failed") {
      if (job.state === "done" && total !== null) bar.value = bar.max;
      const why = job.reason ? ` (${job.reason})` : "";
      const problems = job.problems.length ? `; ${job.problems.length} row(s) reported` : "";
      show(`Import ${job.state}: ${job.summary}${why}${problems}.`);
      const link = document.createElement("a");
      link.href = window.location.pathname;
      link.textContent = " Show the contacts";
      status.append(link);
      if (form) form.querySelector("button").disabled = false;
      return;
    }
    show(`Importing: ${job.summary}${total !== null ? ` of ${total.toLocaleString("en")}` : ""}…`);
    window.setTimeout(() => follow(url), 1000);
  }

  if (state.dataset.importPoll) follow(state.dataset.importPoll);
  if (!form) return;
  form.hidden = false;
  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    const file = form.querySelector("input[type=file]").files[0];
    if (!file) return;
    const button = form.querySelector("button");
    button.disabled = true;
    show(`Uploading ${file.name}…`);
    let response;
    try {
      response = await fetch(form.action, {
        method: "POST",
        credentials: "same-origin",
        headers: { "Content-Type": "text/csv", "X-CSRF-Token": form.dataset.csrf, Accept: "application/json" },
        body: file,
      });
    } catch {
      show("The upload failed: check the connection and try again.");
      button.disabled = false;
      return;
    }
    const answer = await response.json().catch(() => null);
    if (!response.ok || !answer) {
      show((answer && answer.error && answer.error.message) || `The upload failed (${response.status}).`);
      button.disabled = false;
      return;
    }
    total = answer.rows;
    bar.max = Math.max(total, 1);
    bar.value = 0;
    bar.hidden = false;
    follow(`${form.action}/${answer.import_id}`);
  });
})();
