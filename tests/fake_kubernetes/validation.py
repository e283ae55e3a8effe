"""What the fake API server refuses, and how, the way a Kubernetes 1.33 API server does.

- A body that does not fit the kind's schema (the 1.33 OpenAPI that kubernetes-validate ships, strict:
  unknown fields refused, as with `fieldValidation=Strict`): an unknown field or a value of the wrong
  type is 400 BadRequest ("strict decoding error", "cannot be handled as a Job"), any other schema
  violation 422 Invalid;
- object names (DNS-1123 subdomains; DNS-1123 labels for Services and Namespaces), label keys and values,
  annotation keys: 422 Invalid;
- changes to immutable fields on PUT and PATCH (a Job's selector, template, completion mode, completions,
  pod failure policy; a pod's spec but for its images; a Service's clusterIP): 422 Invalid.

Each refusal is an `ApiError` carrying the `Status` details a real server sends (`causes` with the field).
"""

from __future__ import annotations

import json
import re
from functools import cache
from importlib import resources
from typing import Any

import jsonschema
import referencing

from tests.fake_kubernetes.errors import ApiError

SCHEMA_VERSION = "v1.33.0-local-strict"
DNS_1123_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
DNS_1123_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
DNS_1035_LABEL = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
QUALIFIED_NAME = re.compile(r"^([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]$")
LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")
# kinds named as DNS labels (the rest are subdomains)
LABEL_NAMED = {"Service": DNS_1035_LABEL, "Namespace": DNS_1123_LABEL}


@cache
def _registry() -> referencing.Registry:
    folder = resources.files("kubernetes_validate").joinpath(f"kubernetes-json-schema/{SCHEMA_VERSION}")
    definitions = json.loads(folder.joinpath("_definitions.json").read_text())
    return referencing.Resource.from_contents(definitions) @ referencing.Registry()


@cache
def _validator(kind: str, api_version: str) -> jsonschema.protocols.Validator | None:
    group_version = re.sub(r"^([^./]*)(?:\.[^/]*)?/", r"\1-", api_version)
    path = f"kubernetes-json-schema/{SCHEMA_VERSION}/{kind.lower()}-{group_version}.json"
    schemas = resources.files("kubernetes_validate").joinpath(f"kubernetes-json-schema/{SCHEMA_VERSION}")
    if not schemas.is_dir():  # never validate nothing in silence: the fake would accept what a real server refuses
        raise RuntimeError(f"kubernetes-validate has no {SCHEMA_VERSION} schemas: install a newer kubernetes-validate")
    ref = resources.files("kubernetes_validate").joinpath(path)
    if not ref.is_file():
        return None  # a custom resource (Kueue's Workload): no built-in schema
    schema = json.loads(ref.read_text())
    registry = referencing.Resource.from_contents(schema) @ _registry()
    return jsonschema.validators.Draft202012Validator(schema, registry=registry)


def _field(path: Any) -> str:
    out = ""
    for part in path:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def invalid(kind: str, name: str, causes: list[tuple[str, str]], *, reason: str = "FieldValueInvalid") -> ApiError:
    """422 Invalid, as the API server says it: `<Kind> "<name>" is invalid: <field>: <message>, ...`."""
    text = ", ".join(f"{field}: {message}" for field, message in causes)
    error = ApiError(422, "Invalid", f'{kind} "{name}" is invalid: {text}')
    error.details = {
        "name": name,
        "kind": kind.lower() + "s",
        "causes": [{"reason": reason, "message": message, "field": field} for field, message in causes],
    }
    return error


def check_schema(obj: dict[str, Any]) -> None:
    kind, api_version = obj.get("kind", ""), obj.get("apiVersion", "")
    validator = _validator(kind, api_version)
    if validator is None:
        return
    errors = sorted(validator.iter_errors(obj), key=lambda e: list(e.absolute_path))
    if not errors:
        return
    name = (obj.get("metadata") or {}).get("name", "")
    unknown = [e for e in errors if e.validator in ("additionalProperties", "unevaluatedProperties")]
    if unknown:
        extra = re.findall(r"'([^']+)' (?:was|were) unexpected", unknown[0].message) or [unknown[0].message]
        where = _field(unknown[0].absolute_path)
        raise ApiError(
            400, "BadRequest", f'strict decoding error: unknown field "{where + "." if where else ""}{extra[0]}"'
        )
    typed = [e for e in errors if e.validator == "type"]
    if typed:
        where = _field(typed[0].absolute_path)
        raise ApiError(
            400,
            "BadRequest",
            f'{kind} in version "{api_version}" cannot be handled as a {kind}: json: cannot unmarshal '
            f"{type(typed[0].instance).__name__} into Go struct field {where} of type {typed[0].validator_value}",
        )
    raise invalid(kind, name, [(_field(e.absolute_path), e.message) for e in errors[:10]])


