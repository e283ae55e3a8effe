// ftplane dashboard: draws the progress chart (uPlot) and keeps it current as htmx swaps in new data.
(function () {
  "use strict";
  let chart = null;
  let restarts = [];
  let lastJson = null;

  function readData() {
    const node = document.getElementById("progress-data");
    if (!node) return null;
    const text = node.dataset.json || "";
    if (text === lastJson) return undefined; // unchanged
    lastJson = text;
    try {
      return JSON.parse(text);
    } catch (e) {
      return null;
    }
  }

  // x: every time with a step or a restart; y: the step there, or null.
  function series(data) {
    const byTime = new Map();
    data.t.forEach((t, i) => byTime.set(t, data.step[i]));
    data.restarts.forEach((r) => { if (!byTime.has(r.t)) byTime.set(r.t, null); });
    if (!byTime.has(data.start)) byTime.set(data.start, null);
    const xs = Array.from(byTime.keys()).sort((a, b) => a - b);
    return [xs, xs.map((t) => byTime.get(t))];
  }

  function drawRestarts(u) {
    const ctx = u.ctx;
    ctx.save();
    ctx.strokeStyle = "#c81e1e";
    ctx.lineWidth = 2 * devicePixelRatio;
    ctx.setLineDash([6 * devicePixelRatio, 4 * devicePixelRatio]);
    for (const r of restarts) {
      const x = Math.round(u.valToPos(r.t, "x", true));
      ctx.beginPath();
      ctx.moveTo(x, u.bbox.top);
      ctx.lineTo(x, u.bbox.top + u.bbox.height);
      ctx.stroke();
    }
    ctx.restore();
  }

  function render() {
    const el = document.getElementById("progress-chart");
    if (!el || typeof uPlot === "undefined") return;
    const data = readData();
    if (data === undefined || data === null) return;
    restarts = data.restarts || [];
    const aligned = series(data);
    el.dataset.points = String(data.t.length);
    el.dataset.restarts = String(restarts.length);
    if (chart) {
      chart.setData(aligned);
      return;
    }
    chart = new uPlot(
      {
        width: Math.max(300, el.clientWidth),
        height: 220,
        scales: { x: { time: true } },
        tzDate: (ts) => uPlot.tzDate(new Date(ts * 1e3), "Etc/UTC"), // UTC, like the rest of the page
        legend: { show: true },
        series: [
          { label: "time (UTC)" },
          { label: "step", stroke: "#2563eb", width: 1.5, spanGaps: true, points: { show: true, size: 5 } },
        ],
        axes: [{ space: 90 }, { label: "step", size: 60 }],
        hooks: { draw: [drawRestarts] },
      },
      aligned,
      el
    );
    window.addEventListener("resize", () => chart && chart.setSize({ width: Math.max(300, el.clientWidth), height: 220 }));
  }

  document.addEventListener("DOMContentLoaded", render);
  document.addEventListener("htmx:afterSettle", render);
})();
