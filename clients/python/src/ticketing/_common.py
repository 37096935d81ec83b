"""Helpers shared by the blocking and the asyncio client: argument checks, endpoints, option
defaults, the local deadline, :class:`KeyInfo` (the answer to ``inspect``) and the fork hook."""

from __future__ import annotations

import math
import os
import ssl as _ssl
import struct
import threading
import weakref
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Union

from .constants import (
    CLOCK_RATE_BOUND_PPM,
    DEFAULT_PORT,
    INSPECT_DATA_SIZE,
    LOST_CHECK_MS,
    LOST_MARGIN_MS,
    MAX_KEY_LEN,
    WAIT_FOREVER,
    InspectFlag,
)
from .exceptions import InvalidArgument, NotLeader, ProtocolError, Unavailable
from .protocol import Response

Endpoint = tuple[str, int]
#: A key: ``str`` (sent as UTF-8) or bytes (``bytes``, ``bytearray``, ``memoryview``).
KeyLike = Union[str, bytes, bytearray, memoryview]

#: Default endpoint list: one server on loopback.
DEFAULT_ENDPOINTS: tuple[str, ...] = ("127.0.0.1:7070",)
#: Seconds allowed to connect (TCP, TLS and the handshake) to one endpoint.
DEFAULT_CONNECT_TIMEOUT = 5.0
#: Seconds to wait for any answer, not counting the time an ACQUIRE spends queued.
DEFAULT_REQUEST_TIMEOUT = 10.0
#: Seconds without receiving anything after which the client sends a PING.
DEFAULT_HEARTBEAT = 2.0
#: Seconds a cancelled acquire waits for its clean-up (CANCEL's answer, the release of a grant
#: that raced it) before returning; the clean-up then finishes in the background.
DEFAULT_CLEANUP_TIMEOUT = 5.0
#: Reconnect backoff: the first pause, doubling up to the second, with jitter.
BACKOFF_MIN = 0.05
BACKOFF_MAX = 2.0
#: While any request waits for an answer (a queued ACQUIRE included), the heartbeat PING goes
#: after at most this many seconds of silence (docs/clients.md, the heartbeat interval).
BUSY_HEARTBEAT = 0.25
#: A lock's lost timer is armed once its lost signal is due within this many seconds; before
#: that, the client's lost watch (every LOST_CHECK_MS) arms it. Most locks are released long
#: before and cost no timer at all (a timer entry at acquire and its cancellation at release, for
#: every pair). Twice the watch's interval: a watch always comes while the signal is still ahead.
LOST_ARM_WITHIN = 2 * LOST_CHECK_MS / 1000
#: A PING unanswered for min(heartbeat, this) seconds gives the connection up: the client
#: reconnects (the node just left tried last) and resumes, so a frozen leader is left about 1 s
#: after it froze. Calls in flight keep waiting, each bounded by its own timeout.
MAX_PING_WAIT = 0.75
#: For this many seconds after a connection was found silent (a PING unanswered: a frozen node,
#: a cut network), that node is neither dialled nor followed as a leader hint in connect rounds,
#: unless it is the only endpoint: it still accepts TCP and would cost the handshake wait, and
#: the other nodes keep naming it as the leader until they elect another one (docs/clients.md,
#: rule 1). After that it is tried last, as any node just left.
SILENT_SKIP = 2.0
#: Once TCP is connected, TLS and the handshake must finish within min(connect_timeout, this)
#: seconds: a frozen node's kernel still accepts connections.
HANDSHAKE_WAIT = 2.0

_RHO = CLOCK_RATE_BOUND_PPM / 1_000_000
_MAX_U64 = (1 << 64) - 1


# --- endpoints and options ------------------------------------------------------------------


