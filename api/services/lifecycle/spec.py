"""The job's spec as the lifecycle and the duties read it: validated once per loaded row."""

from __future__ import annotations

from api.database.tables import Job
from api.schemas.spec import JobSpec

_SPEC = "_ftplane_spec"


def spec_of(job: Job) -> JobSpec:
    """The job's spec, validated once per loaded row (a job's spec never changes after it is accepted)."""
    cached = job.__dict__.get(_SPEC)
    if cached is None:
        cached = JobSpec.model_validate(job.spec)
        job.__dict__[_SPEC] = cached
    return cached
