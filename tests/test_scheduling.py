"""The suite's order for work-stealing workers: every worker starts with its share of the slow tests."""

from __future__ import annotations

from tests.support.scheduling import deal


def test_slow_modules_are_dealt_whole_to_the_lightest_share_and_shares_are_equal() -> None:
    slow = [f"e2e_a::{i}" for i in range(4)] + [f"e2e_b::{i}" for i in range(2)] + ["e2e_c::0", "e2e_d::0"]
    fast = [f"unit::{i}" for i in range(40)]
    items = fast[:20] + slow + fast[20:]
    ordered = deal(items, 4, lambda t: t.startswith("e2e"), lambda t: t.split("::")[0])
    assert sorted(ordered) == sorted(items)
    shares = [ordered[i * 12 : (i + 1) * 12] for i in range(4)]
    heads = [[t for t in share if t.startswith("e2e")] for share in shares]
    assert heads == [slow[:4], slow[4:6], ["e2e_c::0"], ["e2e_d::0"]]
    assert all(share[: len(head)] == head for share, head in zip(shares, heads, strict=True))  # slow ones first


def test_without_workers_the_order_is_kept() -> None:
    items = ["b", "a", "c"]
    assert deal(items, 0, lambda t: t == "a", lambda t: t) == items


def test_one_slow_module_alone_leaves_the_other_shares_empty() -> None:
    items = ["e2e_a::0", "e2e_a::1", "e2e_a::2"]  # e.g. `pytest -n 3` of one end-to-end module
    assert deal(items, 3, lambda t: True, lambda t: t.split("::")[0]) == items
