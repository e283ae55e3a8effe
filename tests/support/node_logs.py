"""A node of a local attempt as the local backend lays it out, and its agent's kept lines, written as the node
agent writes them (its own RankLogs): for reading logs without running a job."""

from __future__ import annotations

import json
from pathlib import Path

from ftplane import contract
from ftplane.trainer.agent.rank_logs import RankLogs
from ftplane.trainer.agent.redaction import Redactor


def node_logs(
    job_id: str, attempt: int = 0, index: int = 0, max_bytes: int = contract.LOG_MAX_BYTES
) -> tuple[RankLogs, Path]:
    """(the node's kept lines, its directory) under the configured runs directory; named host-n<index>."""
    from api.core.config import get_settings

    node = get_settings().resolved_runs_dir / job_id / f"a{attempt}" / f"n{index}"
    (node / "agent").mkdir(parents=True)
    (node / "launch.json").write_text(json.dumps({"pid": 1, "node": f"host-n{index}"}))
    return RankLogs(node / "agent" / contract.LOG_DIR, Redactor(), max_bytes), node
