"""The spec's `secret_env` on the local backend: each entry's value is the host variable its `key` names, given to
the node agent (which redacts it from every line) and through it to the ranks, never rendered or stored."""

from __future__ import annotations

from pathlib import Path

import pytest

from api.schemas.spec import JobSpec
from ftplane.trainer.agent.processes import descendants, environ_of
from tests.support.waiting import wait_for
from tests.workers.backends.test_local_backend import launch, spec
from workers.backends.base import LaunchRequest
from workers.backends.local import LocalBackend, secret_values

VALUE = "hf_secret_value_of_the_host"


def with_secrets(**overrides: object) -> JobSpec:
    secrets = {"HF_TOKEN": {"secret": "huggingface", "key": "HOST_HF_TOKEN"}}
    return spec(secret_env=secrets, **overrides)


def test_a_local_spec_takes_secret_env_and_its_values_come_from_the_host() -> None:
    job_spec = with_secrets()
    assert secret_values(job_spec, {"HOST_HF_TOKEN": VALUE, "HF_TOKEN": "not this"}) == {"HF_TOKEN": VALUE}
    with pytest.raises(ValueError, match=r"secret_env\.HF_TOKEN: .* host variable HOST_HF_TOKEN, which is not set"):
        secret_values(job_spec, {})
    optional = spec(secret_env={"HF_TOKEN": {"secret": "huggingface", "key": "HOST_HF_TOKEN", "optional": True}})
    assert secret_values(optional, {}) == {}


def test_render_names_the_host_variable_never_its_value(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOST_HF_TOKEN", VALUE)
    request = LaunchRequest(job_id="job1", attempt=0, spec=with_secrets(), token="t", control_plane_url="http://cp")
    rendered = LocalBackend(runs_dir=tmp_path / "runs").render(request)
    assert 'export HF_TOKEN="${HOST_HF_TOKEN}"' in rendered and "export FTPLANE_SECRET_ENV=HF_TOKEN" in rendered
    assert VALUE not in rendered


def test_the_agent_and_the_ranks_get_the_value_and_a_missing_one_fails_the_launch(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    backend = LocalBackend(runs_dir=tmp_path / "runs")
    with pytest.raises(ValueError, match="HOST_HF_TOKEN"):
        launch(backend, with_secrets(env={"RUN_FOR": "30"}), job_id="job0")
    assert not (backend.runs_dir / "job0" / "a0").exists()  # nothing was started

    monkeypatch.setenv("HOST_HF_TOKEN", VALUE)
    job_spec = with_secrets(env={"RUN_FOR": "30"})
    launch(backend, job_spec)
    (node,) = backend.nodes("job1", 0, job_spec)
    record = node.launched()
    assert record is not None

    def processes() -> list[int] | None:
        tree = descendants(int(record["pid"]))  # type: ignore[call-overload]
        return tree if len([pid for pid in tree if "RANK" in environ_of(pid)]) == 2 else None

    tree = wait_for("the ranks", processes, 60, interval=0.2)
    agents = [pid for pid in tree if b"ftplane.trainer.agent" in Path(f"/proc/{pid}/cmdline").read_bytes()]
    ranks = [pid for pid in tree if "RANK" in environ_of(pid)]
    (agent,) = agents
    assert environ_of(agent)["FTPLANE_SECRET_ENV"] == "HF_TOKEN" and environ_of(agent)["HF_TOKEN"] == VALUE
    assert all(environ_of(pid)["HF_TOKEN"] == VALUE for pid in ranks)
    backend.cancel("job1", 0, job_spec)
