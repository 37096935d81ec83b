"""The session rules of PROTOCOL.md without I/O, shared by the blocking and the asyncio client.

A :class:`Session` is one client process's identity on the server: its id, the request id
counter, the state id of the first WELCOME, and every request not answered yet. It never touches
a socket or a clock: the caller passes ``now`` in (on the lock clock, :mod:`._clock`), takes the
bytes to write from :attr:`Session.out`, the calls that finished from :attr:`Session.finished`
and what else happened from :attr:`Session.events`, and serialises every call (the blocking
client holds its lock; the asyncio client runs on one loop).

The rules it implements (PROTOCOL.md, "Sessions" and "State id and restarts"):

- Request ids are taken when a frame is queued for the wire (:meth:`Session.submit`), so ids
  reach the wire in order. Until the connection is ready, requests wait in a backlog without an id.
- After WELCOME: a different state id fails every unanswered request (``ServerRestarted``) and
  starts a new session id; the same state id and RESUMED re-sends every unanswered request with
  its original id, in id order, before anything new; the same state id without RESUMED fails the
  requests that may have run (``ConnectionLost``) and sends the others as new.
- An ACQUIRE whose caller gave up is withdrawn with CANCEL (at once, or after the re-sends of
  the next resumed connection), and a grant that still arrives for it is released.
- ACK at least once per 1,024 answers, one at a time, with x = the lowest id awaited that is not
  an ACQUIRE (else the next id).
- NOT_LEADER leaves the request unanswered (to re-send at the leader); pushes become events.
"""

from __future__ import annotations

import logging
import secrets
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from .constants import ACK_EVERY, SESSION_ID_SIZE, ExpiredReason, GoawayReason, LostReason, Op, Status
from .exceptions import ConnectionLost, ServerRestarted, TicketingError, describe_key
from .protocol import Request, Response, Welcome, encode_request_fields

__all__ = ["Call", "Session", "Expired", "Follow", "Restarted", "new_session_id"]

log = logging.getLogger("ticketing")

#: Send ACK after this many answers (half the protocol's bound, so an ACK still in flight never
#: makes the client overrun it).
_ACK_AFTER = ACK_EVERY // 2
_OK = int(Status.OK)


def new_session_id() -> bytes:
    """16 random bytes, never all zero."""
    while True:
        sid = secrets.token_bytes(SESSION_ID_SIZE)
        if any(sid):
            return sid


def run_callbacks(calls: list[Call]) -> None:
    """Runs the callbacks of finished calls, in order; one that raises is logged and the others
    still run. Both clients call it for every batch of answers."""
    for call in calls:
        for cb in call.callbacks:
            try:
                cb(call)
            except Exception:
                log.exception("callback failed")


class Call:
    """One request of the session, from submit to its final answer.

    ``callbacks`` run (outside the caller's lock) once the call is done: with ``response`` set
    (any status but NOT_LEADER, which leaves the call waiting), or with ``error`` set.
    """

    __slots__ = ("op", "key", "token", "lease_ms", "wait_ms", "id", "t_send", "may_have_run",
                 "abandoned", "internal", "done", "response", "error", "callbacks", "cancel_sent", "cleanup",
                 "failovers", "epoch", "t_first")

    # key, token, lease_ms and wait_ms may be passed by position: instantiating a class with
    # keyword arguments costs CPython 3.11 about as much again as these assignments.
    def __init__(self, op: Op, key: bytes = b"", token: int = 0, lease_ms: int = 0, wait_ms: int = 0, *,
                 internal: bool = False) -> None:
        self.op = op
        self.key = key
        self.token = token
        self.lease_ms = lease_ms
        self.wait_ms = wait_ms
        #: The request id; 0 until the call is queued for the wire.
        self.id = 0
        #: When it was last sent (original or retry), on the lock clock.
        self.t_send = 0.0
        #: When it was first sent with the current id, on the lock clock: a lock's deadline
        #: counts from it, whichever send the answer is for.
        self.t_first = 0.0
        #: Sent on a connection that may have run it (not answered NOT_LEADER).
        self.may_have_run = False
        #: The caller stopped waiting; the answer is used for clean-up only.
        self.abandoned = False
        #: Sent by the client itself (heartbeat, ACK, CANCEL, clean-up RELEASE).
        self.internal = internal
        self.done = False
        self.response: Response | None = None
        self.error: TicketingError | None = None
        self.callbacks: list[Callable[[Call], None]] = []
        #: A CANCEL for this ACQUIRE is queued or answered.
        self.cancel_sent = False
        #: The RELEASE of a grant that arrived after the caller gave up.
        self.cleanup: Call | None = None
        #: How often SHUTTING_DOWN moved this call to another endpoint.
        self.failovers = 0
        #: :attr:`Session.restarts` when the call was last sent.
        self.epoch = 0

    def request(self) -> Request:
        """The request frame's fields (with the current id)."""
        return Request(op=self.op, id=self.id, token=self.token, lease_ms=self.lease_ms, wait_ms=self.wait_ms,
                       key=self.key)

    def describe(self) -> str:
        """The call for messages: its op and key."""
        name = self.op.name if isinstance(self.op, Op) else str(self.op)
        return f"{name} {describe_key(self.key)}" if self.key else name

    def __repr__(self) -> str:
        return f"<Call {self.describe()} id={self.id} done={self.done}>"


