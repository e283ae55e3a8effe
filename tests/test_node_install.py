"""What a training image installs: ftplane's base distribution, the node side (agent, SDK, contract) with httpx only.

The node side is imported in a fresh interpreter in which every control-plane library (and torch, which the agent
and the SDK's core do not need) refuses to import: were the agent or the SDK to import one, a training image
without it would fail."""

from __future__ import annotations

import subprocess
import sys
import tomllib

from tests.support.paths import REPO

CONTROL_PLANE_LIBRARIES = (
    "alembic",
    "cachetools",
    "celery",
    "fastapi",
    "jinja2",
    "kombu",
    "kubernetes",
    "prometheus_client",
    "psycopg",
    "pydantic",
    "pydantic_settings",
    "redis",
    "rich",
    "sqlalchemy",
    "standardwebhooks",
    "starlette",
    "tenacity",
    "typer",
    "uvicorn",
    "yaml",
)
NODE_SIDE = ("ftplane.sdk", "ftplane.contract", "ftplane.trainer.agent.__main__", "ftplane.trainer.agent.node")

REFUSE = """
import importlib.abc, sys
REFUSED = set(sys.argv[1].split(","))
class Refuse(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in REFUSED:
            raise ImportError(f"{name} is not installed in a training image")
        return None
sys.meta_path.insert(0, Refuse())
import importlib
for module in sys.argv[2].split(","):
    importlib.import_module(module)
print("imported", len(sys.argv[2].split(",")))
"""


def test_the_base_distribution_depends_on_httpx_only() -> None:
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    assert [d.split(">")[0].split("=")[0] for d in project["dependencies"]] == ["httpx"]
    server = {d.split(">")[0].split("=")[0].split("[")[0] for d in project["optional-dependencies"]["server"]}
    assert {"fastapi", "sqlalchemy", "celery", "kubernetes", "uvicorn", "psycopg"} <= server
    assert project["scripts"]["ftplane-agent"] == "ftplane.trainer.agent.__main__:main"


def test_the_node_side_imports_without_the_control_planes_libraries_or_torch() -> None:
    refused = ",".join((*CONTROL_PLANE_LIBRARIES, "packaging", "torch", "nvidia_resiliency_ext"))
    result = subprocess.run(
        [sys.executable, "-P", "-c", REFUSE, refused, ",".join(NODE_SIDE)],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=REPO,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.strip() == f"imported {len(NODE_SIDE)}"


def test_the_refusal_itself_works() -> None:
    """The check above could pass by importing nothing: a control-plane module is refused."""
    result = subprocess.run(
        [sys.executable, "-P", "-c", REFUSE, ",".join(CONTROL_PLANE_LIBRARIES), "api.main"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=REPO,
    )
    assert result.returncode != 0 and "is not installed in a training image" in result.stderr
