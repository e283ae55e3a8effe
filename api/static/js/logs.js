// ftplane dashboard: the logs panel of a job's page. Reads GET /v1/jobs/{id}/logs as NDJSON (the session cookie
// authenticates it) and, while the job runs, keeps the stream open (follow) and appends each line as it comes.
// A failure's link on the page opens ?rank=R&attempt=A&around=TIME#logs: that rank's lines from 30 s before it.
(function () {
  "use strict";
  const BEFORE_MS = 30000;
  let controller = null;

  function panel() {
    return document.getElementById("logs");
  }

  function show(out, line, around) {
    const row = document.createElement("div");
    row.className = "log-line";
    row.dataset.rank = String(line.rank);
    const at = Date.parse(line.ts);
    if (around !== null && at >= around - 5000 && at <= around + 1000) row.classList.add("near-failure");
    row.textContent = `${line.ts.slice(11, 23)} [rank${line.rank}] ${line.line}`;
    out.appendChild(row);
  }

  async function load(around) {
    const root = panel();
    const form = document.getElementById("log-controls");
    const out = document.getElementById("log-lines");
    const notice = document.getElementById("log-notice");
    if (controller) controller.abort();
    controller = new AbortController();
    out.textContent = "";
    notice.hidden = true;
    const query = new URLSearchParams({ attempt: form.attempt.value });
    if (form.rank.value !== "") query.set("rank", form.rank.value);
    const current = form.attempt.value === root.dataset.attempt && root.dataset.running === "true";
    if (around !== null) {
      query.set("since", new Date(around - BEFORE_MS).toISOString());
      query.set("limit", "500");
    } else {
      query.set("tail", "500");
      if (form.follow.checked && current) query.set("follow", "true");
    }
    out.dataset.state = "loading";
    let response;
    try {
      response = await fetch(`/v1/jobs/${root.dataset.job}/logs?${query}`, {
        headers: { Accept: "application/x-ndjson" },
        credentials: "same-origin",
        signal: controller.signal,
      });
    } catch (e) {
      return; // aborted by a newer load
    }
    if (!response.ok) {
      const body = await response.json().catch(() => ({}));
      notice.textContent = (body.error && body.error.message) || `the logs could not be read (HTTP ${response.status})`;
      notice.hidden = false;
      out.dataset.state = "error";
      return;
    }
    const said = [response.headers.get("Ftplane-Logs-Notice"), response.headers.get("Link")].filter(Boolean);
    if (said.length) {
      notice.textContent = said.join(" ");
      notice.hidden = false;
    }
    out.dataset.state = query.get("follow") ? "following" : "reading";
    const reader = response.body.getReader();
    const decoder = new TextDecoder();
    let pending = "";
    for (;;) {
      let chunk;
      try {
        chunk = await reader.read();
      } catch (e) {
        return; // aborted
      }
      if (chunk.done) break;
      pending += decoder.decode(chunk.value, { stream: true });
      const lines = pending.split("\n");
      pending = lines.pop();
      const atBottom = out.scrollTop + out.clientHeight >= out.scrollHeight - 4;
      for (const text of lines) {
        if (text) show(out, JSON.parse(text), around); // a blank line is a keep-alive
      }
      if (atBottom) out.scrollTop = out.scrollHeight;
    }
    out.dataset.state = "done";
  }

  function start() {
    const root = panel();
    if (!root) return;
    const form = document.getElementById("log-controls");
    const asked = new URLSearchParams(window.location.search);
    if (asked.get("attempt") !== null) form.attempt.value = asked.get("attempt");
    if (asked.get("rank") !== null) form.rank.value = asked.get("rank");
    const around = asked.get("around") ? Date.parse(asked.get("around")) : null;
    form.addEventListener("submit", (event) => {
      event.preventDefault();
      load(null);
    });
    load(Number.isNaN(around) ? null : around);
    if (window.location.hash === "#logs") root.scrollIntoView();
  }

  document.addEventListener("DOMContentLoaded", start);
})();
