from tests.webhooks.support import app, enqueued, env, receiver

# client, admin_token, admin and make_job come from tests/conftest.py and use the app above.
__all__ = ["app", "enqueued", "env", "receiver"]
