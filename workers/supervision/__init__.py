"""Supervision duties, one module each: launch attempts, reconcile with the backend,
detect silent ranks, restart or give up. The Celery tasks in workers/tasks call them."""
