"""Which webhook targets are allowed: no loopback, private or link-local address unless configured."""

from __future__ import annotations

import ipaddress

import pytest

from api.webhooks import targets


@pytest.mark.parametrize(
    "address",
    [
        "127.0.0.1",
        "10.1.2.3",
        "172.16.0.1",
        "192.168.1.1",
        "169.254.169.254",  # cloud metadata service
        "100.64.0.1",  # shared address space (CGNAT)
        "0.0.0.0",
        "::1",
        "fe80::1",
        "fc00::1",
        "::ffff:127.0.0.1",
        "::ffff:10.0.0.1",
        "224.0.0.1",
    ],
)
def test_non_public_addresses_are_refused(address: str) -> None:
    assert not targets.is_public(ipaddress.ip_address(address))
    host = f"[{address}]" if ":" in address else address
    with pytest.raises(targets.TargetRefused, match="loopback, private or link-local"):
        targets.validate(f"http://{host}/hook", allow_private=False)


@pytest.mark.parametrize("address", ["93.184.216.34", "2606:2800:220:1:248:1893:25c8:1946", "1.1.1.1"])
def test_public_addresses_are_allowed(address: str) -> None:
    assert targets.is_public(ipaddress.ip_address(address))
    host = f"[{address}]" if ":" in address else address
    assert targets.validate(f"https://{host}/hook", allow_private=False).host == address


def test_a_host_name_is_resolved_and_every_address_checked() -> None:
    with pytest.raises(targets.TargetRefused, match="localhost resolves to"):
        targets.validate("http://localhost:8080/hook", allow_private=False)


def test_private_targets_pass_when_allowed() -> None:
    assert targets.validate("http://127.0.0.1:9/hook", allow_private=True).port == 9


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("ftp://example.com/x", "http:// or https://"),
        ("example.com/hook", "http:// or https://"),
        ("http:///nohost", "no host"),
        ("https://user:pw@example.com/hook", "no credentials"),
        ("http://example.com:99999/", "not a valid URL"),
    ],
)
def test_malformed_urls_are_refused(url: str, message: str) -> None:
    with pytest.raises(targets.TargetRefused, match=message):
        targets.validate(url, allow_private=True)


def test_unresolvable_host_is_refused_with_advice() -> None:
    with pytest.raises(targets.TargetRefused, match="check the host name"):
        targets.validate("http://no-such-host.invalid/hook", allow_private=False)
