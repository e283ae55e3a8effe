"""Numbers and booleans as the OpenAPI states them.

pydantic's lax mode reads the string "3" and `true` as integers, and 1 or "yes" as `true`; the OpenAPI
says integer, number or boolean, and a client that sends a string or a boolean there has a bug worth
hearing about. These accept JSON numbers and JSON booleans only, natively (no Python call per value on
the ingest path, where a batch holds thousands):

    JsonInt(ge=0, le=10)    an integer, which JSON may write as 3 or 3.0 (both are integers to JSON Schema)
    Field(strict=True)      on a float field: any JSON number, no string, no boolean
    StrictBool              true or false
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pydantic import GetCoreSchemaHandler, GetJsonSchemaHandler
from pydantic.json_schema import JsonSchemaValue
from pydantic_core import PydanticCustomError, core_schema


def _whole(value: float) -> int:
    if not value.is_integer():
        raise PydanticCustomError("int_from_float", "Input should be a whole number")
    return int(value)


@dataclass(frozen=True)
class JsonInt:
    """`Annotated[int, JsonInt(ge=..., le=...)]`: a JSON integer within the bounds (3 and 3.0; not "3", not true)."""

    ge: int | None = None
    le: int | None = None

    def __get_pydantic_core_schema__(self, source: Any, handler: GetCoreSchemaHandler) -> core_schema.CoreSchema:
        written = core_schema.union_schema(
            [
                core_schema.int_schema(strict=True),
                core_schema.no_info_after_validator_function(_whole, core_schema.float_schema(strict=True)),
            ],
            custom_error_type="json_int",
            custom_error_message="Input should be a whole JSON number, not a fraction, a string or a boolean",
        )
        return core_schema.chain_schema([written, core_schema.int_schema(ge=self.ge, le=self.le)])

    def __get_pydantic_json_schema__(
        self, schema: core_schema.CoreSchema, handler: GetJsonSchemaHandler
    ) -> JsonSchemaValue:
        out: dict[str, Any] = {"type": "integer"}
        if self.ge is not None:
            out["minimum"] = self.ge
        if self.le is not None:
            out["maximum"] = self.le
        return out
