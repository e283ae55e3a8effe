"""The FastAPI application."""

from __future__ import annotations

from fastapi import Depends, FastAPI

from api.core import errors, heap
from api.core.config import Settings, get_settings
from api.core.limits import BodySizeLimit, TextGuard
from api.core.logging import configure_logging
from api.deps import audit_trail
from api.routes import (
    audit,
    dashboard,
    dashboard_nodes,
    dashboard_sso,
    fleet_dashboard,
    fleet_goodput,
    goodput,
    health,
    jobs,
    logs,
    metrics,
    nodes,
    objectives,
    projects,
    reports,
    tokens,
    webhooks,
)
from api.services import audit as audit_log
from api.services.ingest import caches, liveness_writer
from api.services.ingest.lateness import RefuseLateReports


def create_app(settings: Settings | None = None, *, migrate: bool = True) -> FastAPI:
    settings = settings or get_settings()
    configure_logging(settings)
    if migrate:
        from api.core.db import upgrade_to_head

        upgrade_to_head(settings)
    app = FastAPI(
        title="ftplane",
        version="0.1.0",
        description="Control plane for fault-tolerant distributed PyTorch training.",
        docs_url="/docs",
    )
    errors.install(app, on_refused=audit_log.record_refusal)
    app.add_middleware(TextGuard)
    app.add_middleware(BodySizeLimit, max_bytes=settings.max_body_bytes)  # size first
    app.add_middleware(RefuseLateReports)  # outermost: a late report is refused before anything reads it
    app.include_router(health.router)
    # Routes are matched in the order they are added, one by one: node traffic, most of all requests, comes
    # first (after it, every report would be compared with each route before its own).
    for router in (reports.router, logs.router):  # node traffic, and reads that may stream: nothing to audit
        app.include_router(router, responses=errors.API_ERRORS)
    # Every changing request of these routers is audited (api/services/audit.py); node reports are not.
    audited = [Depends(audit_trail)]
    for router in (
        jobs.router,
        tokens.router,
        webhooks.router,
        goodput.router,
        projects.router,
        audit.router,
        fleet_goodput.router,
        objectives.router,
        nodes.router,
    ):
        app.include_router(router, responses=errors.API_ERRORS, dependencies=audited)
    for router in (metrics.router, dashboard.router, dashboard_sso.router, dashboard_nodes.router):
        app.include_router(router)
    app.include_router(fleet_dashboard.router)
    dashboard.mount_static(app)
    reports.document(app)
    caches.forget_all()  # a new app (tests switch databases) starts with nothing cached
    liveness_writer.reset()
    return app


def create_served_app() -> FastAPI:
    """The app as `ftplane serve` runs it, in each API process: built, then the process's heap settled
    (`api/core/heap.py`) before it serves. Tests build apps with `create_app` and leave their process's
    collector alone."""
    app = create_app()
    heap.settle()
    return app
