"""Authentication benchmark: a request authenticated by an OIDC JWT against the same request by a token.

A fresh database (PostgreSQL, or the embedded SQLite default), `uvicorn api.main:create_served_app` with
FTPLANE_OIDC_ISSUER pointing at an OpenID Connect provider on loopback (tests/support/oidc_issuer.py: its
keys are made here, discovery and JWKS served over HTTP), a project with a group binding, and a load
generator in a separate process (aiohttp, closed loop, keep-alive). Modes, one after the other against the
same server, each the same request (`GET /v1/projects/bench`: authentication, the project's role check, one
row read) but for its credential:

  healthz    GET /healthz: the baseline, what the cheapest request of this server costs
  token      an operator token of the project (a SHA-256 digest looked up in the database)
  jwt-rs256  a JWT signed RS256 (2048-bit key): signature, claims, the bindings of its groups
  jwt-es256  the same, ES256 (P-256)

Figures per mode: requests/s, p50/p99 latency, the API's CPU in cores and per request, and the ratio to
the token mode; and the provider's JWKS fetches during the measured modes, which must be none: the keys
are fetched once, when the server first sees a JWT (in the warm-up), and kept.

Usage: python -m bench.auth [--duration 15] [--concurrency 8] [--databases postgresql,sqlite]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import httpx
from sqlalchemy.engine import make_url

from bench.common import CpuMeter, create_admin_token, database_of_kind, machine, postgres_processes, table, uvicorn_api
from bench.load import Load, LoadResult, load_line, run_load
from tests.support.oidc_issuer import OidcIssuer

AUDIENCE = "ftplane-bench"
PROJECT = "bench"
MODES = ("healthz", "token", "jwt-rs256", "jwt-es256")


@dataclass
class Outcome:
    database: str
    mode: str
    load: LoadResult
    cpu: dict[str, float]
    jwks_fetches: int

    @property
    def requests_per_s(self) -> float:
        return len(self.load.latencies_ms) / self.load.elapsed_s

    @property
    def api_ms_per_request(self) -> float:
        return 1000 * self.cpu.get("api", 0.0) / self.requests_per_s if self.requests_per_s else 0.0


def credentials(url: str, admin: str, issuer: OidcIssuer) -> dict[str, str]:
    """The project, its binding, an operator token, and a JWT per algorithm for a member of the bound group."""
    api = httpx.Client(base_url=url, headers={"Authorization": f"Bearer {admin}"}, timeout=30)
    api.post("/v1/projects", json={"name": PROJECT}).raise_for_status()
    api.post(f"/v1/projects/{PROJECT}/bindings", json={"group": "bench-ops", "role": "operator"}).raise_for_status()
    made = api.post("/v1/tokens", json={"name": "bench", "project": PROJECT, "role": "operator"})
    made.raise_for_status()
    return {
        "healthz": made.json()["token"],
        "token": made.json()["token"],
        "jwt-rs256": issuer.token("bench-user", ["bench-ops"], alg="RS256", lifetime_s=3600),
        "jwt-es256": issuer.token("bench-user", ["bench-ops"], alg="ES256", lifetime_s=3600),
    }


def run_database(kind: str, args: argparse.Namespace) -> list[Outcome]:
    outcomes = []
    with (
        tempfile.TemporaryDirectory(prefix="ftplane-auth-") as tmp,
        OidcIssuer(audience=AUDIENCE) as issuer,
        database_of_kind(kind, args.database_url, Path(tmp)) as db,
    ):
        admin = create_admin_token(db)
        database = make_url(db).database if kind == "postgresql" else None
        env = {"FTPLANE_OIDC_ISSUER": issuer.url, "FTPLANE_OIDC_AUDIENCE": AUDIENCE}
        with uvicorn_api(db, Path(tmp), workers=args.workers, env=env) as server:
            tokens = credentials(server.url, admin, issuer)
            groups = {"api": server.processes}
            if database:
                groups["postgres"] = lambda: postgres_processes(database)
            meter = CpuMeter(groups)
            for mode in args.modes.split(","):
                path = "/healthz" if mode == "healthz" else f"/v1/projects/{PROJECT}"
                probe = httpx.get(server.url + path, headers={"Authorization": f"Bearer {tokens[mode]}"}, timeout=30)
                probe.raise_for_status()  # the credential works (and a JWT's keys are fetched now, once)
                fetched = issuer.jwks_requests
                load = Load(
                    url=server.url,
                    path=path,
                    token=tokens[mode],
                    templates=[b""],
                    concurrency=args.concurrency,
                    duration_s=args.duration,
                    max_requests=args.max_requests,
                    warmup_s=args.warmup,
                    method="GET",
                )
                result, cpu = run_load(load, meter)
                outcome = Outcome(kind, mode, result, cpu, issuer.jwks_requests - fetched)
                outcomes.append(outcome)
                line = load_line(f"{kind} / {mode}", outcome.requests_per_s, result, cpu)
                print(f"{line}, JWKS fetches {outcome.jwks_fetches}", flush=True)
                time.sleep(1)
    return outcomes


def report(outcomes: list[Outcome]) -> str:
    rows = []
    for o in outcomes:
        base = next((b for b in outcomes if b.database == o.database and b.mode == "token"), o)
        rows.append(
            [
                o.database,
                o.mode,
                f"{o.requests_per_s:,.0f}",
                f"{o.load.p(50):.1f}",
                f"{o.load.p(99):.1f}",
                f"{o.cpu.get('api', 0):.2f}",
                f"{o.api_ms_per_request:.2f}",
                f"{o.cpu.get('other', 0):.2f}",
                f"{o.requests_per_s / base.requests_per_s:.2f}" if base.requests_per_s else "—",
                o.jwks_fetches,
                o.load.errors,
            ]
        )
    header = ["database", "mode", "req/s", "p50 ms", "p99 ms", "API cores", "API ms/req", "other", "÷ token"]
    return table([*header, "JWKS fetches", "errors"], rows)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workers", type=int, default=1, help="uvicorn worker processes")
    parser.add_argument("--duration", type=float, default=15.0, help="seconds measured per mode")
    parser.add_argument("--warmup", type=float, default=2.0, help="seconds of unmeasured load before each mode")
    parser.add_argument("--max-requests", type=int, default=1_000_000, help="requests per mode, at most")
    parser.add_argument("--concurrency", type=int, default=8, help="connections, every mode")
    parser.add_argument("--modes", default=",".join(MODES))
    parser.add_argument("--databases", default="postgresql,sqlite")
    parser.add_argument("--database-url", default=None, help="PostgreSQL to create the bench database in")
    parser.add_argument("--json", type=Path, default=None, help="write the figures here too")
    args = parser.parse_args(argv)
    print(f"machine: {machine()}")
    outcomes: list[Outcome] = []
    for kind in args.databases.split(","):
        outcomes += run_database(kind, args)
    print()
    print(report(outcomes))
    if args.json:
        figures = [
            {
                "database": o.database,
                "mode": o.mode,
                "requests_per_s": o.requests_per_s,
                "p50_ms": o.load.p(50),
                "p99_ms": o.load.p(99),
                "api_ms_per_request": o.api_ms_per_request,
                "jwks_fetches": o.jwks_fetches,
                "errors": o.load.errors,
            }
            for o in outcomes
        ]
        args.json.write_text(json.dumps(figures, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
