"""Which NVRx is installed, and whether a version satisfies a specifier (the few PEP 440 forms used here,
compared with the standard library: the node side installs without `packaging`)."""

from __future__ import annotations

import importlib.metadata
import re

try:
    NVRX_VERSION: str | None = importlib.metadata.version("nvidia-resiliency-ext")
except importlib.metadata.PackageNotFoundError:  # pragma: no cover - e.g. a source checkout on PYTHONPATH
    NVRX_VERSION = None
# The NVRx the CUDA path (the async checkpoint writer) is written against and tested with; pyproject's
# `gpu` extra pins the same.
NVRX_FOR_CUDA = "~=0.7.0"
# Versions whose source the private attributes used in this package were read in.
NVRX_INTERNALS_READ = ("==0.4.1", "~=0.7.0")

# A final release (1.2.3, optionally with a local label: 1.2.3+cu12 or a post-release: 1.2.3.post1);
# a pre-release or development version (1.2.3rc1, 1.2.3.dev0) satisfies no specifier, as in PEP 440.
_FINAL = re.compile(r"v?(?P<release>\d+(?:\.\d+)*)(?:[-_.]?post\d*)?(?:\+[a-z0-9.]+)?", re.IGNORECASE)
_SPECIFIER = re.compile(r"\s*(?P<op>==|~=)\s*(?P<release>\d+(?:\.\d+)*)\s*")


def release_of(version: str) -> tuple[int, ...] | None:
    """The release numbers of a final version (trailing zeros dropped), None for anything else."""
    match = _FINAL.fullmatch(version.strip())
    if match is None:
        return None
    numbers = [int(part) for part in match["release"].split(".")]
    while len(numbers) > 1 and numbers[-1] == 0:
        numbers.pop()
    return tuple(numbers)


def satisfies(version: str, specifier: str) -> bool:
    """`version` in `specifier`, for `==X.Y.Z` (the same release) and `~=X.Y.Z` (at least X.Y.Z, within X.Y)."""
    wanted = _SPECIFIER.fullmatch(specifier)
    if wanted is None:
        raise ValueError(f"unsupported version specifier {specifier!r}: use ==X.Y.Z or ~=X.Y.Z")
    have = release_of(version)
    if have is None:
        return False
    parts = [int(part) for part in wanted["release"].split(".")]
    floor = release_of(wanted["release"])
    assert floor is not None  # the specifier's pattern is a release
    if wanted["op"] == "==":
        return have == floor
    if len(parts) < 2:
        raise ValueError(f"{specifier!r}: ~= needs at least two release numbers")
    prefix = tuple(parts[:-1])
    padded = have + (0,) * max(len(prefix) - len(have), 0)
    return padded[: len(prefix)] == prefix and have >= floor


def nvrx_version_matches(specifier: str, version: str | None = None) -> bool:
    """Whether the installed NVRx (or `version`) satisfies `specifier`; False when it is unknown."""
    version = NVRX_VERSION if version is None else version
    return version is not None and satisfies(version, specifier)


def internals_read(version: str | None = None) -> bool:
    """Whether NVRx's private attributes may be used: only on the versions they were read in."""
    return any(nvrx_version_matches(spec, version) for spec in NVRX_INTERNALS_READ)
