"""Tasks (beat): one per supervision duty (`workers.supervision.DUTIES`), each a pass over its batch of jobs."""

from __future__ import annotations

import logging

from api.core.db import session_scope
from workers.celery_app import celery_app
from workers.supervision import DUTIES, Duty

log = logging.getLogger(__name__)


def _register(duty: Duty) -> object:
    """The duty's task, registered under its name."""

    def run_pass() -> int:
        with session_scope() as session:
            done = duty.run_once(session)
        log.debug("%s: %d job(s)", duty.title, done)
        return done

    run_pass.__name__ = run_pass.__qualname__ = f"{duty.name}_task"
    return celery_app.task(name=duty.task)(run_pass)


TASKS = {duty.name: _register(duty) for duty in DUTIES}
