"""Node reputation: every node ftplane has run on, across jobs, the faults blamed on it, and its state.

    rule.py      the rule: healthy, suspect, quarantined (stated there once, with its settings)
    blame.py     which events blame which node, as which kind of fault
    ledger.py    the duty's pass: the events past a cursor recorded as nodes, runs and faults; nodes judged
    standing.py  a change of state carried out: the row, its history, node_quarantined / node_released
    views.py     what the API shows of nodes

A quarantined node is left out of every new attempt's placement (`quarantined_nodes`, read by the launch duty:
on Kubernetes the node affinity that keeps a job's excluded nodes out, for its hot spares too; the local
backend cannot avoid its nodes and says so in the attempt's `submitted` event).
"""

from __future__ import annotations

from sqlalchemy.orm import Session

from api.models import fleet_nodes
from api.services.node_reputation.ledger import run_once
from api.services.node_reputation.standing import release

# At most this many quarantined nodes are kept out of one placement (the newest quarantines first): a node
# affinity's list stays a reasonable size, and a fleet with more quarantined than that has a bigger problem.
MAX_QUARANTINED_PLACED = 256


def quarantined_nodes(session: Session) -> tuple[str, ...]:
    """The nodes new attempts must not be placed on (sorted)."""
    return tuple(sorted(fleet_nodes.quarantined(session, MAX_QUARANTINED_PLACED)))


__all__ = ["quarantined_nodes", "release", "run_once"]
