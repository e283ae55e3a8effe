"""`GET /v1/jobs/{id}/goodput`: where the job's wall time went, per attempt and in total, and advice."""

from __future__ import annotations

from fastapi import APIRouter

from api.core.errors import responses
from api.deps import JobViewerDep, SessionDep
from api.routes.jobs import load_job
from api.schemas.goodput import GoodputOut
from api.services import goodput

router = APIRouter(prefix="/v1/jobs/{job_id}", tags=["goodput"])


@router.get("/goodput", response_model=GoodputOut, responses=responses(404))
def get_goodput(job_id: str, session: SessionDep, _: JobViewerDep) -> GoodputOut:
    """Wall time split into productive time and time lost (initialization, checkpoint stalls, fault
    detection, restarts, recomputed steps, shutdown), ETTR, and the Young/Daly checkpoint interval.
    The accounting rules are in `api/services/goodput/__init__.py`. A job not launched yet has zero wall time."""
    job = load_job(session, job_id)
    return goodput.job_goodput(session, job) or goodput.empty(job)
