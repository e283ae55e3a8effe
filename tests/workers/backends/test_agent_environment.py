"""What every backend tells the node agent about the job's secrets: the names of its `secret_env` (never their
values, which only the pod's environment holds), so that it redacts their values from every line it sends."""

from __future__ import annotations

from tests.workers.backends.kubernetes.k8s_support import make_request, make_spec
from workers.backends.base import agent_environment
from workers.backends.kubernetes import manifests as m


def test_the_agent_is_told_the_names_of_the_secret_variables_to_redact() -> None:
    spec = make_spec(
        secret_env={
            "HF_TOKEN": {"secret": "huggingface-token", "key": "token"},
            "WANDB_KEY": {"secret": "w", "key": "k"},
        }
    )
    assert agent_environment(make_request(spec))["FTPLANE_SECRET_ENV"] == "HF_TOKEN,WANDB_KEY"
    env = {e["name"]: e for e in m.job_manifest(make_request(spec))["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert env["FTPLANE_SECRET_ENV"]["value"] == "HF_TOKEN,WANDB_KEY" and "value" not in env["HF_TOKEN"]
    assert "FTPLANE_SECRET_ENV" not in agent_environment(make_request(make_spec()))