def parse_endpoint(spec: str) -> Endpoint:
    """``"host:port"``, ``"[v6addr]:port"``, or ``"host"`` (port 7070) -> (host, port)."""
    if not isinstance(spec, str):
        raise InvalidArgument(f"an endpoint must be a 'host:port' string, not {type(spec).__name__}")
    s = spec.strip()
    if not s:
        raise InvalidArgument("empty endpoint: want 'host:port'")
    if s.startswith("["):
        end = s.find("]")
        if end < 0:
            raise InvalidArgument(f"bad endpoint {spec!r}: want 'host:port' or '[v6addr]:port'")
        host, rest = s[1:end], s[end + 1:]
        if not rest:
            return host, DEFAULT_PORT
        if not rest.startswith(":"):
            raise InvalidArgument(f"bad endpoint {spec!r}: want 'host:port' or '[v6addr]:port'")
        return host, _port(rest[1:], spec)
    if s.count(":") == 1:
        host, port = s.split(":")
        if not host:
            raise InvalidArgument(f"bad endpoint {spec!r}: no host")
        return host, _port(port, spec)
    return s, DEFAULT_PORT  # a host name, or a bare IPv6 address


def _port(text: str, spec: str) -> int:
    try:
        port = int(text)
    except ValueError:
        raise InvalidArgument(f"bad port in endpoint {spec!r}") from None
    if not 0 < port < 65536:
        raise InvalidArgument(f"bad port in endpoint {spec!r}: want 1..65535")
    return port


def parse_endpoints(endpoints: str | Sequence[str]) -> list[Endpoint]:
    """One endpoint string, or a non-empty sequence of them."""
    if isinstance(endpoints, str):
        items: list[str] = [endpoints]
    elif isinstance(endpoints, (list, tuple)):
        items = list(endpoints)
    else:
        raise InvalidArgument(f"endpoints must be a 'host:port' string or a list of them, "
                              f"not {type(endpoints).__name__}")
    if not items:
        raise InvalidArgument("at least one endpoint is needed")
    return [parse_endpoint(e) for e in items]


def format_endpoint(ep: Endpoint) -> str:
    """(host, port) -> ``host:port`` (``[v6]:port`` for IPv6)."""
    host, port = ep
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def not_leader_unavailable(where: str, e: NotLeader) -> Unavailable:
    """A connect refused NOT_LEADER (in CHALLENGE or WELCOME): like any failed connect, that is
    :class:`Unavailable` (every client reports it so); the :class:`NotLeader` with the hint is
    its ``__cause__``, which the reconnect round follows."""
    why = f"not the leader; leader is {e.leader}" if e.leader else "not the leader, and it knows no leader"
    err = Unavailable(f"{where}: {why}")
    err.__cause__ = e
    return err


def refused_not_leader(e: BaseException) -> NotLeader | None:
    """The :class:`NotLeader` behind a connect error (see :func:`not_leader_unavailable`), if any."""
    if isinstance(e, NotLeader):
        return e
    cause = e.__cause__
    return cause if isinstance(cause, NotLeader) else None


def tls_client_hello() -> bytes:
    """The first flight of a TLS client (a ClientHello), to ask an endpoint whether it speaks
    TLS (see :func:`speaks_tls`); nothing is verified, the handshake is never finished."""
    ctx = _ssl.SSLContext(_ssl.PROTOCOL_TLS_CLIENT)
    ctx.check_hostname = False
    ctx.verify_mode = _ssl.CERT_NONE
    incoming, outgoing = _ssl.MemoryBIO(), _ssl.MemoryBIO()
    obj = ctx.wrap_bio(incoming, outgoing, server_side=False)
    try:
        obj.do_handshake()
    except _ssl.SSLWantReadError:
        pass
    return outgoing.read()


def speaks_tls(answer: bytes) -> bool:
    """``answer`` (the first bytes an endpoint sent back to :func:`tls_client_hello`) is a TLS
    record: a handshake or an alert."""
    return len(answer) >= 2 and answer[0] in (0x15, 0x16) and answer[1] == 0x03


#: How long the probe of :func:`speaks_tls` may take, at most.
TLS_PROBE_WAIT = 1.0

