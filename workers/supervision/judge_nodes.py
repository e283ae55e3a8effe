"""Duty: the fleet's node ledger: record the nodes, runs and faults the new events show, and judge the nodes by
the reputation rule (api/services/node_reputation/rule.py): suspect, quarantined, released when the quarantine
ends. Database only; incremental (the events past its cursor), never a scan of every event."""

from __future__ import annotations

from sqlalchemy.orm import Session

from api.services import node_reputation


def run_once(session: Session) -> int:
    """One pass; the number of nodes judged."""
    return node_reputation.run_once(session)
