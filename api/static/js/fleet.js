// ftplane fleet page: ETTR over time with the GPU-hours lost stacked by cause per bucket (uPlot), and the nodes
// by state, read from GET /v1/nodes with the page's own session (the panel says so where nodes are not available).
(function () {
  "use strict";
  const COLORS = {
    initialization: "#64748b", queued: "#94a3b8", checkpoint_stall: "#8b5cf6", fault_detection: "#f59e0b",
    restart: "#ef4444", recompute: "#ec4899", straggler: "#ea580c", shutdown: "#06b6d4",
  };

  function drawChart() {
    const el = document.getElementById("fleet-chart");
    const node = document.getElementById("fleet-data");
    if (!el || !node || typeof uPlot === "undefined") return;
    let data;
    try {
      data = JSON.parse(node.dataset.json || "{}");
    } catch (e) {
      return;
    }
    const half = (data.bucket_s || 3600) / 2;
    const xs = data.t.map((t) => t + half); // each bar in the middle of its bucket
    const causes = data.causes || [];
    const stacked = []; // running sums, bottom cause first
    let sum = xs.map(() => 0);
    for (const cause of causes) {
      sum = sum.map((v, i) => v + (data.lost[cause][i] || 0));
      stacked.push(sum);
    }
    const bars = uPlot.paths.bars({ size: [0.7, 80] });
    const series = [{ label: "bucket (UTC)" }];
    const values = [xs];
    for (let k = causes.length - 1; k >= 0; k--) { // the tallest stack first: each lower cause paints over it
      const cause = causes[k];
      series.push({
        label: cause.replace(/_/g, " "),
        scale: "h",
        fill: COLORS[cause] || "#999",
        stroke: COLORS[cause] || "#999",
        paths: bars,
        points: { show: false },
        value: (u, v, si, i) => (i == null ? "" : (data.lost[cause][i] || 0).toFixed(1) + " GPU-h"),
      });
      values.push(stacked[k].map((v) => (v > 0 ? v : null))); // no bar where nothing was lost
    }
    series.push({
      label: "ETTR",
      scale: "ettr",
      stroke: "#111827",
      width: 2,
      spanGaps: true,
      points: { show: true, size: 5 },
      value: (u, v) => (v == null ? "—" : (v * 100).toFixed(1) + " %"),
    });
    values.push(data.ettr);
    el.dataset.buckets = String(xs.length);
    el.dataset.causes = causes.join(",");
    const chart = new uPlot(
      {
        width: Math.max(320, el.clientWidth),
        height: 260,
        scales: { x: { time: true }, ettr: { range: [0, 1] } },
        tzDate: (ts) => uPlot.tzDate(new Date(ts * 1e3), "Etc/UTC"),
        series: series,
        axes: [
          { space: 90 },
          { scale: "h", label: "GPU-hours lost", size: 60 },
          { scale: "ettr", side: 1, label: "ETTR", grid: { show: false }, values: (u, ticks) => ticks.map((t) => Math.round(t * 100) + " %") },
        ],
      },
      values,
      el
    );
    window.addEventListener("resize", () => chart.setSize({ width: Math.max(320, el.clientWidth), height: 260 }));
  }

  function paragraph(text, cls) {
    const p = document.createElement("p");
    p.textContent = text;
    if (cls) p.className = cls;
    return p;
  }

  function drawNodes(panel, nodes) {
    panel.replaceChildren();
    const states = ["healthy", "suspect", "quarantined"];
    const counts = document.createElement("dl");
    counts.className = "facts node-states";
    for (const state of states) {
      const div = document.createElement("div");
      div.dataset.state = state;
      const dt = document.createElement("dt");
      dt.textContent = state;
      const dd = document.createElement("dd");
      dd.textContent = String(nodes.filter((n) => n.state === state).length);
      dd.className = "fleet-count fleet-count-" + state;
      div.append(dt, dd);
      counts.append(div);
    }
    panel.append(counts);
    const troubled = nodes.filter((n) => n.state !== "healthy");
    if (!troubled.length) {
      panel.append(paragraph(nodes.length ? "Every node is healthy." : "No node has run a job yet.", "hint"));
      return;
    }
    const table = document.createElement("table");
    table.className = "fleet-node-list";
    const head = table.createTHead().insertRow();
    for (const title of ["node", "state", "blamed faults", "last fault"]) {
      const th = document.createElement("th");
      th.textContent = title;
      head.append(th);
    }
    const body = table.createTBody();
    for (const n of troubled) {
      const row = body.insertRow();
      row.dataset.node = n.name;
      row.insertCell().textContent = n.name;
      row.insertCell().textContent = n.state + (n.quarantined_until ? " until " + n.quarantined_until.slice(0, 16) : "");
      row.insertCell().textContent = Object.entries(n.faults || {}).map(([k, v]) => k + " " + v).join(", ") || "—";
      row.insertCell().textContent = n.last_fault ? n.last_fault.kind + " " + n.last_fault.ts.slice(0, 16) : "—";
    }
    panel.append(table);
  }

  function loadNodes() {
    const panel = document.getElementById("fleet-nodes");
    if (!panel) return;
    fetch(panel.dataset.src, { credentials: "same-origin", headers: { Accept: "application/json" } })
      .then((r) => {
        if (!r.ok) throw new Error(r.status === 404 ? "not served here" : "answered " + r.status);
        return r.json();
      })
      .then((body) => { panel.dataset.loaded = "nodes"; drawNodes(panel, body.nodes || []); })
      .catch((e) => {
        panel.dataset.loaded = "unavailable";
        panel.replaceChildren(paragraph("Nodes are not available (" + e.message + ").", "hint nodes-unavailable"));
      });
  }

  document.addEventListener("DOMContentLoaded", () => { drawChart(); loadNodes(); });
})();
