from tests.webhooks.support import admin, admin_token, app, client, enqueued, env, make_job, receiver

__all__ = ["admin", "admin_token", "app", "client", "enqueued", "env", "make_job", "receiver"]
