"""The scale benchmark (`python -m bench.scale`): simulated 2,048-node jobs whose every node reports through the
product's own agent reporting code, against a real control plane. Modules:

  params        what is simulated: the job's shape, interval, timeouts, compression, fault model
  controlplane  `ftplane serve` (API, worker, beat) on a fresh PostgreSQL database with Redis; CPU groups, the
                GET /healthz baseline, the supervision duties' times from the worker's log
  fleet         the simulated nodes: one AsyncUplink (trainer/agent/uplink.py) per node, and what they offered
                and what was accepted
  wire          each node's own connection (a partition can cut it), and the HTTP/1.1 transport under httpx
  simulator     the training story of one job: steps, checkpoints, faults, recoveries
  truth         the ground truth, from the simulator's own clock and its observations of the API
  one_job       one job with faults, and the checks after it
  jobs          several jobs at once
  report        the tables
"""
