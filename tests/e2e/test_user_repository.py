"""End to end, from a user's own repository: its root holds a `trainer.py`, `api/`, `workers/` and `utils.py` of
its own (common names in training repositories), `ftplane serve` runs in it, and both a plain script and an SDK
script (examples/byo's, each importing the repository's `utils`) train to the end with their progress reported. The
jobs run in the repository because their spec says so (`working_dir`): by default a job runs in a directory of its own,
never in the server's.

The repository's `trainer.py`, `api/` and `workers/` raise when imported: were any part of ftplane (the server, its
worker, the node agent, the SDK in the ranks) to import them instead of its own, the jobs would fail."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from ftplane.client import Client
from tests.conftest import ftplane_server
from tests.support.paths import REPO
from tests.support.waiting import wait_for

pytestmark = pytest.mark.slow

BYO = REPO / "examples" / "byo"
STEPS = 24
SHADOW = "raise RuntimeError(\"the repository's own {name} was imported in place of ftplane's\")\n"


def user_repository(root: Path) -> Path:
    root.mkdir(parents=True)
    (root / "trainer.py").write_text(SHADOW.format(name="trainer.py"))
    for package in ("api", "workers"):
        (root / package).mkdir()
        (root / package / "__init__.py").write_text(SHADOW.format(name=f"{package}/"))
    (root / "utils.py").write_text("REPOSITORY = 'mine'\n")
    for script in ("train_plain.py", "train_sdk.py"):
        # the user's own module, imported the usual way (the script's directory first on sys.path)
        future = "from __future__ import annotations\n"
        own = f"{future}\nimport utils\n\nassert utils.REPOSITORY == 'mine'\n"
        (root / script).write_text((BYO / script).read_text().replace(future, own, 1))
    return root


@pytest.fixture(scope="module")
def api(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Client]:
    repository = user_repository(tmp_path_factory.mktemp("user") / "repository")
    with ftplane_server(repository) as env:
        client = Client(url=env["FTPLANE_URL"], token=env["FTPLANE_TOKEN"])
        client.workdir = repository  # type: ignore[attr-defined]
        yield client
        client.close()


def spec(api: Client, name: str, script: str, **overrides: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "name": name,
        "working_dir": str(api.workdir),  # type: ignore[attr-defined]
        "command": ["python", script, f"--steps={STEPS}", "--step-delay-s=0.1", f"--checkpoint-dir=ckpt/{name}"],
        "procs_per_node": 2,
        "env": {"OMP_NUM_THREADS": "1"},
        "resiliency": {"max_in_job_restarts": 0, "max_job_restarts": 0, "initial_heartbeat_timeout_s": 120},
    }
    body.update(overrides)
    return body


def finished(api: Client, job_id: str) -> dict[str, Any]:
    done: dict[str, Any] = wait_for(
        "the job to end",
        lambda: (j := api.job(job_id))["status"] in ("SUCCEEDED", "FAILED", "CANCELLED") and j,
        240,
        interval=0.5,
    )
    return done


def test_a_plain_script_and_an_sdk_script_succeed_from_a_repository_with_clashing_names(api: Client) -> None:
    plain = api.submit(spec(api, "mine-plain", "train_plain.py", progress={"log_pattern": r"step (?P<step>\d+)"}))
    with_sdk = api.submit(spec(api, "mine-sdk", "train_sdk.py"))

    done = finished(api, plain["id"])
    assert done["status"] == "SUCCEEDED", done["status_reason"]
    assert done["progress"]["step"] == STEPS  # read from the ranks' own `step N` lines

    done = finished(api, with_sdk["id"])
    assert done["status"] == "SUCCEEDED", done["status_reason"]
    assert done["progress"]["step"] == STEPS and done["progress"]["total_steps"] == STEPS  # from the SDK
    ranks = api.ranks(with_sdk["id"])
    assert sorted(r["rank"] for r in ranks) == [0, 1] and all(r["step"] == STEPS for r in ranks)
