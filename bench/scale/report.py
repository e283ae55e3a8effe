"""The figures of a scale run as text tables (markdown), with the goals next to the figures they judge."""

from __future__ import annotations

import math
import statistics
from typing import Any

from bench.common import table

GOAL_DELIVERED = 0.999
GOAL_P99_MS = 100.0
GOAL_API_CORES = 1.0


def mark(ok: bool) -> str:
    return "met" if ok else "**not met**"


def pair(a: float, b: float) -> str:
    return "-" if math.isnan(b) else f"{a:.0f} / {b:.0f}"


def baseline_table(b: dict[str, Any]) -> str:
    """The back-to-back baseline and, where measured, the one paced at the run's report rate."""
    header = ["GET /healthz", "req/s", "p50 ms", "p99 ms", "API cores", "API µs/request", "other cores"]
    paced = [("at the report rate", "paced"), ("at the report rate, a connection per node", "per_node")]
    rows = [("back to back", b), *((name, b[key]) for name, key in paced if key in b)]
    return table(
        header,
        [
            [
                name,
                r["requests_per_s"],
                r["p50_ms"],
                r["p99_ms"],
                r["api_cores"],
                r["api_us_per_request"],
                r["other_cores"],
            ]
            for name, r in rows
        ],
    )


def ingest_table(rows: list[tuple[str, dict[str, Any]]]) -> str:
    header = [
        "",
        "offered of schedule",
        "node beats offered",
        "delivered",
        "superseded",
        "reports/s",
        "rank-beats/s",
        "retried",
        "refused",
        "p50 ms",
        "p99 ms",
        "with events p50/p99 ms",
        "beat age p99 ms",
        "API µs/report",
        "× healthz (back to back / at the rate / a connection per node)",
    ]
    out = []
    for name, i in rows:
        ratio = i.get("api_cost_vs_healthz")
        ratios = (ratio, i.get("api_cost_vs_paced_healthz"), i.get("api_cost_vs_per_node_healthz"))
        out.append(
            [
                name,
                f"{i['offered_of_scheduled'] * 100:.1f} %",
                i["node_beats_offered"],
                f"{i['delivered_fraction'] * 100:.2f} %",
                i["node_beats_superseded"],
                i["reports_per_s"],
                i["rank_beats_per_s"],
                i["retried"],
                i["refused"],
                i["p50_ms"],
                i["p99_ms"],
                f"{i['events_p50_ms']:.0f} / {i['events_p99_ms']:.0f}"
                if i["events_p99_ms"] == i["events_p99_ms"]
                else "-",
                i["beat_age_p99_ms"],
                i["api_us_per_report"] if ratio else "-",
                " / ".join(f"{r:.1f}×" for r in ratios if r) or "-",
            ]
        )
    return table(header, out)


def cpu_table(cpu: dict[str, float]) -> str:
    names = ["api", "worker", "beat", "postgres", "pods", "simulator", "other", "machine"]
    header = ["API", "Celery worker", "beat", "PostgreSQL", "launched job(s)", "simulator", "other", "machine"]
    return table(header, [[cpu.get(n, float("nan")) for n in names]])


def simulator_line(i: dict[str, Any], loop: dict[str, float], processes: int) -> str:
    where = "one process" if processes <= 1 else f"the story's process and {processes} with the nodes"
    return (
        f"simulator ({where}): {i['simulator_cores']:.2f} cores, {i['simulator_us_per_post']:,.0f} µs of its CPU "
        "per POST; "
        f"offered {i['offered_of_scheduled'] * 100:.1f} % of the schedule (its interval timers fired late by "
        f"{i['timer_lag_p99_ms']:.0f} ms at p99); its event loop ran late by {loop['p99_ms']:.0f} ms at p99, "
        f"{loop['max_ms']:.0f} ms at worst, more than 2 s behind for {loop['over_2s_s']:.1f} s (the agents' 2 s "
        "connect and 5 s read timeouts run on their loop; the worst of its loops)"
    )


