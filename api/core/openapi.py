"""OpenAPI declarations the routes share: links (which operation a response's values lead to: a new job's
id to the job's routes, a page's next_cursor to the next page, so clients and stateful fuzzers follow
real ids rather than guesses) and the opaque page cursor."""

from __future__ import annotations

from typing import Any


def link(method: str, path: str, description: str, **parameters: str) -> dict[str, Any]:
    """One OpenAPI Link object to `method path`; each parameter is a runtime expression, e.g.
    job_id="$response.body#/id"."""
    pointer = path.replace("~", "~0").replace("/", "~1")
    return {"operationRef": f"#/paths/{pointer}/{method.lower()}", "parameters": parameters, "description": description}


def links(status: int, **named: dict[str, Any]) -> dict[int | str, dict[str, Any]]:
    """A `responses=` entry adding these links to the `status` response (FastAPI merges it with the rest)."""
    return {status: {"links": named}}


# A page cursor as the server issues it (base64url, unpadded). Only a next_cursor the server returned is a
# position: a well-formed string it never issued is refused with 422 (no schema can say which were issued).
CURSOR_PATTERN = "^[A-Za-z0-9_-]+$"
CURSOR_DESCRIPTION = (
    "The next_cursor of the previous page, as returned (opaque). Anything else, even of the right shape, is 422."
)
