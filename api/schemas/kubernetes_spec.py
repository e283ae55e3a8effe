"""The parts of the job spec that only the kubernetes backend reads: where the pods may run (`scheduling`),
environment variables taken from Secrets (`secret_env`; the local backend takes them from the host's
environment), and the Kueue queue (`queue`).

Field names are ftplane's (snake_case), not the Kubernetes API's: `toleration_seconds`, not
`tolerationSeconds`. Every value is checked here as strictly as the API server would check it, so a
spec that passes is one Kubernetes accepts; a mistake is a 422 naming the field, not a launch failure.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StringConstraints, model_validator


def keys_match_pattern(schema: dict[str, Any]) -> None:
    """Document a dict whose keys have a pattern as validated: every key must match it.

    pydantic writes the key pattern as `patternProperties`, which in JSON Schema lets keys that
    do not match through with any value; `propertyNames` says what the API actually accepts.
    """
    if len(schema.get("patternProperties", {})) != 1:
        return
    ((pattern, value),) = schema.pop("patternProperties").items()
    schema["propertyNames"] = {**schema.get("propertyNames", {}), "pattern": pattern}
    schema["additionalProperties"] = value


# Kubernetes' own syntax for names and labels.
DNS_SUBDOMAIN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
QUALIFIED_NAME = r"^([a-z0-9]([-a-z0-9.]*[a-z0-9])?/)?[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$"
LABEL_VALUE = r"^([A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?)?$"
SECRET_KEY = r"^[-._a-zA-Z0-9]+$"
INTEGER = r"^-?[0-9]+$"

DnsSubdomain = Annotated[str, StringConstraints(min_length=1, max_length=253, pattern=DNS_SUBDOMAIN)]
QualifiedName = Annotated[str, StringConstraints(min_length=1, max_length=316, pattern=QUALIFIED_NAME)]
LabelValue = Annotated[str, StringConstraints(max_length=63, pattern=LABEL_VALUE)]
# A LocalQueue's name travels as a label value: a DNS subdomain of at most 63 characters.
QueueName = Annotated[str, StringConstraints(min_length=1, max_length=63, pattern=DNS_SUBDOMAIN)]

# Keys on the pods that ftplane writes itself; a spec may not set them.
RESERVED_KEY_PREFIXES = ("ftplane.io/", "batch.kubernetes.io/", "kueue.x-k8s.io/")
DO_NOT_DISRUPT = "karpenter.sh/do-not-disrupt"
ZONE_LABEL = "topology.kubernetes.io/zone"
MAX_ANNOTATIONS_BYTES = 128 * 1024  # the API server allows 256 KiB on an object; ftplane adds its own
HugePageSize = Literal["2Mi", "1Gi"]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


def _qualified_name_parts_fit(key: str) -> None:
    """A qualified name's prefix is a DNS subdomain (<= 253) and its name at most 63 characters."""
    prefix, _, name = key.rpartition("/")
    if len(name) > 63:
        raise ValueError(f"{key!r}: the name after the prefix must be at most 63 characters")
    if len(prefix) > 253:
        raise ValueError(f"{key!r}: the prefix must be at most 253 characters")


class Toleration(_Strict):
    """Lets the pods onto nodes with a matching taint (Kubernetes' `tolerations[]`)."""

    key: QualifiedName | None = Field(default=None, description="The taint key; none with Exists: every taint.")
    operator: Literal["Equal", "Exists"] = "Equal"
    value: LabelValue | None = Field(default=None, description="The taint value (operator Equal only).")
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"] | None = Field(
        default=None, description="The taint effect to tolerate; none: every effect."
    )
    toleration_seconds: int | None = Field(
        default=None,
        ge=0,
        le=10**9,
        description="How long a NoExecute taint is tolerated before the pod is evicted (effect NoExecute only).",
    )

    @model_validator(mode="after")
    def _consistent(self) -> Toleration:
        if self.key is not None:
            _qualified_name_parts_fit(self.key)
        if self.operator == "Exists" and self.value:
            raise ValueError("value must be empty when operator is Exists")
        if self.operator == "Equal" and self.key is None:
            raise ValueError("key is required when operator is Equal (use operator Exists to tolerate every taint)")
        if self.toleration_seconds is not None and self.effect != "NoExecute":
            raise ValueError("toleration_seconds is only allowed with effect NoExecute")
        return self

    def manifest(self) -> dict[str, Any]:
        out: dict[str, Any] = {"operator": self.operator}
        if self.key is not None:
            out["key"] = self.key
        if self.value:
            out["value"] = self.value
        if self.effect:
            out["effect"] = self.effect
        if self.toleration_seconds is not None:
            out["tolerationSeconds"] = self.toleration_seconds
        return out