def duties_table(d: dict[str, Any]) -> str:
    rows = [[duty, v["runs"], v["median_s"], v["p99_s"], v["max_s"]] for duty, v in d["duties"].items()]
    text = table(["duty", "runs", "median s", "p99 s", "max s"], rows)
    return (
        f"{text}\n\nwhole pass (every duty of one beat period, one after another on the solo worker): median "
        f"{d['pass_p50_s']:.3f} s, p99 {d['pass_p99_s']:.3f} s, max {d['pass_max_s']:.3f} s against a period of "
        f"{d['period_s']:g} s; {d['passes_over_period']} of {d['passes']} passes longer than the period"
    )


def goals(ingest: dict[str, Any], cpu: dict[str, float], lost: int) -> list[str]:
    return [
        f"- node beats delivered {ingest['delivered_fraction'] * 100:.2f} % of offered (goal ≥ 99.9 %; "
        f"{ingest['node_beats_superseded']:,} superseded, {ingest['node_beats_unsettled']:,} never delivered; "
        f"{ingest.get('node_beats_delivered_by_shed', 0):,} delivered by a 503 that said the liveness was taken): "
        f"{mark(ingest['delivered_fraction'] >= GOAL_DELIVERED)}",
        f"- report p99 {ingest['all_p99_ms']:.0f} ms over every report, {ingest['p99_ms']:.0f} ms over those without "
        f"events (goal < 100 ms): {mark(ingest['all_p99_ms'] < GOAL_P99_MS)}",
        f"- API {cpu.get('api', float('nan')):.2f} cores (goal ≤ 1): {mark(cpu.get('api', 9) <= GOAL_API_CORES)}",
        f"- PostgreSQL {cpu.get('postgres', float('nan')):.2f} cores (reported)",
        f"- events lost {lost} (goal 0): {mark(lost == 0)}",
    ]


TIMELINE_CORES = ("api", "postgres", "simulator", "worker")


def timeline_table(steps: list[dict[str, Any]]) -> str:
    """The agents' POSTs by step of the timeline (from the launch), where any carried events or failed, and the
    cores the parts used in the step."""
    plain = {"at_s", "accepted", "cores"}
    kinds = sorted(
        {k for step in steps for k in step if k not in {"at_s", "cores"}}, key=lambda k: (k != "accepted", k)
    )
    rows = [
        [
            step["at_s"],
            *(step.get(k, 0) for k in kinds),
            *(step.get("cores", {}).get(c, math.nan) for c in TIMELINE_CORES),
        ]
        for step in steps
        if set(step) - plain
    ]
    return table(["s from the launch", *kinds, *(f"{c} cores" for c in TIMELINE_CORES)], rows)


