"""The one settings object: every configuration variable of the control plane (12-factor)."""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path
from typing import Literal
from urllib.parse import urlsplit

from pydantic import Field, SecretStr, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict


def port_range(text: str) -> tuple[int, int]:
    """`29500-29999` -> (29500, 29999); ValueError naming what is wrong."""
    first, sep, last = text.partition("-")
    try:
        bounds = (int(first), int(last if sep else first))
    except ValueError:
        raise ValueError(f"{text!r} is not a port range such as 29500-29999") from None
    if not 1024 <= bounds[0] < bounds[1] <= 65535:
        raise ValueError(f"{text!r}: the range must lie within 1024-65535, its first port first, two ports at least")
    return bounds


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="FTPLANE_", extra="ignore")

    data_dir: Path = Field(default=Path(".ftplane"), description="Embedded state: SQLite, broker, local job runs.")
    database_url: str | None = Field(default=None, description="SQLAlchemy URL; default SQLite under data_dir.")
    redis_url: str | None = Field(default=None, description="Celery broker and results; default: embedded broker.")
    queue: str = Field(default="ftplane", description="Celery queue name (several control planes may share Redis).")
    host: str = Field(default="127.0.0.1", description="Address `ftplane serve` listens on.")
    port: int = Field(default=8000, ge=1, le=65535)
    public_url: str | None = Field(
        default=None, description="URL trainers use to reach the API; default http://HOST:PORT."
    )
    auth: Literal["enabled", "disabled"] | None = Field(
        default=None, description="Default: enabled; `disabled` is refused on a non-loopback host."
    )
    max_body_bytes: int = Field(default=8 * 1024 * 1024, ge=1024)
    supervise_interval_s: float = Field(default=2.0, gt=0)
    fleet_interval_s: float = Field(
        default=10.0,
        gt=0,
        le=3600,
        description="Period of the fleet's duties (node reputation, goodput summaries, objectives): they keep "
        "ledgers across jobs, which need not follow each job at the supervision period.",
    )
    local_runs_dir: Path | None = Field(default=None, description="Local backend run state; default data_dir/runs.")
    local_ports: str = Field(
        default="29500-29999",
        description="Ports the local backend draws its jobs' rendezvous ports from (first-last), below the kernel's "
        "ephemeral range so that no outgoing connection takes one before the job's launcher binds it.",
    )
    kube_context: str | None = Field(default=None, description="kubeconfig context; in-cluster config when unset.")
    kube_in_cluster: bool | None = Field(default=None, description="Force in-cluster config (default: auto).")
    kube_unhealthy_nodes: Literal["off", "cordon", "taint"] = Field(
        default="off",
        description="What the kubernetes backend does to a node it blamed: nothing, cordon it, or taint it "
        "ftplane.dev/unhealthy:NoSchedule (needs deploy/kustomize/components/node-remediation).",
    )
    webhook_allow_private: bool = Field(
        default=False, description="Allow webhook targets in loopback, private and link-local ranges."
    )
    webhook_timeout_s: float = Field(default=5.0, gt=0, le=60)
    log_level: str = "INFO"
    access_log: bool = Field(
        default=False, description="Log every request (uvicorn's access log); off: a 2,048-node job makes 256 a second."
    )
    log_format: Literal["json", "text"] = "text"
    db_pool_size: int = Field(default=10, ge=1)
    ingest_rate_per_s: float = Field(
        default=32768,
        ge=0,
        description="Requests/s per token on each ingest endpoint (events, heartbeats); 0 turns limits off.",
    )
    ingest_burst: int = Field(default=65536, ge=1, description="Requests a token may send at once per ingest endpoint.")
    auth_cache_ttl_s: float = Field(
        default=5.0,
        ge=0,
        le=300,
        description="How long a node report's token is trusted without asking the database again: a revoked "
        "token stops working within this long on the report route. 0: always ask.",
    )
    report_max_wait_s: float = Field(
        default=1.0,
        gt=0,
        le=60,
        description="A node report that waited longer than this for the API's turn is refused at once with 503 and "
        "Retry-After, unread (api/services/ingest/lateness.py): under a burst past what the API answers within the "
        "agents' 5 s, it spends microseconds on such a report instead of working on one whose agent may have given up.",
    )
    liveness_flush_s: float = Field(
        default=0.1,
        ge=0,
        le=5,
        description="Node reports' liveness (soft state) is written in one statement this often per API process; "
        "0: written with each report.",
    )
    logs_url_template: str | None = Field(
        default=None,
        description="A link to the cluster's own log store returned with a job's logs (a CloudWatch or Grafana Loki "
        "query), with {job}, {attempt}, {namespace}, {node}, {rank} and {pod} filled in: where pods are gone, their "
        "lines are there.",
    )
    logs_follow_max_s: float = Field(
        default=3600, gt=0, description="How long GET /v1/jobs/{id}/logs?follow=true streams at most."
    )
    logs_keepalive_s: float = Field(
        default=15, gt=0, le=300, description="A following logs response sends a keep-alive when silent this long."
    )
    metrics_token: SecretStr | None = Field(
        default=None,
        description="When set, /metrics asks for `Authorization: Bearer <it>` (Prometheus: `authorization: "
        "{credentials_file: ...}`); unset, /metrics is open, like most exporters.",
    )
    # The fleet's goodput (api/services/fleet/ states the rules).
    gpu_hour_price: str | None = Field(
        default=None,
        description="What a GPU-hour costs: a number (2.5), or per value of one label (team=a:3.0,team=b:2.0, "
        "with *:2.5 for the rest); fleet goodput then gives its figures in money too.",
    )
    goodput_refresh_s: float = Field(
        default=60, gt=0, le=86400, description="A running job's fleet summary is recomputed at least this often."
    )
    goodput_settle_s: float = Field(
        default=30, gt=0, le=3600, description="How long the summarizer allows an event's transaction to commit."
    )
    goodput_batch: int = Field(default=200, ge=1, le=100_000, description="Jobs the summarizer handles per pass.")
    objective_interval_s: float = Field(
        default=60, gt=0, le=86400, description="Each ETTR objective is evaluated at most this often."
    )
    goodput_metric_labels: str = Field(
        default="team",
        max_length=2048,
        description="Label keys (comma-separated) of the lost GPU-seconds counters on /metrics.",
    )

    @field_validator("local_ports")
    @classmethod
    def _ports_read(cls, value: str) -> str:
        port_range(value)  # a wrong range stops the start with what is wrong
        return value

    @field_validator("gpu_hour_price")
    @classmethod
    def _price_reads(cls, value: str | None) -> str | None:
        from api.services.fleet.pricing import parse

        parse(value)  # a wrong price stops the start with what is wrong
        return value

    oidc_issuer: str | None = Field(
        default=None,
        description="The identity provider's issuer URL: when set, bearer JWTs it signs are accepted beside tokens "
        "(keys from its discovery document's jwks_uri). https, or http on a loopback host only.",
    )
    oidc_audience: str | None = Field(default=None, description="The `aud` JWTs must carry (this API's).")
    oidc_groups_claim: str = Field(
        default="groups", description="The claim listing the caller's groups, which role bindings map to roles."
    )
    oidc_cluster_admin_group: str | None = Field(
        default=None, description="Callers whose JWT lists this group are cluster admins."
    )
    oidc_client_id: str | None = Field(
        default=None,
        description="The dashboard's OIDC client: when set, the dashboard signs people in through "
        "the provider (authorization code with PKCE).",
    )
    oidc_client_secret: SecretStr | None = Field(default=None, description="The dashboard client's secret, if any.")
    oidc_scopes: str = Field(default="openid profile email", description="Scopes the dashboard asks for.")
    oidc_leeway_s: float = Field(default=30, ge=0, le=300, description="Clock skew allowed on exp, nbf and iat.")
    oidc_keys_ttl_s: float = Field(
        default=3600, gt=0, description="How long the provider's keys are used before they are fetched again."
    )
    oidc_key_refresh_s: float = Field(
        default=30,
        ge=0,
        description="A JWT signed with a key id not in the cached keys fetches them again at most this often "
        "(a rotated key is picked up; made-up key ids cost the provider nothing).",
    )
    # The node reputation rule (api/services/node_reputation/rule.py states it).
    node_quarantine_jobs: int = Field(
        default=2,
        ge=0,
        le=1000,
        description="A node is quarantined when faults blamed on it within the window come from this many "
        "different jobs (0: never quarantined).",
    )
    node_fault_window_s: float = Field(default=86400, gt=0, le=365 * 86400, description="The window, in seconds.")
    node_quarantine_s: float = Field(
        default=86400, gt=0, le=365 * 86400, description="How long a quarantine lasts unless released sooner."
    )

    @model_validator(mode="after")
    def _oidc_complete(self) -> Settings:
        if self.oidc_issuer is not None:
            url = urlsplit(self.oidc_issuer)
            loopback = url.hostname in ("127.0.0.1", "::1", "localhost")
            if url.scheme != "https" and not (url.scheme == "http" and loopback):
                raise ValueError("FTPLANE_OIDC_ISSUER must be an https URL (http only on a loopback host)")
            if not self.oidc_audience:
                raise ValueError("FTPLANE_OIDC_AUDIENCE is required with FTPLANE_OIDC_ISSUER")
        elif self.oidc_client_id is not None:
            raise ValueError("FTPLANE_OIDC_CLIENT_ID needs FTPLANE_OIDC_ISSUER")
        return self

    @property
    def oidc_enabled(self) -> bool:
        return self.oidc_issuer is not None

    @property
    def resolved_database_url(self) -> str:
        if self.database_url:
            return self.database_url
        return f"sqlite:///{(self.data_dir / 'ftplane.db').resolve()}"

    @property
    def resolved_public_url(self) -> str:
        if self.public_url:
            return self.public_url.rstrip("/")
        host = "127.0.0.1" if self.host in ("0.0.0.0", "::") else self.host
        return f"http://{host}:{self.port}"

    @property
    def local_port_range(self) -> tuple[int, int]:
        return port_range(self.local_ports)

    @property
    def resolved_runs_dir(self) -> Path:
        return (self.local_runs_dir or self.data_dir / "runs").resolve()

    @property
    def auth_enabled(self) -> bool:
        return self.auth != "disabled"


@lru_cache
def get_settings() -> Settings:
    return Settings()
