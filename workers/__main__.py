"""`python -P -m workers worker|beat [OPTIONS]`: Celery's command line for ftplane's app (`ftplane serve` runs it).

The app is imported before Celery's command line runs: Celery puts the current directory first on the import
path while it looks up an `-A` app, and `ftplane serve` may run in a user's repository with a `workers/` or
`api/` of its own.
"""

from __future__ import annotations

import sys

from workers.celery_app import celery_app


def main() -> int:
    return int(celery_app.start(argv=sys.argv[1:]) or 0)


if __name__ == "__main__":
    sys.exit(main())
