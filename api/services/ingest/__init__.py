"""Node-report ingest: what nodes, trainers and the control plane's own duties report, stored.

A node agent's report (`POST /v1/jobs/{id}/reports`) that waited too long for the API's turn is refused
unread (`lateness`, a middleware before the route). Otherwise it goes, after the route has authenticated and
parsed it, to one entry point, `node_report.ingest`, which decides how it is stored:

- fast: nothing to store in a transaction (no events, nothing new about the job): only its liveness,
  into `liveness_writer` (soft state, written within `FTPLANE_LIVENESS_FLUSH_S`);
- grouped: with other reports in one transaction (`group_commit`), before the reply;
- alone: in a transaction of its own, the fallback of a report a group could not take;
- shed: past this process's bounds (`admission`), 503 with Retry-After, its liveness taken.

Modules:

  node_report      the entry point (fast, grouped, alone or shed)
  rules            the rules a report is judged by: changes its job, its liveness counts, ended job
  group_commit     reports stored many to a transaction, and a report stored alone
  lateness         the report that waited past FTPLANE_REPORT_MAX_WAIT_S, refused unread (503, Retry-After)
  admission        how many reports one process stores at once, and the Retry-After of those shed
  caches           the token's principal and the job's state, kept briefly in memory
  liveness_writer  node and rank liveness, coalesced and written about every 100 ms
  reporting        events (`POST /events`, the duties' own) and heartbeats (`POST /heartbeats`) stored,
                   the faults handed over in replies
"""
