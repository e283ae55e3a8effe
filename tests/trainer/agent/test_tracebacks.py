"""The exception a rank died of, read from its last lines."""

from __future__ import annotations

from ftplane.trainer.agent.tracebacks import exception_in

TRACEBACK = [
    "step 3 loss 0.1",
    "Traceback (most recent call last):",
    '  File "train.py", line 12, in <module>',
    "    main()",
    '  File "train.py", line 9, in main',
    '    raise ValueError("learning rate must be positive")',
    "ValueError: learning rate must be positive",
]


def test_the_exception_line_of_the_newest_traceback() -> None:
    assert exception_in(TRACEBACK) == "ValueError: learning rate must be positive"
    chained = [*TRACEBACK, "", "During handling of the above exception, another exception occurred:", ""]
    chained += ["Traceback (most recent call last):", '  File "x.py", line 1', "KeyError: 'lr'"]
    assert exception_in(chained) == "KeyError: 'lr'"


def test_qualified_and_bare_names_and_an_interleaved_stdout_line() -> None:
    lines = ["Traceback (most recent call last):", '  File "t.py", line 2', "loss: 0.5"]
    lines.append("torch.distributed.DistBackendError: NCCL error in: ...")
    assert exception_in(lines) == "torch.distributed.DistBackendError: NCCL error in: ..."
    assert exception_in(["Traceback (most recent call last):", '  File "t.py"', "KeyboardInterrupt"]) == (
        "KeyboardInterrupt"
    )


def test_a_cut_off_traceback_still_names_its_exception_and_plain_output_names_none() -> None:
    assert exception_in(['    raise RuntimeError("boom")', "RuntimeError: boom"]) == "RuntimeError: boom"
    assert exception_in(["step 1", "step 2", "done: ok"]) is None
    assert exception_in([]) is None


def test_torch_distributeds_rank_prefix_is_read_past() -> None:
    """Once a process group exists, torch.distributed's exception hook prints `[rank1]: ` before every line
    (captured/gloo-peer-exited.log)."""
    lines = ["step 3", *(f"[rank1]: {line}" for line in TRACEBACK[1:])]
    assert exception_in(lines) == "ValueError: learning rate must be positive"
