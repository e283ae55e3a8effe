// ftplane dashboard: a node's page. The release form posts its reason to POST /v1/nodes/{name}/release (the session
// cookie authenticates it) and reloads the page on success; an error is shown as the API words it.
(function () {
  "use strict";

  async function release(event) {
    event.preventDefault();
    const form = event.target;
    const error = document.getElementById("release-error");
    const button = form.querySelector("button");
    error.hidden = true;
    button.disabled = true;
    try {
      const response = await fetch(`/v1/nodes/${encodeURIComponent(form.dataset.node)}/release`, {
        method: "POST",
        headers: { "Content-Type": "application/json" },
        credentials: "same-origin",
        body: JSON.stringify({ reason: form.reason.value }),
      });
      if (response.ok) {
        window.location.reload();
        return;
      }
      const body = await response.json().catch(() => null);
      error.textContent = (body && body.error && body.error.message) || `release failed (HTTP ${response.status})`;
    } catch (e) {
      error.textContent = `release failed: ${e}`;
    }
    error.hidden = false;
    button.disabled = false;
  }

  document.addEventListener("DOMContentLoaded", () => {
    const form = document.getElementById("release-form");
    if (form) form.addEventListener("submit", release);
  });
})();
