"""Where a job's checkpoints are on the local backend: `<checkpoint.dir>/<job id>`, its own, and the job it resumes
from beside it (finding 1: jobs given one checkpoint.dir shared, and deleted, each other's checkpoints)."""

from __future__ import annotations

from api.schemas.spec import JobSpec
from workers.backends.base import LaunchRequest, trainer_environment
from workers.backends.checkpoint_storage import storage_name


def request(job_id: str, **checkpoint: object) -> LaunchRequest:
    spec = JobSpec.model_validate(
        {
            "name": "tiny",
            "command": ["python", "-m", "ftplane.trainer"],
            "checkpoint": {"dir": "/data/ckpt", **checkpoint},
        }
    )
    return LaunchRequest(job_id=job_id, attempt=1, spec=spec, token="t", control_plane_url="http://cp")


def test_each_local_job_gets_its_own_directory_and_reads_the_one_it_resumes_from() -> None:
    first = trainer_environment(request("a" * 32))
    second = trainer_environment(request("b" * 32, resume_from="a" * 32))
    assert first["FTPLANE_CHECKPOINT_DIR"] == f"/data/ckpt/{'a' * 32}"
    assert "FTPLANE_CHECKPOINT_RESUME_FROM" not in first
    assert second["FTPLANE_CHECKPOINT_DIR"] == f"/data/ckpt/{'b' * 32}"
    assert second["FTPLANE_CHECKPOINT_RESUME_FROM"] == first["FTPLANE_CHECKPOINT_DIR"]


def test_an_unusual_job_id_is_hashed_into_one_safe_name() -> None:
    assert (
        storage_name("../../etc") != "../../etc" and "/" not in storage_name("a/b") and len(storage_name("x/y")) == 32
    )
    assert storage_name("3f2a9c1e5b7d4a2f8c3e5d7b9a1c2e4f") == "3f2a9c1e5b7d4a2f8c3e5d7b9a1c2e4f"
