"""Configuration: defaults, the control plane's FTPLANE_* variables, flags over both, and errors that name
what was wrong."""

from __future__ import annotations

import json

import pytest

from ftplane.trainer.config import MODEL_PRESETS, ConfigError, parse_config


def test_defaults_run_standalone() -> None:
    cfg = parse_config([], {})
    assert (cfg.model, cfg.checkpoint_engine, cfg.inprocess, cfg.checkpoint_dir) == ("tiny", "sync", False, None)
    assert cfg.model_args == MODEL_PRESETS["tiny"]


def test_what_says_who_reports_is_the_sdks_to_read() -> None:
    """Job, attempt, agent socket and faults are read by trainer/sdk; the token reaches no rank."""
    fields = {f for f in vars(parse_config([], {}))}
    assert not fields & {"url", "token", "job_id", "attempt", "faults", "report_interval_s"}


def test_control_plane_environment_is_read() -> None:
    env = {
        "FTPLANE_URL": "http://cp:8000",
        "FTPLANE_JOB_ID": "j-1",
        "FTPLANE_ATTEMPT": "2",
        "FTPLANE_TOKEN": "s3cret",
        "FTPLANE_CHECKPOINT_ENGINE": "async",
        "FTPLANE_CHECKPOINT_INTERVAL": "50",
        "FTPLANE_CHECKPOINT_KEEP": "3",
        "FTPLANE_CHECKPOINT_DIR": "/ckpt/j-1",
        "FTPLANE_INPROCESS": "1",
        "FTPLANE_INPROCESS_SOFT_TIMEOUT_S": "20",
        "FTPLANE_INPROCESS_HARD_TIMEOUT_S": "30.5",
        "FTPLANE_INPROCESS_MAX_ITERATIONS": "4",
        "FTPLANE_FAULTS": json.dumps([{"kind": "hang", "rank": 3, "at_step": 7}]),
        "FTPLANE_MASTER_ADDR": "10.0.0.5",
    }
    cfg = parse_config([], env)
    assert (cfg.checkpoint_engine, cfg.checkpoint_interval, cfg.checkpoint_keep) == ("async", 50, 3)
    assert cfg.checkpoint_dir == "/ckpt/j-1" and cfg.master_addr == "10.0.0.5"
    assert cfg.inprocess is True
    assert (cfg.inprocess_soft_timeout_s, cfg.inprocess_hard_timeout_s, cfg.inprocess_max_iterations) == (20, 30.5, 4)
    assert "s3cret" not in repr(cfg)


def test_flags_override_the_environment() -> None:
    env = {"FTPLANE_CHECKPOINT_ENGINE": "async", "FTPLANE_INPROCESS": "1", "FTPLANE_CHECKPOINT_INTERVAL": "50"}
    cfg = parse_config(["--checkpoint-engine", "none", "--inprocess", "0", "--steps", "7", "--model", "small"], env)
    assert (cfg.checkpoint_engine, cfg.inprocess, cfg.steps) == ("none", False, 7)
    assert cfg.checkpoint_interval == 50 and cfg.model == "small"


def test_empty_variables_mean_unset() -> None:
    cfg = parse_config([], {"FTPLANE_CHECKPOINT_DIR": "", "FTPLANE_COLLECTIVE_TIMEOUT_S": ""})
    assert cfg.checkpoint_dir is None and cfg.collective_timeout_s is None


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"FTPLANE_CHECKPOINT_ENGINE": "fast"}, "FTPLANE_CHECKPOINT_ENGINE"),
        ({"FTPLANE_CHECKPOINT_INTERVAL": "often"}, "FTPLANE_CHECKPOINT_INTERVAL"),
        ({"FTPLANE_CHECKPOINT_KEEP": "0"}, "checkpoint_keep"),
        ({"FTPLANE_INPROCESS": "maybe"}, "FTPLANE_INPROCESS"),
        ({"FTPLANE_INPROCESS_SOFT_TIMEOUT_S": "90"}, "less than inprocess_hard_timeout_s"),
    ],
)
def test_invalid_settings_say_what_is_wrong(env: dict[str, str], message: str) -> None:
    with pytest.raises(ConfigError, match=message.replace("[", r"\[").replace("(", r"\(").replace(")", r"\)")):
        parse_config([], env)


def test_bad_flag_exits_with_usage(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        parse_config(["--steps", "many"], {})
    assert exc.value.code == 2
    assert "--steps 'many'" in capsys.readouterr().err


def test_unknown_model_is_refused() -> None:
    with pytest.raises(ConfigError, match="model: 'huge' is not one of tiny, small, medium, large"):
        parse_config(["--model", "huge"], {})