def one_job_report(f: dict[str, Any]) -> str:
    lines = [f"job {f['job']['status']}, {f['job']['attempts']} attempt(s)", ""]
    lines += ["baseline (same API, before the job):", baseline_table(f["baseline"]), ""]
    lines += ["ingest (the measured window: first agent start to the end of training):"]
    lines += [ingest_table([("job", f["ingest"])]), ""]
    lines += [simulator_line(f["ingest"], f["loop"], f["params"].get("simulator_processes", 1)), ""]
    lines += [f"CPU over the window (cores; the machine has {f.get('cores', '?')}):", cpu_table(f["cpu"]), ""]
    lines += ["supervision duties (the worker's log):", duties_table(f["duties"]), ""]
    det = f["detection"]
    if det["silent_nodes"]:
        d = [r["detected_s"] for r in det["silent_nodes"]]
        e = [r["escalated_s"] for r in det["silent_nodes"] if r["escalated_s"] is not None]
        lines.append(
            f"silent nodes: {len(d)}; injected -> hang_detected first seen: median {statistics.median(d):.2f} s, "
            f"max {max(d):.2f} s (timeout {det['timeout_s']:g} s, interval {det['interval_s']:g} s); injected -> "
            f"job restart seen: median {statistics.median(e) if e else float('nan'):.2f} s"
        )
        for r in det["silent_nodes"]:
            lines.append(
                f"  seen {r['detected_s']:.2f} s (ftplane's hang_detected ts {r['ftplane_hang_ts_s']:.2f} s), "
                f"escalation seen {r['escalated_s']:.2f} s, new pod {r['pod_started_s']:.2f} s, resumed "
                f"{r['resumed_s']:.2f} s"
            )
    else:
        lines.append("silent nodes: none in this run (try another --seed or a longer --sim-hours)")
    ev = f["events"]
    lines.append(
        f"events: {ev['sent']:,} handed to agents, {ev['missing']} missing, {ev['timestamp_changed']} with another "
        f"ts, {ev['refused']} refused -> lost {ev['lost']}; {ev['died_with_a_frozen_node']} died with a frozen node; "
        f"{ev['stored_for_job']:,} stored for the job; hang_detected {ev['hang_detected']:,} "
        f"({ev['false_hang_detected']} outside a simulated silence); listing took {ev['listing_s']:.1f} s"
    )
    if ev.get("missing_by_kind"):
        lines.append("  missing by kind: " + ", ".join(f"{k} {n:,}" for k, n in ev["missing_by_kind"].items()))
    if f.get("timeline"):
        lines += ["", "the agents' POSTs by 10 s from the launch, where any carried events or failed:"]
        lines.append(timeline_table(f["timeline"]))
    g = f["goodput"]
    if g is None:
        lines += ["", f"the story stopped early ({f['aborted']}): no goodput comparison", "", "goals:"]
        return "\n".join([*lines, *goals(f["ingest"], f["cpu"], ev["lost"])])
    lines += [
        "",
        f"goodput: ftplane ETTR {g['ettr']:.4f} vs truth {g['truth_ettr']:.4f} ({g['ettr'] - g['truth_ettr']:+.4f}); "
        f"wall {g['wall_s']:.2f} s vs {g['truth_wall_s']:.2f} s; GET /goodput {g['api_ms']:.0f} ms",
        table(
            ["bucket", "ftplane s", "truth s", "difference s"],
            [[b, v["ftplane"], v["truth"], v["ftplane"] - v["truth"]] for b, v in g["buckets"].items()],
        ),
        "",
        "goals:",
        *goals(f["ingest"], f["cpu"], ev["lost"]),
    ]
    return "\n".join(lines)


def jobs_report(f: dict[str, Any]) -> str:
    p = f["params"]
    up = f["startup"]
    lines = [f"{len(f['jobs'])} jobs at once, {f['ingest']['window_s']:.0f} s measured", ""]
    sent = "and their `running` events sent" if p["start_events"] else "(no `running` events: --no-start-events)"
    lines += [
        f"start-up: every job's agents started {sent}; "
        + (
            f"all stored {up['seconds']:.0f} s after the first start"
            if up["all_stored"]
            else f"{up['events_pending']:,} still not stored {up['seconds']:.0f} s after the first start"
        )
        + f"; meanwhile the simulator's loop ran up to {up['loop']['max_ms']:.0f} ms late",
        "",
    ]
    lines += ["baseline (same API, before the jobs):", baseline_table(f["baseline"]), ""]
    rows = [(f"job {j['job']}", j["ingest"]) for j in f["jobs"]] + [("all", f["ingest"])]
    lines += ["ingest per job and in all (API µs/report: the API's CPU over all the jobs' reports):"]
    lines += [ingest_table(rows), ""]
    lines.append(simulator_line(f["ingest"], f["loop"], f["params"].get("simulator_processes", 1)))
    lines += [f"CPU over the window (cores; the machine has {f.get('cores', '?')}):", cpu_table(f["cpu"]), ""]
    lines += ["supervision duties (the worker's log):", duties_table(f["duties"]), ""]
    det = [
        [
            j["job"],
            j["cut_s"],
            j["detected_s"] if j["detected_s"] is not None else "-",
            j["ftplane_hang_ts_s"] if j["ftplane_hang_ts_s"] is not None else "-",
            j["attempts"],
            j["status"],
            j["events"]["lost"],
            j["error"] or "",
        ]
        for j in f["jobs"]
    ]
    header = ["job", "cut at s", "cut -> hang_detected seen s", "ftplane's hang ts s", "attempts", "end", "lost", ""]
    lines += [
        f"one node of each job cut off for {p['heartbeat_timeout_s'] + 4:g} s (timeout {p['heartbeat_timeout_s']:g} s):"
    ]
    lines += [table(header, det), "", "goals:", *goals(f["ingest"], f["cpu"], f["events"]["lost"])]
    return "\n".join(lines)