class NodeRequirement(_Strict):
    """One required node-affinity requirement on a node label (all of a spec's requirements must hold)."""

    key: QualifiedName
    operator: Literal["In", "NotIn", "Exists", "DoesNotExist", "Gt", "Lt"]
    values: list[LabelValue] = Field(default_factory=list, max_length=256)

    @model_validator(mode="after")
    def _values_fit_the_operator(self) -> NodeRequirement:
        _qualified_name_parts_fit(self.key)
        if self.operator in ("In", "NotIn") and not self.values:
            raise ValueError(f"operator {self.operator} needs at least one value")
        if self.operator in ("Exists", "DoesNotExist") and self.values:
            raise ValueError(f"operator {self.operator} takes no values")
        if self.operator in ("Gt", "Lt") and (len(self.values) != 1 or not _is_integer(self.values[0])):
            raise ValueError(f"operator {self.operator} needs exactly one value, an integer")
        return self

    def manifest(self) -> dict[str, Any]:
        out: dict[str, Any] = {"key": self.key, "operator": self.operator}
        if self.values:
            out["values"] = list(self.values)
        return out


def _is_integer(text: str) -> bool:
    return re.fullmatch(INTEGER, text) is not None


class SchedulingSpec(_Strict):
    """Where the pods may run and as whom (kubernetes)."""

    tolerations: list[Toleration] = Field(
        default_factory=list,
        max_length=32,
        description="Taints the pods tolerate, besides nvidia.com/gpu (tolerated by GPU pods) and the short "
        "not-ready/unreachable tolerations ftplane adds.",
    )
    node_selector: dict[QualifiedName, LabelValue] = Field(
        default_factory=dict,
        max_length=32,
        description="Node labels the pods require.",
        json_schema_extra=keys_match_pattern,
    )
    zone: LabelValue | None = Field(
        default=None,
        min_length=1,
        description=f"The Availability Zone every pod runs in ({ZONE_LABEL}); EFA traffic stays within one zone.",
    )
    affinity: list[NodeRequirement] = Field(
        default_factory=list,
        max_length=32,
        description="Required node-affinity requirements on node labels; every one must hold.",
    )
    priority_class: DnsSubdomain | None = Field(default=None, description="The pods' PriorityClass.")
    service_account: DnsSubdomain | None = Field(
        default=None, description="The pods' ServiceAccount (EKS Pod Identity or IRSA give it AWS credentials)."
    )
    annotations: dict[QualifiedName, Annotated[str, StringConstraints(max_length=16384)]] = Field(
        default_factory=dict,
        max_length=64,
        description="Annotations on the pods.",
        json_schema_extra=keys_match_pattern,
    )
    image_pull_secrets: list[DnsSubdomain] = Field(
        default_factory=list, max_length=16, description="Secrets (in the job's namespace) to pull the image with."
    )

    @model_validator(mode="after")
    def _consistent(self) -> SchedulingSpec:
        for key in [*self.node_selector, *self.annotations]:
            _qualified_name_parts_fit(key)
        for key in self.annotations:
            if key.startswith(RESERVED_KEY_PREFIXES) or key == DO_NOT_DISRUPT:
                raise ValueError(f"annotations.{key}: set by ftplane on every pod, a spec may not set it")
        if sum(len(k) + len(v) for k, v in self.annotations.items()) > MAX_ANNOTATIONS_BYTES:
            raise ValueError(f"annotations: at most {MAX_ANNOTATIONS_BYTES} bytes of keys and values in all")
        if self.zone and ZONE_LABEL in self.node_selector:
            raise ValueError(f"give the zone once: zone, or node_selector.{ZONE_LABEL}, not both")
        if len(set(self.image_pull_secrets)) != len(self.image_pull_secrets):
            raise ValueError("image_pull_secrets: each Secret once")
        return self

    def pinned_zone(self) -> str | None:
        """The one Availability Zone the pods are held to (zone, the node selector, or an affinity of one value)."""
        if self.zone or self.node_selector.get(ZONE_LABEL):
            return self.zone or self.node_selector[ZONE_LABEL]
        for req in self.affinity:
            if req.key == ZONE_LABEL and req.operator == "In" and len(req.values) == 1:
                return req.values[0]
        return None

    def node_labels(self) -> dict[str, str]:
        """The node selector the pods get: the spec's labels and its zone."""
        labels = dict(self.node_selector)
        if self.zone:
            labels[ZONE_LABEL] = self.zone
        return labels


class SecretKeyRef(_Strict):
    """An environment variable's value taken from a key of a Secret in the job's namespace, by reference:
    ftplane stores and renders the reference only, never the value."""

    secret: DnsSubdomain = Field(description="The Secret's name.")
    key: Annotated[str, StringConstraints(min_length=1, max_length=253, pattern=SECRET_KEY)] = Field(
        description="The key in the Secret."
    )
    optional: bool = Field(default=False, description="Start the pods even when the Secret or key is missing.")


def check_hugepages(hugepages: Mapping[HugePageSize, str], cpu: str | None, memory: str | None) -> None:
    """Kubernetes requires a cpu or memory request next to hugepages."""
    if hugepages and not (cpu or memory):
        raise ValueError("resources.hugepages needs resources.cpu or resources.memory as well (Kubernetes requires it)")


def kubernetes_only_fields(spec: Any) -> list[str]:
    """The fields of a JobSpec set away from their defaults that only the kubernetes backend can honour."""
    used = []
    if spec.scheduling != SchedulingSpec():
        used.append("scheduling")
    if spec.queue:
        used.append("queue")
    if spec.resiliency.spare_nodes:
        used.append("resiliency.spare_nodes")
    if spec.resources.hugepages:
        used.append("resources.hugepages")
    return used
