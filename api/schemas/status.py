"""The statuses of jobs and attempts. Only `api.services.lifecycle` moves anything between them."""

from __future__ import annotations

from enum import StrEnum


class JobStatus(StrEnum):
    PENDING = "PENDING"
    SUBMITTED = "SUBMITTED"
    RUNNING = "RUNNING"
    RECOVERING = "RECOVERING"
    SUCCEEDED = "SUCCEEDED"
    FAILED = "FAILED"
    CANCELLED = "CANCELLED"


class AttemptStatus(StrEnum):
    PENDING = "PENDING"  # created (with the job, or by a job restart), not launched yet
    LAUNCHED = "LAUNCHED"  # the backend accepted it; not seen running yet (pods scheduling)
    RUNNING = "RUNNING"
    SUCCEEDED = "SUCCEEDED"
    FAILED = "FAILED"
    CANCELLED = "CANCELLED"
