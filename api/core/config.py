"""The one settings object: every configuration variable of the control plane (12-factor)."""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path
from typing import Literal

from pydantic import Field, SecretStr
from pydantic_settings import BaseSettings, SettingsConfigDict


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
    local_runs_dir: Path | None = Field(default=None, description="Local backend run state; default data_dir/runs.")
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
    liveness_flush_s: float = Field(
        default=0.1,
        ge=0,
        le=5,
        description="Node reports' liveness (soft state) is written in one statement this often per API process; "
        "0: written with each report.",
    )
    metrics_token: SecretStr | None = Field(
        default=None,
        description="When set, /metrics asks for `Authorization: Bearer <it>` (Prometheus: `authorization: "
        "{credentials_file: ...}`); unset, /metrics is open, like most exporters.",
    )

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
    def resolved_runs_dir(self) -> Path:
        return (self.local_runs_dir or self.data_dir / "runs").resolve()

    @property
    def auth_enabled(self) -> bool:
        return self.auth != "disabled"


@lru_cache
def get_settings() -> Settings:
    return Settings()
