"""Where webhooks may go, and the HTTP POST itself.

A target URL must be http(s) and, unless `FTPLANE_WEBHOOK_ALLOW_PRIVATE=true`, every address
its host resolves to must be public: loopback, private, link-local, shared (CGNAT), multicast
and reserved ranges are refused. The check runs when a subscription is made and again before
each delivery, and the request is sent to the very address that was checked (so a DNS answer
that changes in between cannot point the control plane at an internal service). Redirects are
not followed and every phase of the request has a timeout.
"""

from __future__ import annotations

import ipaddress
import logging
import socket
from contextvars import ContextVar
from dataclasses import dataclass
from urllib.parse import urlsplit

import httpx

IpAddress = ipaddress.IPv4Address | ipaddress.IPv6Address

MAX_ERROR_BODY = 200

# A target URL can be a secret itself (Slack's are): keep httpx from logging it with each request.
_posting: ContextVar[bool] = ContextVar("ftplane_webhook_posting", default=False)


class _HideWebhookRequests(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return not _posting.get()


logging.getLogger("httpx").addFilter(_HideWebhookRequests())


class TargetRefused(Exception):
    """The URL may not be used as a webhook target; the message says why and what to do."""


class TargetUnresolvable(Exception):
    """The host has no address right now (may be temporary)."""


@dataclass(frozen=True)
class Target:
    url: str
    scheme: str
    host: str
    port: int


@dataclass(frozen=True)
class PostResult:
    status_code: int | None
    error: str | None

    @property
    def ok(self) -> bool:
        return self.status_code is not None and 200 <= self.status_code < 300


def parse(url: str) -> Target:
    """Syntax only: http(s), a host, no credentials."""
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as exc:
        raise TargetRefused(f"{url!r} is not a valid URL: {exc}") from exc
    if parts.scheme not in ("http", "https"):
        raise TargetRefused("the URL must start with http:// or https://")
    if not parts.hostname:
        raise TargetRefused("the URL has no host")
    if parts.username is not None or parts.password is not None:
        raise TargetRefused("put no credentials in the URL; receivers authenticate the signature instead")
    default_port = 443 if parts.scheme == "https" else 80
    return Target(url=url, scheme=parts.scheme, host=parts.hostname, port=port or default_port)


def is_public(address: IpAddress) -> bool:
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped  # ::ffff:127.0.0.1 is loopback too
    return address.is_global and not address.is_multicast


def resolve(target: Target) -> list[IpAddress]:
    """Every address the host resolves to (an IP literal resolves to itself)."""
    try:
        return [ipaddress.ip_address(target.host)]
    except ValueError:
        pass
    try:
        infos = socket.getaddrinfo(target.host, target.port, type=socket.SOCK_STREAM)
    except (socket.gaierror, UnicodeError) as exc:
        raise TargetUnresolvable(f"cannot resolve {target.host!r}: {exc}") from exc
    out: list[IpAddress] = []
    for info in infos:
        address = ipaddress.ip_address(str(info[4][0]).split("%", 1)[0])
        if address not in out:
            out.append(address)
    if not out:
        raise TargetUnresolvable(f"{target.host!r} has no address")
    return out


def check(target: Target, *, allow_private: bool) -> list[IpAddress]:
    """The addresses to connect to; raises TargetRefused when any of them is not public."""
    addresses = resolve(target)
    if allow_private:
        return addresses
    for address in addresses:
        if not is_public(address):
            raise TargetRefused(
                f"{target.host} resolves to {address}, a loopback, private or link-local address; "
                "use a public receiver, or set FTPLANE_WEBHOOK_ALLOW_PRIVATE=true to allow receivers "
                "inside your network"
            )
    return addresses


def validate(url: str, *, allow_private: bool) -> Target:
    """For a new subscription: syntax, and (unless private targets are allowed) public addresses."""
    target = parse(url)
    if not allow_private:
        try:
            check(target, allow_private=False)
        except TargetUnresolvable as exc:
            raise TargetRefused(f"{exc}; check the host name") from exc
    return target


def post(url: str, body: bytes, headers: dict[str, str], *, timeout_s: float, allow_private: bool) -> PostResult:
    """POST once to the checked address. Raises TargetRefused; network errors come back in the result."""
    target = parse(url)
    try:
        addresses = check(target, allow_private=allow_private)
    except TargetUnresolvable as exc:
        return PostResult(None, str(exc))
    token = _posting.set(True)
    try:
        return _post_pinned(target, addresses, body, headers, timeout_s)
    finally:
        _posting.reset(token)


def _post_pinned(
    target: Target, addresses: list[IpAddress], body: bytes, headers: dict[str, str], timeout_s: float
) -> PostResult:
    """Connect to each checked address in turn (the next only when one refuses the connection)."""
    request_url = httpx.URL(target.url)
    host_header = request_url.netloc.decode("ascii")
    error = "no address to connect to"
    timeout = httpx.Timeout(timeout_s)
    with httpx.Client(timeout=timeout, follow_redirects=False, trust_env=False) as client:
        for address in addresses[:4]:
            pinned = request_url.copy_with(host=str(address))
            extensions = {"sni_hostname": target.host} if target.scheme == "https" else {}
            try:
                with client.stream(
                    "POST",
                    pinned,
                    content=body,
                    headers={**headers, "host": host_header},
                    extensions=extensions,
                ) as response:
                    if 200 <= response.status_code < 300:
                        return PostResult(response.status_code, None)
                    return PostResult(response.status_code, _describe(response))
            except httpx.ConnectError as exc:  # try the next address of the host
                error = f"cannot connect to {target.host} ({address}): {exc or type(exc).__name__}"
            except httpx.TimeoutException as exc:
                return PostResult(None, f"timed out after {timeout_s:g} s: {type(exc).__name__}")
            except httpx.HTTPError as exc:
                return PostResult(None, f"{type(exc).__name__}: {exc}")
    return PostResult(None, error)


def _describe(response: httpx.Response) -> str:
    if 300 <= response.status_code < 400:
        where = response.headers.get("location", "?")
        return f"HTTP {response.status_code}: redirect to {where[:200]} not followed; use the final URL"
    text = ""
    try:
        for chunk in response.iter_bytes():
            text += chunk.decode("utf-8", "replace")
            if len(text) >= MAX_ERROR_BODY:
                break
    except httpx.HTTPError:
        pass
    text = " ".join(text.split())[:MAX_ERROR_BODY]
    return f"HTTP {response.status_code}" + (f": {text}" if text else "")
