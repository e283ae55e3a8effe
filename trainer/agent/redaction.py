"""What never leaves the node in a line of output: the job's token, the values of its secret variables
(`secret_env`, named in FTPLANE_SECRET_ENV), and anything shaped like an ftplane token.

The agent redacts every line before it keeps it, echoes it (a container's log) or puts it in an
event (a failure's tail), and its own log lines too; the control plane never sees the values, so it
could not redact them.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterable, Mapping

from ftplane.contract import REDACTED, Env

log = logging.getLogger(__name__)

# ftplane's own tokens (api/core/security.py): an admin's or a job's, whoever's they are.
TOKEN = r"ftp_(?:admin|job)_[A-Za-z0-9_-]{16,}"
# A value shorter than this would blank out ordinary words: such a secret is left as it is (and said so).
MIN_SECRET_LENGTH = 4


class Redactor:
    def __init__(self, secrets: Iterable[str] = ()) -> None:
        values = sorted({s for s in secrets if len(s) >= MIN_SECRET_LENGTH}, key=len, reverse=True)
        self.pattern = re.compile("|".join([*(re.escape(v) for v in values), TOKEN]))

    @classmethod
    def from_environment(cls, environ: Mapping[str, str]) -> Redactor:
        names = [n.strip() for n in environ.get(Env.SECRET_ENV, "").split(",") if n.strip()]
        values = [environ.get(Env.TOKEN, "")]
        for name in names:
            value = environ.get(name, "")
            if 0 < len(value) < MIN_SECRET_LENGTH:
                log.warning("secret variable %s is shorter than %d characters: not redacted", name, MIN_SECRET_LENGTH)
            values.append(value)
        return cls(values)

    def __call__(self, text: str) -> str:
        return self.pattern.sub(REDACTED, text)


class RedactingFilter(logging.Filter):
    """The agent's own log lines (its stderr: a pod's container log) redacted as the ranks' are."""

    def __init__(self, redact: Redactor) -> None:
        super().__init__()
        self.redact = redact

    def filter(self, record: logging.LogRecord) -> bool:
        record.msg, record.args = self.redact(record.getMessage()), None
        if record.exc_info:
            record.exc_text = self.redact(logging.Formatter().formatException(record.exc_info))
            record.exc_info = None
        return True
