"""JSON errors that name the offending field and say what to do."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel, Field
from sqlalchemy.exc import InterfaceError, OperationalError
from sqlalchemy.exc import TimeoutError as PoolTimeoutError
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.routing import Match, Mount

DATABASE_RETRY_AFTER_S = 2


class ErrorField(BaseModel):
    field: str
    message: str
    type: str | None = None


class ErrorDetail(BaseModel):
    status: int
    message: str
    fields: list[ErrorField] | None = None
    liveness_taken: bool | None = Field(
        None,
        description="A node report shed with 503 by a server busy storing other reports' events: whether its "
        "liveness and heartbeats were taken all the same (then only its events need sending again).",
    )
    accepted: int | None = Field(None, description="With `liveness_taken`: the heartbeats taken.")


class ErrorResponse(BaseModel):
    """The body of every error answer."""

    error: ErrorDetail


_RETRY_AFTER = {"Retry-After": {"description": "Seconds to wait before retrying.", "schema": {"type": "integer"}}}
_ERRORS: dict[int, dict[str, Any]] = {
    400: {"description": "The body is not JSON this API can read (malformed, not UTF-8, or nested too deeply)."},
    401: {"description": "No bearer token, an invalid or revoked one, or a JWT refused (the message says why)."},
    403: {
        "description": "The caller's role is too low (the message names the role needed), or a trainer token "
        "asked for more than reporting for its own job."
    },
    404: {"description": "No such resource, or one of a project the caller holds no role in."},
    409: {"description": "The resource is in a state that does not allow this."},
    413: {"description": "The body is larger than FTPLANE_MAX_BODY_BYTES."},
    422: {"description": "A field is invalid; `fields` names each one."},
    429: {"description": "This token sent too much; retry after Retry-After seconds.", "headers": _RETRY_AFTER},
    503: {
        "description": "The database is unavailable, or (node reports) the server is busy storing other reports' "
        "events; retry after Retry-After seconds.",
        "headers": _RETRY_AFTER,
    },
}


def responses(*codes: int) -> dict[int | str, dict[str, Any]]:
    """OpenAPI `responses=` entries for these error statuses, all with the ErrorResponse body."""
    return {code: {"model": ErrorResponse, **_ERRORS[code]} for code in codes}


# What any authenticated /v1 operation may answer, whatever it does.
API_ERRORS = responses(400, 401, 403, 413, 422, 503)


class ApiError(Exception):
    def __init__(
        self,
        status: int,
        message: str,
        *,
        field: str | None = None,
        headers: dict[str, str] | None = None,
        details: dict[str, Any] | None = None,
    ):
        super().__init__(message)
        self.status = status
        self.message = message
        self.field = field
        self.headers = headers
        self.details = details  # more of what happened, in the error object next to status and message


def _field_path(loc: tuple[Any, ...]) -> str:
    parts = [str(p) for p in loc if p not in ("body", "query", "path", "header")]
    out = ""
    for part in parts:
        out += f"[{part}]" if part.isdigit() else (f".{part}" if out else part)
    return out


def _body(status: int, message: str, errors: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    body: dict[str, Any] = {"error": {"status": status, "message": message}}
    if errors is not None:
        body["error"]["fields"] = errors
    return body


OnRefused = Callable[[Request, int, str], None]


def install(app: FastAPI, on_refused: OnRefused | None = None) -> None:
    """JSON error answers; `on_refused(request, status, message)` is told of each ApiError and invalid request
    (in a worker thread: it may write to the database)."""

    async def refused(request: Request, status: int, message: str) -> None:
        if on_refused is not None and getattr(request.state, "audit", None) is not None:
            await run_in_threadpool(on_refused, request, status, message)

    @app.exception_handler(RequestValidationError)
    async def _validation(request: Request, exc: RequestValidationError) -> JSONResponse:
        errors = []
        for err in exc.errors():
            field = _field_path(tuple(err.get("loc", ())))
            message = str(err.get("msg", "invalid"))
            if err.get("type") == "extra_forbidden":
                message = "unknown field: remove it or check its spelling"
            errors.append({"field": field or "body", "message": message, "type": err.get("type")})
        summary = "; ".join(f"{e['field']}: {e['message']}" for e in errors[:5])
        await refused(request, 422, f"invalid request: {summary}")
        return JSONResponse(status_code=422, content=_body(422, f"invalid request: {summary}", errors))

    @app.exception_handler(ApiError)
    async def _api_error(request: Request, exc: ApiError) -> JSONResponse:
        await refused(request, exc.status, exc.message)
        fields = [{"field": exc.field, "message": exc.message}] if exc.field else None
        body = _body(exc.status, exc.message, fields)
        body["error"].update(exc.details or {})
        return JSONResponse(status_code=exc.status, content=body, headers=exc.headers)

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        headers = getattr(exc, "headers", None)
        message = _unreadable_body(exc) or str(exc.detail)
        allowed = allowed_methods(request) if exc.status_code == 405 else []
        if allowed:  # (a static file's 405 keeps its own Allow)
            headers = {**(headers or {}), "Allow": ", ".join(allowed)}
            message = f"{request.method} is not allowed here: this path takes {', '.join(allowed)}"
        return JSONResponse(status_code=exc.status_code, content=_body(exc.status_code, message), headers=headers)

    @app.exception_handler(OperationalError)
    @app.exception_handler(InterfaceError)
    @app.exception_handler(PoolTimeoutError)
    async def _database_down(_: Request, exc: Exception) -> JSONResponse:
        return JSONResponse(
            status_code=503,
            content=_body(503, "the database is unavailable; retry shortly"),
            headers={"Retry-After": str(DATABASE_RETRY_AFTER_S)},
        )


HTTP_METHODS = ("GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS")


def allowed_methods(request: Request) -> list[str]:
    """Every method some route serves at this request's path. Starlette's own 405 names only the methods of
    the first route whose path matched, so a path served by two routes (GET and POST) advertised one."""
    routes = [route for route in request.app.router.routes if not isinstance(route, Mount)]
    return [
        method
        for method in HTTP_METHODS
        if any(route.matches({**request.scope, "method": method})[0] == Match.FULL for route in routes)
    ]


def _unreadable_body(exc: StarletteHTTPException) -> str | None:
    """FastAPI answers 400 to a body json.loads could not read; say why, and what to send instead."""
    if exc.status_code != 400:
        return None
    cause = exc.__cause__
    if isinstance(cause, RecursionError):
        return "the JSON body is nested too deeply to read: send at most a few dozen levels of nesting"
    if isinstance(cause, UnicodeError):
        return "the body is not valid UTF-8: send JSON encoded as UTF-8"
    if cause is not None:
        return f"the body could not be read as JSON ({type(cause).__name__}): send a JSON object"
    return None
