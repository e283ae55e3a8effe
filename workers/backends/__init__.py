"""Execution backends, by the name a job spec gives."""

from __future__ import annotations

from functools import cache

from workers.backends.base import Backend


class UnknownBackend(Exception):
    pass


@cache
def get_backend(name: str) -> Backend:
    if name == "local":
        from workers.backends.local import LocalBackend

        return LocalBackend()
    if name == "kubernetes":
        try:
            from workers.backends.kubernetes import KubernetesBackend
        except ImportError as exc:
            raise UnknownBackend("the kubernetes backend is not available in this build") from exc
        return KubernetesBackend()
    raise UnknownBackend(f"no execution backend named {name!r}")
