"""What a scale run simulates: the job's shape, its report interval and timeouts, the clock compression, the fault
model and the simulated costs. One dataclass, read by every module of the package."""

from __future__ import annotations

from dataclasses import dataclass

from api.schemas.spec import TIMEOUT_INTERVALS, default_report_interval

# Published: jobs of 1,024 GPUs see a mean time to failure of 7.9 h (Meta's research clusters, "Revisiting
# Reliability in Large-Scale Machine Learning Research Clusters", arXiv 2410.21680). Failures of independent parts
# add up, so MTTF scales as 1 / GPUs: 7.9 h x 1024 / 16384 = 29.6 min.
MTTF_1024_GPUS_H = 7.9
BUCKETS = ("productive", "initialization", "checkpoint_stall", "fault_detection", "restart", "recompute", "shutdown")


@dataclass
class Params:
    nodes: int = 2048
    gpus_per_node: int = 8
    jobs: int = 1  # the several-jobs scenario runs this many jobs at once (bench/scale/jobs.py)
    report_interval_s: float = 0.0  # real; 0: the product's default for `nodes` (api/schemas/spec.py)
    heartbeat_timeout_s: float = 0.0  # real; 0: the spec's floor, TIMEOUT_INTERVALS report intervals
    supervise_interval_s: float = 2.0  # real, the product's default
    api_workers: int = 2
    compression: float = 60.0  # simulated seconds per real second
    sim_hours: float = 3.0
    mttf_1024_h: float = MTTF_1024_GPUS_H
    step_sim_s: float = 6.0
    checkpoint_interval_steps: int = 100
    checkpoint_blocking_sim_s: float = 6.0
    checkpoint_total_sim_s: float = 60.0
    checkpoint_load_sim_s: float = 30.0
    init_sim_s: float = 300.0  # first start at scale: pods, NCCL init, model build
    inprocess_sim_s: float = 30.0  # NVRx in-process restart
    injob_sim_s: float = 120.0  # ft_launcher in-job restart: teardown, restart, rendezvous
    job_restart_startup_sim_s: float = 300.0  # after ftplane's job_restart: new pods scheduled, started
    mix: tuple[tuple[str, float], ...] = (("crash", 0.60), ("silent_node", 0.25), ("transient", 0.15))
    seed: int = 2026
    transport: str = "http11"  # the nodes' HTTP transport under httpx (wire.py): http11 or httpx
    poll_s: float = 0.25  # how often the simulator looks at the API while it waits for something
    duration_s: float = 90.0  # the several-jobs scenario: measured seconds after its warm-up
    start_events: bool = True  # the several-jobs scenario: every rank's `running` at each job's start
    simulator_processes: int = 1  # more than 1: each job's nodes dealt over that many processes (shards.py)
    # The control plane's processes run at this niceness (PostgreSQL and the simulator at the machine's default): real
    # agents run on their own hosts, so on a machine they share, the simulated ones come first (controlplane.py).
    control_plane_nice: int = 10

    def __post_init__(self) -> None:
        if not self.report_interval_s:
            self.report_interval_s = default_report_interval(self.nodes)
        if not self.heartbeat_timeout_s:
            self.heartbeat_timeout_s = TIMEOUT_INTERVALS * self.report_interval_s

    @property
    def ranks(self) -> int:
        return self.nodes * self.gpus_per_node

    @property
    def mttf_sim_s(self) -> float:
        return self.mttf_1024_h * 3600 * 1024 / self.ranks

    def real(self, sim_s: float) -> float:
        return sim_s / self.compression

    def node_of(self, rank: int) -> int:
        return rank // self.gpus_per_node

    def node_name(self, index: int) -> str:
        return f"node-{index:04d}"
