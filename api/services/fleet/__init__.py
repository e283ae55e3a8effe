"""The fleet's goodput: where the GPU-hours of many jobs went, and ETTR objectives over them.

Modules: summary (a job's ledger in the form the fleet reads), store (writing it, and the counters), pick (which
jobs the duty summarizes), window (a query's window from its parameters), query (the aggregation in SQL), report
(the figures of GET /v1/goodput), pricing (GPU-hours in money), objectives and breaches (ETTR objectives, their
evaluation and the one webhook per breach), collector (the Prometheus counters), view (the dashboard's fleet
page). The rules they implement:

One rule, stated once
    A job's figures are its goodput's (api/services/goodput: the accounting's labelled intervals of wall time),
    never computed apart: the summary is the job's ledger cut into segments, so a group of one job equals that
    job's own goodput over the same window.

Summaries
    Per job, recomputed from all its events by the summarize_goodput duty (a job's figures depend on all its
    events: a window ends at a later event): its closed wall time as segments (attempt, bucket, start, end),
    each inside one UTC hour, the hours' sums per bucket, its failures (when each counts, its cause class), and
    for a job still running the open tail: its last stretch, from its start in one bucket to now.
    The duty picks jobs with events stored since their summary (it reads the events' ids past a mark that
    trails by FTPLANE_GOODPUT_SETTLE_S, so an event whose transaction commits late is still seen; the event
    path writes nothing more), jobs never summarized, and running jobs whose summary is older than
    FTPLANE_GOODPUT_REFRESH_S. Until its refresh, a running job's last bucket extends to now; the two cases
    where the accounting would split that tail differently (steps still being recomputed, an open straggler
    episode) are right again at the refresh.

GPUs
    Per job from its spec: nodes x resources.gpus_per_node, or nodes x procs_per_node where no GPUs are asked
    for (a CPU job weighs as many GPU-equivalents as it has ranks). GPU-hours = hours x GPUs.

A window [since, until)
    Clips each job: a job running across since or until counts only its overlap; a running job counts up to
    now. Faults count where their time falls (a failure's detection, else its onset). With a bucket, the
    window is cut at the whole multiples of the bucket since the Unix epoch (UTC midnight for 1d; the first and
    last buckets clipped to the window), each with the same figures. Times are kept as Unix seconds in doubles:
    figures agree with a job's own to a fraction of a microsecond per stretch.

Figures (per group, per bucket)
    wall, productive and lost GPU-hours by cause (the goodput's buckets), ETTR = productive / wall
    GPU-hours, wall hours (not weighted), faults by cause class (api/schemas/causes.py: the class of the failure's
    first signal, stated or implied by its kind: an injected fault's kind, hang for a silence, crash for a rank's
    failure), mean time between faults = wall hours / faults, jobs
    (with any time in it), and with FTPLANE_GPU_HOUR_PRICE the GPU-hours in money (pricing.py).

Objectives
    objectives.py and breaches.py.
"""
