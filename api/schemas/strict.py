"""The base of every spec model: unknown keys are refused (a typo is an error naming the key, never a setting
silently ignored)."""

from pydantic import BaseModel, ConfigDict


class StrictModel(BaseModel):
    model_config = ConfigDict(extra="forbid")
