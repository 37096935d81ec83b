"""Helpers shared by the blocking and the asyncio client: endpoints, durations, keys, options,
and :class:`KeyInfo` (the answer to ``inspect``)."""

from __future__ import annotations

import ssl as _ssl
import struct
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Union

from .constants import DEFAULT_PORT, INSPECT_DATA_SIZE, MAX_KEY_LEN, WAIT_FOREVER
from .exceptions import ProtocolError
from .protocol import Response

Endpoint = tuple[str, int]
KeyLike = Union[str, bytes]

#: Default endpoint list: one server on loopback.
DEFAULT_ENDPOINTS: tuple[str, ...] = ("127.0.0.1:7070",)
#: Seconds allowed to connect (TCP, TLS and the handshake) to one endpoint.
DEFAULT_CONNECT_TIMEOUT = 5.0
#: Seconds to wait for the answer to RELEASE, EXTEND, PING, INSPECT, or for an ACQUIRE's answer
#: beyond its wait timeout.
DEFAULT_REQUEST_TIMEOUT = 10.0
#: How many times one call follows NOT_LEADER / SHUTTING_DOWN before it gives up.
DEFAULT_MAX_REDIRECTS = 8
#: Seconds slept before the second retry of a call, doubling each time (capped at 1 s).
DEFAULT_RETRY_BACKOFF = 0.05


def parse_endpoint(spec: str) -> Endpoint:
    """``"host:port"``, ``"[v6addr]:port"``, or ``"host"`` (port 7070) -> (host, port)."""
    s = spec.strip()
    if not s:
        raise ValueError("empty endpoint")
    if s.startswith("["):
        end = s.find("]")
        if end < 0:
            raise ValueError(f"bad endpoint {spec!r}")
        host, rest = s[1:end], s[end + 1:]
        if not rest:
            return host, DEFAULT_PORT
        if not rest.startswith(":"):
            raise ValueError(f"bad endpoint {spec!r}")
        return host, _port(rest[1:], spec)
    if s.count(":") == 1:
        host, port = s.split(":")
        return host or "127.0.0.1", _port(port, spec)
    if ":" in s:  # a bare IPv6 address
        return s, DEFAULT_PORT
    return s, DEFAULT_PORT


def _port(text: str, spec: str) -> int:
    try:
        port = int(text)
    except ValueError:
        raise ValueError(f"bad port in endpoint {spec!r}") from None
    if not 0 < port < 65536:
        raise ValueError(f"bad port in endpoint {spec!r}")
    return port


def parse_endpoints(endpoints: str | Sequence[str]) -> list[Endpoint]:
    items = [endpoints] if isinstance(endpoints, str) else list(endpoints)
    if not items:
        raise ValueError("at least one endpoint is needed")
    return [parse_endpoint(e) for e in items]


def format_endpoint(ep: Endpoint) -> str:
    host, port = ep
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def ssl_context(value: _ssl.SSLContext | bool | None) -> _ssl.SSLContext | None:
    """``None``/``False``: plain TCP; ``True``: the system's default trust; a context: as given."""
    if value is None or value is False:
        return None
    if value is True:
        return _ssl.create_default_context()
    if isinstance(value, _ssl.SSLContext):
        return value
    raise TypeError("ssl must be an ssl.SSLContext, True, or None")


def token_bytes(token: str | bytes | None) -> bytes | None:
    if token is None:
        return None
    return token.encode("utf-8") if isinstance(token, str) else bytes(token)


def key_bytes(key: KeyLike) -> bytes:
    """Keys are opaque bytes; a str is sent as its UTF-8."""
    b = key.encode("utf-8") if isinstance(key, str) else bytes(key)
    if not b:
        raise ValueError("key must not be empty")
    if len(b) > MAX_KEY_LEN:
        raise ValueError(f"key longer than {MAX_KEY_LEN} bytes")
    return b


def lease_ms(lease: float) -> int:
    """A lease in float seconds -> ms (at least 1)."""
    if isinstance(lease, bool) or not isinstance(lease, (int, float)):
        raise TypeError("lease must be a number of seconds")
    if not lease > 0:
        raise ValueError("lease must be positive")
    ms = max(1, round(lease * 1000))
    if ms > 0xFFFFFFFF:
        raise ValueError("lease too long")
    return ms


def wait_ms(wait_timeout: float | None) -> int:
    """A wait timeout in float seconds -> ms; None -> WAIT_FOREVER; 0 -> try once."""
    if wait_timeout is None:
        return WAIT_FOREVER
    if isinstance(wait_timeout, bool) or not isinstance(wait_timeout, (int, float)):
        raise TypeError("wait_timeout must be a number of seconds or None")
    if wait_timeout < 0:
        raise ValueError("wait_timeout must not be negative")
    return min(round(wait_timeout * 1000), WAIT_FOREVER - 1)


def call_timeout(wait_timeout: float | None, request_timeout: float | None) -> float | None:
    """How long the client waits locally for an ACQUIRE's answer."""
    if wait_timeout is None or request_timeout is None:
        return None
    return wait_timeout + request_timeout


class RecentTokens:
    """A small bounded set of tokens whose EXPIRED notice arrived before their Lock was
    registered (a lease of a few ms can expire before the caller builds the Lock)."""

    def __init__(self, size: int = 256) -> None:
        self._size = size
        self._items: OrderedDict[int, None] = OrderedDict()

    def add(self, token: int) -> None:
        self._items[token] = None
        while len(self._items) > self._size:
            self._items.popitem(last=False)

    def pop(self, token: int) -> bool:
        return self._items.pop(token, 0) is None


_INSPECT_DATA = struct.Struct(">II")  # ms since the grant, ms of lock-delay left


@dataclass(frozen=True, slots=True)
class KeyInfo:
    """What the server reports about a key (``client.inspect(key)``), as of the moment it answered.

    A key nobody holds or waits for reports ``token=None`` and zeros.
    """

    #: The holder's fencing token, or None when nobody holds the key.
    token: int | None
    #: Seconds left on the holder's lease (0.0 when not held).
    lease_remaining: float
    #: Acquires queued on the key.
    waiters: int
    #: Seconds since the holder was granted the lock (0.0 when not held).
    held_for: float
    #: Seconds of lock-delay left: after a lease expiry the server may keep the key unavailable
    #: for a while (0.0 when not in lock-delay, or when the server has no lock-delay).
    lock_delay_remaining: float


def key_info(resp: Response) -> KeyInfo:
    """The :class:`KeyInfo` of an INSPECT OK answer (``data`` is u32 ms held-for, u32 ms of
    lock-delay left; longer data is allowed for later additions)."""
    if len(resp.data) < INSPECT_DATA_SIZE:
        raise ProtocolError(f"INSPECT answer has {len(resp.data)} bytes of data, want {INSPECT_DATA_SIZE}",
                            "length")
    held_ms, delay_ms = _INSPECT_DATA.unpack_from(resp.data)
    return KeyInfo(token=resp.token or None, lease_remaining=resp.lease_ms / 1000, waiters=resp.detail,
                   held_for=held_ms / 1000, lock_delay_remaining=delay_ms / 1000)
