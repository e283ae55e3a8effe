"""Token generation and hashing. Tokens are shown once and stored only as SHA-256 digests."""

from __future__ import annotations

import hashlib
import secrets
import uuid

ADMIN_PREFIX = "ftp_admin_"
TRAINER_PREFIX = "ftp_job_"


def new_id() -> str:
    return uuid.uuid4().hex


def new_token(prefix: str) -> str:
    return prefix + secrets.token_urlsafe(32)


def digest(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def redact(text: str, *secrets_: str) -> str:
    for secret in secrets_:
        if secret:
            text = text.replace(secret, "***")
    return text