#: The message of a plaintext connect to an endpoint that speaks TLS.
PLAINTEXT_TO_TLS = ("the server closed the plaintext handshake and answers a TLS ClientHello "
                    "(is the server using TLS? pass ssl= to connect with TLS)")


def ssl_context(value: _ssl.SSLContext | bool | None) -> _ssl.SSLContext | None:
    """``None``/``False``: plain TCP; ``True``: the system's default trust; a context: as given."""
    if value is None or value is False:
        return None
    if value is True:
        return _ssl.create_default_context()
    if isinstance(value, _ssl.SSLContext):
        return value
    raise InvalidArgument("ssl must be an ssl.SSLContext, True, or None")


def token_bytes(token: str | bytes | None) -> bytes | None:
    """The shared auth token as bytes (a str is its UTF-8); None: no token."""
    if token is None:
        return None
    if isinstance(token, str):
        if not token:
            raise InvalidArgument("token must not be empty (None: no token)")
        try:
            return token.encode("utf-8")
        except UnicodeEncodeError:
            raise InvalidArgument("token is not encodable as UTF-8") from None
    if isinstance(token, (bytes, bytearray)):
        if not token:
            raise InvalidArgument("token must not be empty (None: no token)")
        return bytes(token)
    raise InvalidArgument(f"token must be str or bytes, not {type(token).__name__}")


def seconds_option(name: str, value: float | None, *, allow_zero: bool = False) -> float | None:
    """Check a duration option in float seconds: None, or finite and positive (or zero where
    allowed)."""
    if value is None:
        return None
    return seconds_required(name, value, allow_zero=allow_zero)


def seconds_required(name: str, value: float, *, allow_zero: bool = False) -> float:
    """Check a duration in float seconds: finite and positive (or zero where allowed)."""
    if value is None:
        raise InvalidArgument(f"{name} must be a number of seconds, not None")
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise InvalidArgument(f"{name} must be a number of seconds, not {type(value).__name__}")
    v = float(value)
    if math.isnan(v) or math.isinf(v):
        raise InvalidArgument(f"{name} must be a finite number of seconds, got {value!r}")
    if v < 0 or (v == 0 and not allow_zero):
        raise InvalidArgument(f"{name} must be {'at least 0' if allow_zero else 'positive'}, got {value!r}")
    return v


def heartbeat_due(heartbeat: float, busy: bool, idle: float) -> float:
    """Seconds until a heartbeat PING is due (0: now), for a connection silent for ``idle``
    seconds, with ``busy`` true while any request waits for an answer."""
    interval = min(heartbeat, BUSY_HEARTBEAT) if busy else heartbeat
    return max(0.0, interval - idle)


# --- request arguments ----------------------------------------------------------------------


def key_bytes(key: KeyLike) -> bytes:
    """A key as bytes: ``str`` is sent as its UTF-8, bytes-like as given; 1..65,535 bytes.
    Anything else (int, list, None) is an :class:`InvalidArgument`."""
    if isinstance(key, str):
        try:
            b = key.encode("utf-8")
        except UnicodeEncodeError:
            raise InvalidArgument("key is not encodable as UTF-8 (lone surrogate?)") from None
    elif isinstance(key, (bytes, bytearray, memoryview)):
        b = bytes(key)
    else:
        raise InvalidArgument(f"key must be str or bytes, not {type(key).__name__}")
    if not b:
        raise InvalidArgument("key must not be empty")
    if len(b) > MAX_KEY_LEN:
        raise InvalidArgument(f"key is {len(b)} bytes, longer than the protocol's {MAX_KEY_LEN}")
    return b


