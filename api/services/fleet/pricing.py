"""What a GPU-hour costs (FTPLANE_GPU_HOUR_PRICE), read once at start-up.

    2.5                               every GPU-hour costs 2.5
    team=a:3.0,team=b:2.0             per value of one label: jobs labelled team=a pay 3.0, team=b 2.0; other jobs
                                      are not priced (their GPU-hours are reported as unpriced)
    team=a:3.0,team=b:2.0,*:2.5       the same, and 2.5 for every other job

Prices are finite numbers at least 0, in whatever currency the operator reads them; every entry names the same
label key, each value once.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Any

from api.schemas.spec import LABEL_KEY

_VALUE = r"[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?"
_ENTRY = re.compile(rf"^(?P<key>[^=:]+)=(?P<value>{_VALUE}|):(?P<price>[^:,]+)$")


@dataclass(frozen=True)
class Pricing:
    """Price per GPU-hour: `default` for every job, or per value of the label `key` (then `default` for the rest,
    None: the rest are not priced)."""

    default: float | None = None
    key: str | None = None
    by_value: dict[str, float] = field(default_factory=dict)

    @property
    def configured(self) -> bool:
        return self.default is not None or bool(self.by_value)

    def price_of(self, labels: dict[str, Any]) -> float | None:
        """A GPU-hour of a job with these labels (None: not priced)."""
        if self.key is not None and self.key in labels and str(labels[self.key]) in self.by_value:
            return self.by_value[str(labels[self.key])]
        return self.default


NONE = Pricing()


def _price(text: str, setting: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise ValueError(f"{setting}: {text!r} is not a number") from None
    if not math.isfinite(value) or value < 0:
        raise ValueError(f"{setting}: a price must be a finite number at least 0, not {text!r}")
    return value


def parse(text: str | None, setting: str = "FTPLANE_GPU_HOUR_PRICE") -> Pricing:
    """The pricing `text` says; raises ValueError naming the setting and the entry that is wrong."""
    if text is None or not text.strip():
        return NONE
    entries = [part.strip() for part in text.split(",")]
    if len(entries) == 1 and "=" not in entries[0] and ":" not in entries[0]:
        return Pricing(default=_price(entries[0], setting))
    default: float | None = None
    key: str | None = None
    by_value: dict[str, float] = {}
    for entry in entries:
        if entry.startswith("*:"):
            if default is not None:
                raise ValueError(f"{setting}: '*' is given twice")
            default = _price(entry[2:], setting)
            continue
        found = _ENTRY.match(entry)
        if found is None:
            raise ValueError(
                f"{setting}: {entry!r} is not LABEL=VALUE:PRICE or *:PRICE "
                "(e.g. team=a:3.0,team=b:2.0,*:2.5, or one number for every GPU-hour)"
            )
        if not re.match(LABEL_KEY, found["key"]):
            raise ValueError(f"{setting}: {found['key']!r} is not a label key")
        if key is not None and found["key"] != key:
            raise ValueError(f"{setting}: every entry must name the same label key ({key!r}, not {found['key']!r})")
        key = found["key"]
        if found["value"] in by_value:
            raise ValueError(f"{setting}: {key}={found['value']} is given twice")
        by_value[found["value"]] = _price(found["price"], setting)
    return Pricing(default=default, key=key, by_value=by_value)
