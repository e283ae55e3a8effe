from tests.support.embedded_app import app, enqueued, env

# client, admin_token, admin, make_job and receiver come from tests/conftest.py and use the app above.
__all__ = ["app", "enqueued", "env"]
