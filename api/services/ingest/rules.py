"""The rules a node report is judged by, stated once for the entry point (on its cached view of the job) and
for the group commit (on the job's locked row)."""

from __future__ import annotations

from api.core.errors import ApiError
from api.schemas.reports import NodeReport
from api.services import lifecycle


def total_steps(report: NodeReport) -> int | None:
    """The job's total steps as the report's ranks know it, if they say."""
    return max((b.total_steps for b in report.heartbeats if b.total_steps), default=None)


def has_new_total(report: NodeReport, job_total_steps: int | None) -> bool:
    """Whether the report says a total of steps the job does not have."""
    total = total_steps(report)
    return total is not None and total != job_total_steps


def changes_job(status: str, job_total_steps: int | None, report: NodeReport) -> bool:
    """Whether storing the report may change its job's row, as the job stands (`status`, `job_total_steps`): what
    its events mean (lifecycle.changes_job) or a new total of steps. Such a report is stored under the exclusive
    lock on the row; the others may be stored side by side under a shared one."""
    return has_new_total(report, job_total_steps) or lifecycle.changes_job(status, (e.type for e in report.events))


def takes_liveness(report: NodeReport, attempt: int) -> bool:
    """Whether a report's liveness counts: not when it is of an attempt older than the job's `attempt`."""
    return report.attempt >= attempt


def refusal_if_ended(status: str, report: NodeReport) -> ApiError | None:
    """The 409 for a report without events to a job that ended (late events are still stored), else None."""
    if report.events or status not in lifecycle.TERMINAL:
        return None
    return ApiError(409, f"job is {status}; it takes no more reports", field="job_id")