def release_in_background(submit: Callable[[Call], object], k: bytes, token: int) -> None:
    """Tell the server that the lost lock ``token`` on ``k`` is released, without waiting
    (Lock.release of a lost lock, sync and asyncio clients): best effort, the answer changes
    nothing. ``submit`` is the client's own submit."""
    call = Call(Op.RELEASE, key=k, token=token, internal=True)
    call.callbacks.append(lambda c: log.debug("background release of %s (token %d): %s", describe_key(k), token,
                                              c.error or (c.response and c.response.status)))
    try:
        submit(call)
    except TicketingError as e:  # closed: the lease runs out on the server
        log.debug("background release of %s (token %d) not sent: %s", describe_key(k), token, e)


@dataclass(frozen=True, slots=True)
class Expired:
    """Event: an EXPIRED push for ``token``."""

    token: int
    key: bytes
    reason: LostReason


@dataclass(frozen=True, slots=True)
class Follow:
    """Event: leave this connection (GOAWAY, NOT_LEADER, SHUTTING_DOWN with another endpoint to
    try) and reconnect: to ``leader`` when known, else to the next endpoint."""

    leader: str | None
    why: str
    next_endpoint: bool = False


@dataclass(frozen=True, slots=True)
class Restarted:
    """Event: a reconnect found a different state id; every lock is lost."""


Event = Expired | Follow | Restarted


