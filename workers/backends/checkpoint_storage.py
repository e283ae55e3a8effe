"""Where a job's checkpoints are: each job a directory of its own on the checkpoint storage, named for the job
(attempts of one job share it); another job's only when the spec names it in `checkpoint.resume_from`, and then
only to read.

On the storage (the claim `checkpoint.pvc` on Kubernetes; `checkpoint.dir` on this host for the local backend)
a job's checkpoints are in `<job id>/`:
- kubernetes with a claim: the claim's `<job id>` directory is mounted (`subPath`) at `checkpoint.dir`, so a pod
  sees its own job's checkpoints and nothing else of the claim (a command that writes to `checkpoint.dir` itself
  writes there too); the `<resume_from>` directory is mounted read-only at RESUME_MOUNT;
- the local backend (and kubernetes without a claim): `<checkpoint.dir>/<job id>`, and `<checkpoint.dir>/
  <resume_from>` to resume from.

The trainer learns them as FTPLANE_CHECKPOINT_DIR and FTPLANE_CHECKPOINT_RESUME_FROM (ftplane/contract.py).
"""

from __future__ import annotations

import hashlib
import posixpath
import re
from dataclasses import dataclass
from typing import Any

from api.schemas.spec import JobSpec

RESUME_MOUNT = "/var/lib/ftplane/resume-from"
_SAFE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$")


@dataclass(frozen=True)
class CheckpointPaths:
    """The directories the trainer is given (None: not given)."""

    directory: str | None  # the job's own
    resume_from: str | None = None  # another job's, read-only


def storage_name(job_id: str) -> str:
    """A job's directory name on the storage: its id (ids are 32 hex digits), hashed if it is not a safe name."""
    return job_id if _SAFE.match(job_id) else hashlib.sha256(job_id.encode()).hexdigest()[:32]


def on_shared_directory(spec: JobSpec, job_id: str) -> CheckpointPaths:
    """The paths where `checkpoint.dir` is the storage itself, as on the local backend."""
    root = spec.checkpoint.dir
    if not root:
        return CheckpointPaths(None)
    source = spec.checkpoint.resume_from
    return CheckpointPaths(
        posixpath.join(root, storage_name(job_id)),
        posixpath.join(root, storage_name(source)) if source else None,
    )


def on_claim(spec: JobSpec) -> CheckpointPaths:
    """The paths in a pod whose claim is mounted as `claim_mounts` says."""
    return CheckpointPaths(spec.checkpoint.dir, RESUME_MOUNT if spec.checkpoint.resume_from else None)


def claim_mounts(spec: JobSpec, job_id: str, volume: str) -> list[dict[str, Any]]:
    """The trainer container's mounts of the checkpoint claim: its own job's directory, read-write, and the
    directory of the job it resumes from, read-only."""
    assert spec.checkpoint.dir
    mounts: list[dict[str, Any]] = [{"name": volume, "mountPath": spec.checkpoint.dir, "subPath": storage_name(job_id)}]
    source = spec.checkpoint.resume_from
    if source:
        mounts.append({"name": volume, "mountPath": RESUME_MOUNT, "subPath": storage_name(source), "readOnly": True})
    return mounts
