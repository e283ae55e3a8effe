"""What the `ftplane` commands print to (the console, its stderr twin, JSON), their output option, and how a
command fails (an API refusal included)."""

from __future__ import annotations

import json
import sys
from enum import StrEnum
from typing import Annotated, Any, NoReturn

import typer
from rich.console import Console

from ftplane.client import ApiFailure

console = Console()
err = Console(stderr=True)


def fail(message: str, code: int = 1) -> NoReturn:
    """Print `error: <message>` to stderr and end the command with `code`."""
    err.print(f"[red]error:[/red] {message}")
    raise typer.Exit(code)


def call(fn: Any, *args: Any, **kwargs: Any) -> Any:
    """`fn(*args, **kwargs)`; an API refusal ends the command with its message."""
    try:
        return fn(*args, **kwargs)
    except ApiFailure as exc:
        fail(exc.message if exc.status else str(exc))


def print_json(data: Any) -> None:
    sys.stdout.write(json.dumps(data, indent=2, default=str) + "\n")


class Output(StrEnum):
    table = "table"
    json = "json"


OutputOpt = Annotated[Output, typer.Option("--output", "-o", help="table or json")]