def check_metadata(obj: dict[str, Any]) -> None:
    """Names, label keys and values, annotation keys."""
    kind = obj.get("kind", "")
    meta = obj.get("metadata") or {}
    name = meta.get("name", "")
    causes: list[tuple[str, str]] = []
    pattern = LABEL_NAMED.get(kind, DNS_1123_SUBDOMAIN)
    limit = 63 if kind in LABEL_NAMED else 253
    if not name:
        causes.append(("metadata.name", "Required value: name or generateName is required"))
    elif len(name) > limit or not pattern.match(name):
        causes.append(
            ("metadata.name", f'Invalid value: "{name}": a lowercase RFC 1123 name must match {pattern.pattern}')
        )
    for key, value in (meta.get("labels") or {}).items():
        causes += _key_causes("metadata.labels", key)
        if not isinstance(value, str) or len(value) > 63 or not LABEL_VALUE.match(value):
            causes.append(("metadata.labels", f'Invalid value: "{value}": a valid label must be 63 characters or less'))
    for key in meta.get("annotations") or {}:
        causes += _key_causes("metadata.annotations", key)
    template = ((obj.get("spec") or {}).get("template") or {}).get("metadata") or {}
    for key, value in (template.get("labels") or {}).items():
        causes += _key_causes("spec.template.metadata.labels", key)
        if not isinstance(value, str) or len(value) > 63 or not LABEL_VALUE.match(value):
            causes.append(("spec.template.metadata.labels", f'Invalid value: "{value}"'))
    if causes:
        raise invalid(kind, name, causes)


def _key_causes(field: str, key: str) -> list[tuple[str, str]]:
    prefix, _, rest = key.rpartition("/")
    if (
        (prefix and (len(prefix) > 253 or not DNS_1123_SUBDOMAIN.match(prefix)))
        or len(rest) > 63
        or not QUALIFIED_NAME.match(rest)
    ):
        return [(field, f'Invalid value: "{key}": name part must consist of alphanumeric characters, -, _ or .')]
    return []


# field paths that may not change once an object exists, by plural
IMMUTABLE: dict[str, tuple[tuple[str, ...], ...]] = {
    "jobs": (
        ("spec", "selector"),
        ("spec", "completionMode"),
        ("spec", "completions"),
        ("spec", "podFailurePolicy"),
        ("spec", "template"),
    ),
    "services": (("spec", "clusterIP"),),
}
# what stays mutable of a suspended Job's pod template that never started (Kueue writes these on admission)
SUSPENDED_TEMPLATE_MUTABLE = ("nodeSelector", "tolerations", "affinity", "schedulingGates")


def _at(obj: Any, path: tuple[str, ...]) -> Any:
    for part in path:
        obj = obj.get(part) if isinstance(obj, dict) else None
    return obj


def check_update(plural: str, old: dict[str, Any], new: dict[str, Any]) -> None:
    """Immutable fields keep their values."""
    kind = old.get("kind", plural)
    name = old["metadata"]["name"]
    causes: list[tuple[str, str]] = []
    for path in IMMUTABLE.get(plural, ()):
        before, after = _at(old, path), _at(new, path)
        if path[-1] == "template" and _suspended_never_started(old):
            before, after = _without_scheduling(before), _without_scheduling(after)
        if before != after:
            causes.append((".".join(path), "Invalid value: field is immutable"))
    if plural == "pods":
        causes += _pod_update_causes(old, new)
    if plural == "secrets" and old.get("immutable") and old.get("data") != new.get("data"):
        causes.append(("data", "Forbidden: field is immutable when `immutable` is set"))
    if causes:
        raise invalid(kind, name, causes)


def _suspended_never_started(job: dict[str, Any]) -> bool:
    return bool((job.get("spec") or {}).get("suspend")) and not (job.get("status") or {}).get("startTime")


def _without_scheduling(template: Any) -> Any:
    if not isinstance(template, dict):
        return template
    spec = {k: v for k, v in (template.get("spec") or {}).items() if k not in SUSPENDED_TEMPLATE_MUTABLE}
    meta = {k: v for k, v in (template.get("metadata") or {}).items() if k not in ("labels", "annotations")}
    return {**template, "spec": spec, "metadata": meta}


def _pod_update_causes(old: dict[str, Any], new: dict[str, Any]) -> list[tuple[str, str]]:
    """A pod's spec may change only in its containers' images, its activeDeadlineSeconds and added tolerations."""

    def comparable(spec: dict[str, Any]) -> dict[str, Any]:
        spec = dict(spec or {})
        spec["containers"] = [{k: v for k, v in c.items() if k != "image"} for c in spec.get("containers") or []]
        for key in ("activeDeadlineSeconds", "tolerations", "nodeName"):
            spec.pop(key, None)
        return spec

    if comparable(old.get("spec") or {}) != comparable(new.get("spec") or {}):
        return [
            (
                "spec",
                "Forbidden: pod updates may not change fields other than `spec.containers[*].image`, "
                "`spec.activeDeadlineSeconds`, `spec.tolerations` (only additions to existing tolerations)",
            )
        ]
    return []


def check(obj: dict[str, Any]) -> None:
    """Everything a create checks."""
    check_schema(obj)
    check_metadata(obj)
