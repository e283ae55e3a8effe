"""deploy/'s files as the deploy tests read them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from tests.support.paths import REPO

DEPLOY = REPO / "deploy"
KUSTOMIZE = DEPLOY / "kustomize"


def load_docs(path: Path) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


def by_kind(docs: list[dict[str, Any]], kind: str) -> dict[str, dict[str, Any]]:
    return {d["metadata"]["name"]: d for d in docs if d["kind"] == kind}
