"""ORM tables, one module per part of the domain. The schema itself changes only through Alembic migrations in
`migrations/`; importing this package registers every table on `Base.metadata`."""

from __future__ import annotations

from api.database.tables.base import Base, BigId, UtcDateTime
from api.database.tables.fleet import (
    GoodputCounter,
    GoodputDay,
    GoodputFault,
    GoodputHour,
    GoodputMark,
    GoodputSegment,
    GoodputSummary,
    Objective,
    ObjectiveBreach,
)
from api.database.tables.jobs import (
    ApiToken,
    Attempt,
    AuditEntry,
    Event,
    Job,
    JobWatch,
    NodeLiveness,
    PendingFault,
    Project,
    RankLiveness,
    RoleBinding,
    StragglerSample,
    WebhookDelivery,
    WebhookSubscription,
)
from api.database.tables.nodes import FleetNode, NodeFault, NodeHistory, NodeLedgerCursor, NodeRun

__all__ = [
    "ApiToken",
    "Attempt",
    "AuditEntry",
    "Base",
    "BigId",
    "Event",
    "FleetNode",
    "GoodputCounter",
    "GoodputDay",
    "GoodputFault",
    "GoodputHour",
    "GoodputMark",
    "GoodputSegment",
    "GoodputSummary",
    "Job",
    "JobWatch",
    "NodeFault",
    "NodeHistory",
    "NodeLedgerCursor",
    "NodeLiveness",
    "NodeRun",
    "Objective",
    "ObjectiveBreach",
    "PendingFault",
    "Project",
    "RankLiveness",
    "RoleBinding",
    "StragglerSample",
    "UtcDateTime",
    "WebhookDelivery",
    "WebhookSubscription",
]
