"""The exception a rank died of, read from the last lines it printed (for code that does not report it).

Python prints an uncaught exception as a traceback ending in the exception's line:

    Traceback (most recent call last):
      File "train.py", line 12, in <module>
        raise ValueError("learning rate must be positive")
    ValueError: learning rate must be positive

`exception_in(lines)` gives that last line (`ValueError: learning rate must be positive`) for the
newest traceback in `lines`, or, when the traceback's start is cut off, the last line that names an
exception class. Once torch.distributed has a process group, its exception hook prints every line of
the traceback after `[rank<R>]: `; that prefix is read past. Standard library only.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

TRACEBACK_START = "Traceback (most recent call last):"
# `pkg.module.SomeError: message`, `KeyboardInterrupt`, `torch.distributed.DistBackendError: ...`
EXCEPTION_LINE = re.compile(r"^(?P<type>[A-Za-z_][\w]*(?:\.[A-Za-z_]\w*)*)(?::\s?(?P<message>.*))?$")
EXCEPTION_NAME = re.compile(r"(Error|Exception|Exit|Interrupt|Warning|Failure|Fault)$")
MAX_MESSAGE = 500
# torch.distributed's exception hook (distributed_c10d.py, `_distributed_excepthook`): `[rank1]: ` before each line
TORCH_RANK_PREFIX = re.compile(r"^\[rank\d+\]: ?")


def exception_in(lines: Sequence[str]) -> str | None:
    """`Type: message` of the newest uncaught exception in a rank's last lines, or None."""
    lines = [TORCH_RANK_PREFIX.sub("", line, count=1) for line in lines]
    start = max((i for i, line in enumerate(lines) if line.startswith(TRACEBACK_START)), default=None)
    if start is not None:
        after = [line for line in lines[start + 1 :] if line and not line[0].isspace()]
        for strict in (True, False):  # a class named like an exception first, then `AnyName: message`
            for line in after:
                found = _exception(line, strict=strict)
                if found is not None:
                    return found
    for line in reversed(lines):
        found = _exception(line, strict=True)
        if found is not None:
            return found
    return None


def _exception(line: str, *, strict: bool) -> str | None:
    match = EXCEPTION_LINE.match(line.rstrip())
    if match is None:
        return None
    name = match["type"].rsplit(".", 1)[-1]
    if not EXCEPTION_NAME.search(name) and (strict or match["message"] is None):
        return None
    text = match["type"] if match["message"] is None else f"{match['type']}: {match['message']}"
    return text[:MAX_MESSAGE]