class Session:
    """Session bookkeeping; see the module doc. Not thread-safe: the caller serialises access."""

    def __init__(self) -> None:
        self.session_id = new_session_id()
        self.next_id = 1
        #: The state id of the first WELCOME of this session; None before it.
        self.state_id: bytes | None = None
        #: Seconds the server keeps the session after a drop (from the last WELCOME).
        self.grace = 0.0
        #: Unanswered requests that have an id, by id.
        self.pending: dict[int, Call] = {}
        #: Requests waiting for the connection to be ready (no id yet), in submit order.
        self.backlog: deque[Call] = deque()
        #: The connection is handshaken and the re-sends are queued: new requests go out at once.
        self.ready = False
        #: Bytes to write to the current connection, in order.
        self.out = bytearray()
        #: Calls that finished since the caller last took them.
        self.finished: list[Call] = []
        #: Events since the caller last took them.
        self.events: list[Event] = []
        #: SHUTTING_DOWN moves a call to the next endpoint at most this often (0: never).
        self.failover_limit = 0
        self.heartbeat: Call | None = None
        #: How many state id changes this client has seen (a lock granted before one is lost).
        self.restarts = 0
        self._ack: Call | None = None
        self._answers = 0

    # --- sending ------------------------------------------------------------------------------

    def submit(self, call: Call, now: float) -> None:
        """Send ``call`` now if the connection is ready, else keep it in the backlog."""
        if self.ready:
            self.out += self.submit_data(call, now)
        else:
            self.backlog.append(call)

    def submit_data(self, call: Call, now: float) -> bytes:
        """:meth:`submit` for a ready session with nothing queued in :attr:`out` (the caller
        checks both): returns the request's bytes instead of queueing them, for the caller to
        write before anything else is queued (it holds its lock until it has handed them over).
        Saves the copy in and out of :attr:`out` for every request."""
        cid = call.id = self.next_id
        self.next_id = cid + 1
        self.pending[cid] = call
        call.t_first = call.t_send = now
        call.may_have_run = True
        call.epoch = self.restarts
        return encode_request_fields(call.op, cid, call.token, call.lease_ms, call.wait_ms, call.key)

    def _send(self, call: Call, now: float) -> None:
        call.id = self.next_id
        self.next_id += 1
        self.pending[call.id] = call
        call.t_first = now
        self._write(call, now)

    def _write(self, call: Call, now: float) -> None:
        self.out += encode_request_fields(call.op, call.id, call.token, call.lease_ms, call.wait_ms, call.key)
        call.t_send = now
        call.may_have_run = True
        call.epoch = self.restarts

    def take_out(self) -> bytes:
        """The bytes to write, and forget them."""
        data = bytes(self.out)
        self.out.clear()
        return data

    def take_finished(self) -> list[Call]:
        """The calls that finished, and forget them."""
        calls, self.finished = self.finished, []
        return calls

    def take_events(self) -> list[Event]:
        """The events, and forget them."""
        events, self.events = self.events, []
        return events

    def send_heartbeat(self, now: float) -> Call | None:
        """Queue a heartbeat PING unless one is outstanding; returns the outstanding one."""
        if not self.ready:
            return None
        if self.heartbeat is None:
            self.heartbeat = Call(Op.PING, internal=True)
            self._send(self.heartbeat, now)
        return self.heartbeat

    # --- giving up ----------------------------------------------------------------------------

    def abandon(self, call: Call, now: float) -> None:
        """The caller stopped waiting for ``call`` (timeout, cancellation). An ACQUIRE is
        withdrawn with CANCEL; a grant that arrived or still arrives for it is released."""
        if call.done:
            if call.op == Op.ACQUIRE and call.response is not None and call.response.status == Status.OK:
                self._release_grant(call, call.response.token, now)
            return
        call.abandoned = True
        if call.id == 0:
            try:
                self.backlog.remove(call)
            except ValueError:
                pass
            self._finish(call, error=None)
            return
        if call.op == Op.ACQUIRE and self.ready:
            self._cancel(call, now)

    def withdraw_acquires(self, error: Callable[[Call], TicketingError], now: float) -> list[Call]:
        """The client is closing: every ACQUIRE sent and not answered whose caller still waits
        is withdrawn (CANCEL; a grant that races it is released) and its caller fails with
        ``error(call)`` now. Returns those calls, to wait for with :meth:`settled`. Without a
        ready connection nothing can be withdrawn (the server drops the waits when the session's
        grace ends): nothing is done and nothing returned."""
        if not self.ready:
            return []
        withdrawn = []
        for call in sorted(self.pending.values(), key=lambda c: c.id):
            if call.op != Op.ACQUIRE or call.internal or call.abandoned or call.done:
                continue
            call.abandoned = True
            self._cancel(call, now)
            self._fail_caller(call, error(call))
            withdrawn.append(call)
        return withdrawn

    def settled(self, call: Call) -> bool:
        """The outcome of abandoned ``call`` is known: its answer arrived (or it was dropped) and
        the release of a grant that raced its withdrawal, if any, is answered."""
        if self.pending.get(call.id) is call:
            return False
        return call.cleanup is None or call.cleanup.done

    def _cancel(self, call: Call, now: float) -> None:
        if not call.cancel_sent:
            call.cancel_sent = True
            self._send(Call(Op.CANCEL, token=call.id, internal=True), now)

    def _release_grant(self, call: Call, token: int, now: float) -> None:
        if call.cleanup is None:
            log.debug("releasing token %d of an abandoned acquire of %s", token, describe_key(call.key))
            call.cleanup = Call(Op.RELEASE, key=call.key, token=token, internal=True)
            self.submit(call.cleanup, now)

    # --- receiving ----------------------------------------------------------------------------

    def on_response(self, resp: Response, now: float) -> None:
        """Dispatch one frame from the server."""
        if resp.id == 0:
            self._on_push(resp)
            return
        call = self.pending.pop(resp.id, None)
        if call is None:
            log.debug("answer to unknown request id %d ignored", resp.id)
            return
        self._answers += 1
        status = resp.status
        if (status == _OK and not call.abandoned and call is not self.heartbeat and call is not self._ack
                and self._answers < _ACK_AFTER):
            # The common answer (a caller's call, OK, no ACK due): _finish inlined.
            if not call.done:
                call.done = True
                call.response = resp
                self.finished.append(call)
            return
        if status == Status.NOT_LEADER:
            # Not run: keep it to re-send at the leader with the same id.
            self.pending[call.id] = call
            call.may_have_run = False
            self.events.append(Follow(resp.data.decode("utf-8", "replace") or None, "NOT_LEADER"))
            return
        if call is self.heartbeat:
            self.heartbeat = None
        if call is self._ack:
            self._ack = None
        if (resp.status == Status.SHUTTING_DOWN and call.failovers < self.failover_limit
                and not call.abandoned and not call.internal):
            # Another endpoint may take it: run it there as a new request.
            call.failovers += 1
            call.id = 0
            self.backlog.append(call)
            self.events.append(Follow(None, "SHUTTING_DOWN", next_endpoint=True))
            return
        if call.abandoned and call.op == Op.ACQUIRE and resp.status == Status.OK:
            self._release_grant(call, resp.token, now)
        self._finish(call, response=resp)
        self._maybe_ack(now)

    def _on_push(self, resp: Response) -> None:
        if resp.op == Op.EXPIRED:
            reason = LostReason.SERVER_STOPPING if resp.detail == ExpiredReason.STOPPING else LostReason.EXPIRED
            self.events.append(Expired(resp.token, resp.data, reason))
        elif resp.op == Op.GOAWAY:
            try:
                why = f"GOAWAY {GoawayReason(resp.detail).name}"
            except ValueError:
                why = f"GOAWAY reason {resp.detail}"
            self.events.append(Follow(resp.data.decode("utf-8", "replace") or None, why))
        elif resp.status == Status.INVALID:
            log.warning("the server rejected a frame: %s", resp.data.decode("utf-8", "replace"))
        else:
            log.debug("unknown push op 0x%02x ignored", resp.op)

    def _maybe_ack(self, now: float) -> None:
        if self._answers < _ACK_AFTER or self._ack is not None or not self.ready:
            return
        awaited = [i for i, c in self.pending.items() if c.op != Op.ACQUIRE]
        x = min(awaited) if awaited else self.next_id
        self._answers = 0
        self._ack = Call(Op.ACK, token=x, internal=True)
        self._send(self._ack, now)

    def _finish(self, call: Call, *, response: Response | None = None, error: TicketingError | None = None) -> None:
        if call.done:
            return
        call.done = True
        call.response = response
        call.error = error
        self.finished.append(call)

    # --- connections --------------------------------------------------------------------------

    def connection_lost(self) -> None:
        """The connection dropped: stop sending; unanswered requests wait for the next one."""
        self.ready = False
        self.out.clear()
        hb, self.heartbeat = self.heartbeat, None
        if hb is not None and self.pending.get(hb.id) is hb:
            del self.pending[hb.id]
            self._finish(hb, error=ConnectionLost("connection lost"))

    def grace_expired(self, why: str) -> None:
        """No reconnect within the session grace: the session cannot be resumed. Callers of
        requests sent fail with :class:`ConnectionLost`; their ACQUIREs stay for clean-up should
        the server still know the session (CANCEL at the next resumed connection). Requests not
        sent yet (the backlog) never ran: they keep waiting for a connection, each bounded by its
        caller's timeout (docs/clients.md, rule 1)."""
        self.fail_waiting(lambda call: ConnectionLost(f"{why} ({call.describe()})"), backlog=False)

    def fail_waiting(self, error: Callable[[Call], TicketingError], *, backlog: bool) -> None:
        """Fail the caller of every unanswered request with ``error(call)``: requests sent are
        given up (an ACQUIRE stays, abandoned, for its withdrawal should the session be resumed;
        so do clean-up RELEASEs and CANCELs); with ``backlog``, the callers of requests not sent
        yet fail too (the client's own clean-up RELEASEs stay queued)."""
        for call in sorted(self.pending.values(), key=lambda c: c.id):
            if call.op == Op.ACQUIRE or (call.internal and call.op in (Op.RELEASE, Op.CANCEL)):
                if not call.internal:
                    self._fail_caller(call, error(call))
                    call.abandoned = True
                continue
            del self.pending[call.id]
            self._fail_caller(call, error(call))
        self._ack = None
        if backlog:
            kept = [c for c in self.backlog if c.internal]
            for call in self.backlog:
                if not call.internal:
                    self._fail_caller(call, error(call))
            self.backlog = deque(kept)

    def fail_unsent(self, call: Call, error: TicketingError) -> None:
        """Fail ``call`` with ``error`` if it is still in the backlog (not sent yet)."""
        if call.id == 0 and not call.done and call in self.backlog:
            self.backlog.remove(call)
            self._fail_caller(call, error)

    def _fail_caller(self, call: Call, error: TicketingError) -> None:
        self._finish(call, error=error)

    def welcome(self, w: Welcome, now: float) -> bool:
        """Apply a successful WELCOME. Returns True when the connection may be used; False when
        the state id changed: every unanswered request failed, a :class:`Restarted` event is
        queued, the session id is new, and the caller must reconnect with it."""
        self.grace = w.session_grace_ms / 1000
        self._answers = 0
        self._ack = None
        if self.state_id is not None and w.state_id != self.state_id:
            for call in sorted(self.pending.values(), key=lambda c: c.id):
                self._fail_caller(call, ServerRestarted(
                    f"the server restarted and forgot every lock ({call.describe()})"))
            self.pending.clear()
            self.session_id = new_session_id()
            self.state_id = None
            self.restarts += 1
            self.events.append(Restarted())
            return False
        calls = sorted(self.pending.values(), key=lambda c: c.id)
        first = self.state_id is None
        self.state_id = w.state_id
        if w.resumed and not first:
            for call in calls:
                self._write(call, now)
            for call in calls:
                if call.op == Op.ACQUIRE and call.abandoned:
                    self._cancel(call, now)
        else:
            for call in calls:
                keep = (not call.may_have_run and not call.abandoned) or (call.internal and call.op == Op.RELEASE)
                if keep:
                    self._write(call, now)
                    continue
                del self.pending[call.id]
                if call.internal or call.abandoned:
                    self._finish(call, error=ConnectionLost("session ended"))
                else:
                    self._fail_caller(call, ConnectionLost(
                        f"the connection dropped and the server did not resume the session ({call.describe()})"))
        self.ready = True
        while self.backlog:
            self._send(self.backlog.popleft(), now)
        return True

    def close(self, error: Callable[[Call], TicketingError]) -> None:
        """The client is closing: every unanswered request fails with ``error(call)``."""
        self.ready = False
        for call in list(self.pending.values()) + list(self.backlog):
            self._fail_caller(call, error(call))
        self.pending.clear()
        self.backlog.clear()
        self.out.clear()
        self.heartbeat = None
        self._ack = None

    def reset_after_fork(self) -> None:
        """In a child process: a new session, nothing in flight (the parent owns that)."""
        self.session_id = new_session_id()
        self.state_id = None
        self.pending.clear()
        self.backlog.clear()
        self.out.clear()
        self.finished.clear()
        self.events.clear()
        self.ready = False
        self.heartbeat = None
        self._ack = None
        self._answers = 0
