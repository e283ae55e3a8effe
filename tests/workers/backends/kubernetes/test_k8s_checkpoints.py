"""Checkpoints on a shared claim (finding 1): every job that used `fsx-checkpoints` wrote `step-*` into the claim's
root, so a new job resumed from, and deleted, another job's checkpoints. Each job's pods now see their own job's
directory of the claim only (`subPath`), and a job that names another in `checkpoint.resume_from` sees that one's,
read-only. The fake's claims hold files, so two jobs sharing one collide here as they would on FSx."""

from __future__ import annotations

import errno

import pytest

from tests.fake_kubernetes import FakeKube
from tests.workers.backends.kubernetes.k8s_support import NS, make_request, make_spec, validate_strict
from workers.backends.kubernetes import KubernetesBackend
from workers.backends.kubernetes import manifests as m

FIRST, SECOND = "0a1b2c3d4e5f60718293a4b5c6d7e8f9", "ffeeddccbbaa99887766554433221100"
STEP = "step-00000100"


def launched(fake: FakeKube, backend: KubernetesBackend, job_id: str, **overrides: object) -> tuple[str, dict]:
    """Launch attempt 0 of a job and place its pods: (its index-0 pod's name, that pod)."""
    spec = make_spec(**overrides)
    backend.launch(make_request(spec, job_id=job_id))
    name = m.attempt_name(job_id, spec.name, 0)
    fake.schedule(name, NS)
    fake.run(name, NS)
    pod = fake.pod(name, NS, 0)
    return pod["metadata"]["name"], pod


def env_of(pod: dict) -> dict[str, str]:
    return {e["name"]: e.get("value", "") for e in pod["spec"]["containers"][0]["env"]}


def test_two_jobs_on_one_claim_never_see_each_others_checkpoints(fake, backend):
    first, pod = launched(fake, backend, FIRST)
    directory = env_of(pod)["FTPLANE_CHECKPOINT_DIR"]
    assert directory == "/checkpoints/llama-8b"  # a command that writes to checkpoint.dir itself is isolated too
    fake.pod_write(NS, first, f"{directory}/{STEP}/.metadata", b"first")
    fake.pod_write(NS, first, f"{directory}/{STEP}/ftplane-complete.json", b"{}")

    second, pod = launched(fake, backend, SECOND)
    assert fake.pod_list(NS, second, env_of(pod)["FTPLANE_CHECKPOINT_DIR"]) == []  # nothing to resume from
    fake.pod_write(NS, second, f"{directory}/{STEP}/.metadata", b"second")
    files = fake.claim_files(NS, "fsx-checkpoints")
    assert files[f"{FIRST}/{STEP}/.metadata"] == b"first" and files[f"{SECOND}/{STEP}/.metadata"] == b"second"


def test_resume_from_mounts_the_other_jobs_checkpoints_read_only(fake, backend):
    first, pod = launched(fake, backend, FIRST)
    fake.pod_write(NS, first, f"{env_of(pod)['FTPLANE_CHECKPOINT_DIR']}/{STEP}/.metadata", b"first")

    second, pod = launched(
        fake, backend, SECOND, checkpoint={**make_spec().checkpoint.model_dump(), "resume_from": FIRST}
    )
    env = env_of(pod)
    assert fake.pod_list(NS, second, env["FTPLANE_CHECKPOINT_RESUME_FROM"]) == [STEP]
    assert fake.pod_list(NS, second, env["FTPLANE_CHECKPOINT_DIR"]) == []
    with pytest.raises(OSError) as refused:
        fake.pod_write(NS, second, f"{env['FTPLANE_CHECKPOINT_RESUME_FROM']}/{STEP}/.metadata", b"overwritten")
    assert refused.value.errno == errno.EROFS
    assert fake.claim_files(NS, "fsx-checkpoints")[f"{FIRST}/{STEP}/.metadata"] == b"first"


def test_the_claim_mounts_validate(fake, backend):
    spec = make_spec(checkpoint={**make_spec().checkpoint.model_dump(), "resume_from": FIRST})
    job = m.job_manifest(make_request(spec, job_id=SECOND))
    validate_strict(job)
    mounts = job["spec"]["template"]["spec"]["containers"][0]["volumeMounts"]
    claimed = [mt for mt in mounts if mt["name"] == m.CHECKPOINT_VOLUME]
    assert [(mt["subPath"], mt.get("readOnly", False)) for mt in claimed] == [(SECOND, False), (FIRST, True)]


def test_resume_from_must_name_a_job_on_the_same_claim(admin):
    from tests.workers.backends.kubernetes.k8s_support import spec_body

    first = admin.post("/v1/jobs", json=spec_body())
    assert first.status_code == 201, first.text
    assert admin.post("/v1/projects", json={"name": "vision"}).status_code == 201
    source = first.json()["id"]
    checkpoint = make_spec().checkpoint.model_dump(exclude_none=True)
    for resume_from, other, project, why in [
        ("0" * 32, {}, "default", "there is no job"),
        (source, {"pvc": "other-claim"}, "default", "kept its checkpoints elsewhere"),
        (source, {}, "vision", f"there is no job {source} in project vision"),  # another project's: not to read
    ]:
        body = spec_body(checkpoint={**checkpoint, **other, "resume_from": resume_from}, project=project)
        refused = admin.post("/v1/jobs", json=body)
        assert refused.status_code == 422, refused.text
        error = refused.json()["error"]
        assert error["fields"][0]["field"] == "checkpoint.resume_from" and why in error["message"]
    accepted = admin.post("/v1/jobs", json=spec_body(checkpoint={**checkpoint, "resume_from": source}))
    assert accepted.status_code == 201, accepted.text
    bad = admin.post("/v1/jobs", json={**spec_body(), "checkpoint": {"engine": "none", "resume_from": source}})
    assert bad.status_code == 422 and "checkpoint.resume_from needs checkpoint.dir" in bad.text
