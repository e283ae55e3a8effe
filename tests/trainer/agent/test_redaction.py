"""What never leaves the node in a line: the job's token, the secret variables' values, ftplane tokens."""

from __future__ import annotations

from ftplane.trainer.agent.redaction import Redactor


def test_the_token_and_the_named_secrets_values_are_redacted() -> None:
    redact = Redactor.from_environment(
        {
            "FTPLANE_TOKEN": "ftp_job_own-token-value-xyz",
            "FTPLANE_SECRET_ENV": "HF_TOKEN, DB_PASSWORD,MISSING",
            "HF_TOKEN": "hf_abcdefghijklmnop",
            "DB_PASSWORD": "p4ss.w0rd(1)",  # regex characters are taken literally
            "NOT_SECRET": "visible-value",
        }
    )
    line = "hf=hf_abcdefghijklmnop db=p4ss.w0rd(1) own=ftp_job_own-token-value-xyz other=visible-value"
    assert redact(line) == "hf=*** db=*** own=*** other=visible-value"


def test_any_ftplane_token_is_redacted_and_short_values_are_left_alone() -> None:
    redact = Redactor.from_environment({"FTPLANE_SECRET_ENV": "PIN", "PIN": "12"})
    admin = "ftp_admin_" + "Zz9-_" * 9
    assert redact(f"Authorization: Bearer {admin}") == "Authorization: Bearer ***"
    assert redact("step 12 of 120") == "step 12 of 120"  # a 2-character secret would blank ordinary text


def test_the_agents_own_log_lines_are_redacted_too() -> None:
    import logging

    from ftplane.trainer.agent.redaction import RedactingFilter

    record = logging.LogRecord("agent", logging.INFO, __file__, 1, "reply was %s", ("ftp_job_" + "s" * 30,), None)
    assert RedactingFilter(Redactor()).filter(record) and record.getMessage() == "reply was ***"
