"""The FastAPI application."""

from __future__ import annotations

from fastapi import FastAPI

from api.core import errors, heap
from api.core.config import Settings, get_settings
from api.core.limits import BodySizeLimit, TextGuard
from api.core.logging import configure_logging
from api.routes import dashboard, goodput, health, jobs, metrics, reports, tokens, webhooks
from api.services import liveness_writer, report_gate


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
    errors.install(app)
    app.add_middleware(TextGuard)
    app.add_middleware(BodySizeLimit, max_bytes=settings.max_body_bytes)  # outermost: size first
    app.include_router(health.router)
    for router in (jobs.router, reports.router, tokens.router, webhooks.router, goodput.router):
        app.include_router(router, responses=errors.API_ERRORS)
    for router in (metrics.router, dashboard.router):
        app.include_router(router)
    dashboard.mount_static(app)
    reports.document(app)
    report_gate.forget_all()  # a new app (tests switch databases) starts with nothing cached
    liveness_writer.reset()
    return app


def create_served_app() -> FastAPI:
    """The app as `ftplane serve` runs it, in each API process: built, then the process's heap settled
    (`api/core/heap.py`) before it serves. Tests build apps with `create_app` and leave their process's
    collector alone."""
    app = create_app()
    heap.settle()
    return app