def lease_ms(lease: float) -> int:
    """A lease in float seconds -> whole milliseconds: at least 1 ms, below 2^32 ms."""
    cls = lease.__class__
    if cls is int or cls is float:
        # The usual lease, in one comparison (NaN and infinities fail it and take the checks
        # below for their messages; bool is neither class).
        x = lease * 1000
        if 1 <= x <= 0xFFFFFFFF:
            return round(x)
    if isinstance(lease, bool) or not isinstance(lease, (int, float)):
        raise InvalidArgument(f"lease must be a number of seconds, not {type(lease).__name__}")
    if math.isnan(lease) or math.isinf(lease):
        raise InvalidArgument(f"lease must be a finite number of seconds, got {lease!r}")
    if lease * 1000 < 1:
        raise InvalidArgument(f"lease {lease!r} s is below 1 ms: leases are float seconds (lease=30 is 30 s)")
    ms = round(lease * 1000)
    if ms > 0xFFFFFFFF:
        raise InvalidArgument(f"lease {lease!r} s is too long: leases are float seconds, below 2^32 ms")
    return ms


def wait_ms(wait_timeout: float | None) -> int:
    """A wait timeout in float seconds -> ms; None -> wait without limit; 0 -> try once."""
    if wait_timeout is None:
        return WAIT_FOREVER
    if isinstance(wait_timeout, bool) or not isinstance(wait_timeout, (int, float)):
        raise InvalidArgument(f"wait_timeout must be a number of seconds or None, not {type(wait_timeout).__name__}")
    if math.isnan(wait_timeout) or math.isinf(wait_timeout):
        raise InvalidArgument(f"wait_timeout must be finite (None waits without limit), got {wait_timeout!r}")
    if wait_timeout < 0:
        raise InvalidArgument(f"wait_timeout must not be negative, got {wait_timeout!r}")
    ms = round(wait_timeout * 1000)
    if ms == 0 and wait_timeout > 0:
        ms = 1
    if ms >= WAIT_FOREVER:
        raise InvalidArgument(f"wait_timeout {wait_timeout!r} s is too long (None waits without limit)")
    return ms


def check_token(token: int) -> int:
    """A fencing token: a positive 64-bit integer."""
    if isinstance(token, bool) or not isinstance(token, int):
        raise InvalidArgument(f"token must be an int, not {type(token).__name__}")
    if not 0 < token <= _MAX_U64:
        raise InvalidArgument(f"token must be a positive 64-bit integer, got {token}")
    return token


def describe_wait(wait_timeout: float | None) -> str:
    """A wait timeout for messages."""
    if wait_timeout is None:
        return "wait without limit"
    if wait_timeout == 0:
        return "try once"
    return f"wait timeout {wait_timeout:g} s"


# --- the lost signal ------------------------------------------------------------------------


def lock_deadline(t_first: float, detail_ms: int, lease_ms: int) -> float:
    """A lock's local deadline on the lock clock (:mod:`._clock`), PROTOCOL.md's "The lost
    signal": ``t_first + (detail + lease) * (1 - 2 rho)``, never after the server's lease end.
    ``t_first`` is when the request id was first sent: a re-send (after a resume, to the
    leader) never changes it, because a grant may be decided before the re-send and read after
    it. The server counts ``detail`` from the request's first arrival, so the one formula holds
    for every ``ACQUIRE OK``, whichever transmission it answers (a waiter's time queued, or the
    time since the first arrival with the lease left for a retry answered from the lock table).
    ``detail_ms = 0`` for an ``EXTEND OK``."""
    return t_first + (detail_ms + lease_ms) * (1 - 2 * _RHO) / 1000


def lost_margin(lease_ms: int) -> float:
    """How long before the deadline the lost signal fires, in seconds: ``min(5 ms, lease / 10)``,
    for timer latency."""
    return min(LOST_MARGIN_MS, lease_ms / 10) / 1000


