"""Data access for the control plane's tables: one module per table family, imported as `models.<name>`."""

from api.models import audit, events, faults, jobs, liveness, nodes, projects, tokens, upsert

__all__ = ["audit", "events", "faults", "jobs", "liveness", "nodes", "projects", "tokens", "upsert"]
