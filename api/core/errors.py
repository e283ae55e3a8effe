"""JSON errors that name the offending field and say what to do."""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from sqlalchemy.exc import InterfaceError, OperationalError
from starlette.exceptions import HTTPException as StarletteHTTPException


class ApiError(Exception):
    def __init__(self, status: int, message: str, *, field: str | None = None, headers: dict[str, str] | None = None):
        super().__init__(message)
        self.status = status
        self.message = message
        self.field = field
        self.headers = headers


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


def install(app: FastAPI) -> None:
    @app.exception_handler(RequestValidationError)
    async def _validation(_: Request, exc: RequestValidationError) -> JSONResponse:
        errors = []
        for err in exc.errors():
            field = _field_path(tuple(err.get("loc", ())))
            message = str(err.get("msg", "invalid"))
            if err.get("type") == "extra_forbidden":
                message = "unknown field: remove it or check its spelling"
            errors.append({"field": field or "body", "message": message, "type": err.get("type")})
        summary = "; ".join(f"{e['field']}: {e['message']}" for e in errors[:5])
        return JSONResponse(status_code=422, content=_body(422, f"invalid request: {summary}", errors))

    @app.exception_handler(ApiError)
    async def _api_error(_: Request, exc: ApiError) -> JSONResponse:
        fields = [{"field": exc.field, "message": exc.message}] if exc.field else None
        return JSONResponse(status_code=exc.status, content=_body(exc.status, exc.message, fields), headers=exc.headers)

    @app.exception_handler(StarletteHTTPException)
    async def _http(_: Request, exc: StarletteHTTPException) -> JSONResponse:
        return JSONResponse(
            status_code=exc.status_code,
            content=_body(exc.status_code, str(exc.detail)),
            headers=getattr(exc, "headers", None),
        )

    @app.exception_handler(OperationalError)
    @app.exception_handler(InterfaceError)
    async def _database_down(_: Request, exc: Exception) -> JSONResponse:
        return JSONResponse(
            status_code=503,
            content=_body(503, "the database is unavailable; retry shortly"),
            headers={"Retry-After": "2"},
        )