class RecentTokens:
    """A small bounded set of tokens whose EXPIRED notice arrived before their Lock was
    registered (a lease of a few ms can expire before the caller builds the Lock)."""

    def __init__(self, size: int = 256) -> None:
        self._size = size
        self._items: OrderedDict[int, str] = OrderedDict()

    def add(self, token: int, reason: str) -> None:
        """Remember that ``token`` was lost for ``reason``."""
        self._items[token] = reason
        while len(self._items) > self._size:
            self._items.popitem(last=False)

    def pop(self, token: int) -> str | None:
        """The reason ``token`` was lost, if it was (and forget it)."""
        return self._items.pop(token, None)

    def clear(self) -> None:
        """Forget every token."""
        self._items.clear()

    def __len__(self) -> int:
        """How many tokens are remembered (``if recent:`` skips :meth:`pop` when none)."""
        return len(self._items)


# --- inspect --------------------------------------------------------------------------------

_INSPECT_DATA = struct.Struct(">III")  # ms since the grant, ms of lock-delay left, flags


@dataclass(frozen=True, slots=True)
class KeyInfo:
    """What the server reports about a key (``client.inspect(key)``), as of the moment it answered.
    A key nobody holds or waits for reports ``held=False`` and zeros."""

    #: Somebody holds the key.
    held: bool
    #: The holder's fencing token, only when this client's session holds the key (or a token
    #: asked about matches); else None: looking at a key does not hand out the means to release it.
    token: int | None
    #: Seconds left on the holder's lease (0.0 when not held).
    lease_remaining: float
    #: Acquires queued on the key.
    waiters: int
    #: Seconds since the holder was granted the lock (0.0 when not held).
    held_for: float
    #: Seconds of lock-delay left: after a lease expiry the server may keep the key unavailable
    #: for a while (0.0 when not in lock-delay, or when the server has no lock-delay); during
    #: the server's start-up wait (flag ``STARTUP``), the time left in that wait.
    lock_delay_remaining: float
    #: The raw flags word (:class:`InspectFlag`): ``HELD``, ``TOKEN_MATCH``, ``SESSION``,
    #: ``STALLED``, ``STARTUP``.
    flags: InspectFlag

    @property
    def startup(self) -> bool:
        """The server is in its start-up wait (flag ``STARTUP``): nothing is granted before it
        ends, in :attr:`lock_delay_remaining` seconds."""
        return bool(self.flags & InspectFlag.STARTUP)


def key_info(resp: Response) -> KeyInfo:
    """The :class:`KeyInfo` of an INSPECT OK answer (``data`` is u32 ms held-for, u32 ms of
    lock-delay left, u32 flags; longer data is allowed for later additions). Unknown flag bits
    are kept in ``flags``."""
    if len(resp.data) < INSPECT_DATA_SIZE:
        raise ProtocolError(f"INSPECT answer has {len(resp.data)} bytes of data, want {INSPECT_DATA_SIZE}",
                            "length")
    held_ms, delay_ms, raw_flags = _INSPECT_DATA.unpack_from(resp.data)
    flags = InspectFlag(raw_flags)
    shows_token = bool(flags & (InspectFlag.TOKEN_MATCH | InspectFlag.SESSION))
    return KeyInfo(held=bool(flags & InspectFlag.HELD), token=resp.token if shows_token and resp.token else None,
                   lease_remaining=resp.lease_ms / 1000, waiters=resp.detail, held_for=held_ms / 1000,
                   lock_delay_remaining=delay_ms / 1000, flags=flags)


# --- fork -----------------------------------------------------------------------------------

_fork_hooks: weakref.WeakSet[ForkAware] = weakref.WeakSet()
_fork_lock = threading.Lock()


class ForkAware:
    """A client that starts a new session in a child process after ``os.fork``."""

    def _after_fork_in_child(self) -> None:  # pragma: no cover - overridden
        raise NotImplementedError


def register_for_fork(obj: ForkAware) -> None:
    """Call ``obj._after_fork_in_child()`` in the child after every fork while ``obj`` lives."""
    with _fork_lock:
        _fork_hooks.add(obj)


def _after_fork() -> None:
    global _fork_lock
    _fork_lock = threading.Lock()  # it may have been held by another thread at fork time
    for obj in list(_fork_hooks):
        obj._after_fork_in_child()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork)
