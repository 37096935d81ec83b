//! The client: one multiplexed connection, the session, and the table of requests in flight.
//!
//! One mutex, `Inner::state`, guards it all, the held locks' states included; none is held across
//! an `.await`.

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, Weak};
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use tokio::runtime::Handle;
use tokio::sync::{Notify, watch};
use tokio::task::JoinHandle;
use tokio::time::{Instant, sleep_until, timeout_at};

use crate::acquire::Acquire;
use crate::clock::{SuspendClock, Tick};
use crate::conn::{self, Dialer};
use crate::error::{Error, key_text};
use crate::lock::{Held, ReleaseFuture};
use crate::options::ClientOptions;
use crate::table::IdTable;
use crate::timers::Deadlines;
use crate::wire::{self, BusyLimit, InspectData, InspectFlags, InvalidField, Op, Request, Status};

/// A caller awaiting a request's answer, in the request's [`Pending`] entry: its ticket, the
/// index of a [`Slot`] in `State::slots` that holds the caller's waker and then the answer
/// ([`State::deliver`]), for the caller to take ([`Inner::poll_answer`]). A channel per request
/// cost an allocation and more atomic operations than the rest of the request's bookkeeping,
/// and the state's mutex is taken anyway.
///
/// The caller owns the slot: it frees it when it takes the answer or gives up
/// ([`Inner::forget_request`], withdrawing an acquire), taking its `Waiter` out of the table
/// first when the answer has not come. So a `Waiter` in the table always has its caller.
pub(crate) struct Waiter {
    ticket: usize,
}

impl Waiter {
    pub fn ticket(&self) -> usize {
        self.ticket
    }
}

/// Where a request's answer waits for its caller (see [`Waiter`]).
///
/// The waker stays in the slot after the answer is taken: a task mostly queues its next request
/// right after taking an answer, and gets the same slot back (the free slots are a stack), so
/// the waker it left there is still its own and need not be cloned again (nor the delivery's
/// reference to the task dropped): two updates of the task's reference count less per request.
#[derive(Default)]
pub(crate) struct Slot {
    waker: Option<Waker>,
    answer: Option<Result<Answer, Error>>,
}

/// What a request's waiter receives.
pub(crate) enum Answer {
    /// The server's answer.
    Reply(Reply),
    /// `ACQUIRE OK`: the lock `token`, its state already in the client's table (of `era`, see
    /// [`Held::era`]), registered for `EXPIRED` pushes and its deadline running.
    Granted { token: u64, era: u32 },
}

/// A response, owned.
#[derive(Debug)]
pub(crate) struct Reply {
    /// The request's id.
    pub id: u64,
    pub status: Status,
    pub token: u64,
    pub lease_ms: u32,
    pub detail: u32,
    pub data: Vec<u8>,
    /// When the request was first queued for the wire, on the lease clock.
    pub t_first: Tick,
}

/// A key, owned: up to [`Key::INLINE`] bytes in place, longer ones shared. Most keys are short:
/// in place, an acquire allocates nothing for its key, and the key's copies (the lock's, its
/// release's) cost a copy of 32 bytes rather than an update of a reference count each time one is
/// made or dropped.
#[derive(Clone)]
pub(crate) enum Key {
    Inline { len: u8, bytes: [u8; Key::INLINE] },
    Shared(Arc<[u8]>),
}

impl Key {
    /// The longest key kept in place.
    pub const INLINE: usize = 30;

    pub fn new(key: &[u8]) -> Key {
        if key.len() <= Key::INLINE {
            let mut bytes = [0u8; Key::INLINE];
            bytes[..key.len()].copy_from_slice(key);
            Key::Inline { len: key.len() as u8, bytes }
        } else {
            Key::Shared(Arc::from(key))
        }
    }
}

impl std::ops::Deref for Key {
    type Target = [u8];

    fn deref(&self) -> &[u8] {
        match self {
            Key::Inline { len, bytes } => &bytes[..usize::from(*len)],
            Key::Shared(k) => k,
        }
    }
}

impl AsRef<[u8]> for Key {
    fn as_ref(&self) -> &[u8] {
        self
    }
}

impl std::fmt::Debug for Key {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:?}", key_text(self))
    }
}

/// A request's fields, kept so that it can be sent again with its id after a resume.
#[derive(Clone, Debug)]
pub(crate) struct Req {
    pub op: Op,
    pub token: u64,
    pub lease_ms: u32,
    pub wait_ms: u32,
    pub key: Key,
    /// A [`Lock`](crate::Lock)'s own `RELEASE`: its `OK`, delivered to the caller, marks the
    /// lock released and takes it out of the deadline timers (under the state the answer is
    /// handled under, rather than locking it again).
    pub forget: bool,
}

impl Req {
    pub fn new(op: Op, key: Key) -> Req {
        Req { op, token: 0, lease_ms: 0, wait_ms: 0, key, forget: false }
    }

    fn encode(&self, id: u64, out: &mut Vec<u8>) {
        Request {
            op: self.op,
            flags: 0,
            id,
            token: self.token,
            lease_ms: self.lease_ms,
            wait_ms: self.wait_ms,
            key: &self.key,
        }
        .encode(out);
    }
}

/// A request without its answer yet.
pub(crate) struct Pending {
    pub req: Req,
    /// When the request was first queued for the wire, on the lease clock: a lock's
    /// deadline counts from it, whichever send of the request its answer answers (a re-send
    /// after a resume, or to another node, keeps it).
    pub first_sent: Tick,
    /// Sent again after a resume (a `NOT_HELD` to an `ACQUIRE` then means nothing is held for it).
    pub retried: bool,
    /// `None` for the client's own requests and for acquires whose caller gave up (a grant that
    /// still arrives for those is released).
    pub waiter: Option<Waiter>,
    /// An abandoned acquire that still needs its `CANCEL` (it was given up while disconnected).
    pub needs_cancel: bool,
    /// When the caller stops waiting for the answer (see [`Bound`]); `None`: never.
    pub deadline: Option<Instant>,
    /// Where `deadline` went in `State::deadlines` (see [`Deadlines::insert`]).
    pub late: bool,
}

/// How long a caller waits for the answer to its request.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Bound {
    /// Without limit.
    None,
    /// Until this instant (a call: the request timeout from its start).
    At(Instant),
    /// This long from when the request is queued (an acquire: its wait limit plus the request
    /// timeout).
    After(Duration),
}

/// A held lock that a request is for: its token, its state's era (see [`Held::era`]), its key.
#[derive(Clone, Copy)]
pub(crate) struct Gate<'a> {
    pub token: u64,
    pub era: u32,
    pub key: &'a Key,
}

/// Whether the request `id` still awaits its answer by the deadline `at`.
fn request_live(pending: &IdTable<Pending>, at: Instant, id: u64) -> bool {
    pending.get(id).is_some_and(|p| p.deadline == Some(at) && p.waiter.is_some())
}

/// The current connection's output: frames queued here reach the wire in order.
pub(crate) struct Outbox {
    pub buf: Vec<u8>,
    pub wake: Arc<Notify>,
    /// The writer has been woken and has not taken `buf` since: a frame queued now goes out with
    /// that pass, without waking it again.
    pub due: bool,
    /// Wakes the connection's heartbeat task while it sleeps out the idle interval (`beat_idle`)
    /// when a request is queued: a request waiting shortens the heartbeat to the busy one.
    pub beat: Arc<Notify>,
    /// The heartbeat task sleeps for the idle interval (no request waited when it looked).
    pub beat_idle: bool,
}

pub(crate) struct State {
    pub session_id: [u8; wire::SESSION_ID_LEN],
    pub next_id: u64,
    /// Where the next `ACK`'s walk starts (see [`State::ack_point`]); back to 1 with `next_id`.
    pub ack_from: u64,
    /// The state id of the first `WELCOME` (replaced when a restart is detected).
    pub state_id: Option<[u8; wire::STATE_ID_LEN]>,
    /// Session grace announced by the last `WELCOME`.
    pub grace: Duration,
    /// The connection's output; `None` while there is no connection.
    pub out: Option<Outbox>,
    /// Bumped at every connect and disconnect; a task that saw another epoch is stale.
    pub epoch: u64,
    /// Requests awaiting their answers, by id: ids are handed out in sequence and mostly answered
    /// soon, so each has its own place in an array indexed by id (see [`IdTable`]), where a hash
    /// map hashed, probed and moved entries on every insert and removal (and a B-tree shifted its
    /// nodes); the few walks in id order (resume, `ACK`) sort or scan.
    pub pending: IdTable<Pending>,
    /// Releases to send on the next connection to the same server (grants that raced a cancel
    /// while disconnected).
    pub deferred: Vec<Req>,
    /// The states of the locks granted through this client whose [`Lock`](crate::Lock)s are not
    /// dropped yet, by token (see [`Held`]). Tokens grow too (with gaps where other sessions took
    /// some), hence an [`IdTable`] as well.
    pub locks: IdTable<Held>,
    /// Bumped when the server is found restarted (see [`Held::era`]).
    pub era: u32,
    /// The lease clock: the locks' deadlines run on it (it counts suspends; see [`SuspendClock`]).
    pub lease_clock: SuspendClock,
    /// The lost times of the held locks, on `lease_clock`, by token, for the client's one timer
    /// task ([`run_timers`]): a task and a timer per lock cost a spawn, an abort and two updates
    /// of tokio's timer wheel.
    pub timers: Deadlines<Tick>,
    /// The deadlines of the requests callers wait for (`Pending::deadline`), by id, for the same
    /// task: a tokio timer per request (registered and removed under the timer driver's lock)
    /// cost more than the rest of the call.
    pub deadlines: Deadlines<Instant>,
    /// What the client's timer task ([`run_timers`]) sleeps until (`None`: until notified).
    pub timer_armed: Option<Instant>,
    pub answers_since_ack: u32,
    pub ack_outstanding: bool,
    pub closed: bool,
    /// The leader's address from `NOT_LEADER`/`GOAWAY`/`CHALLENGE`, tried first.
    pub hint: Option<String>,
    /// When the batch of answers the reader handled last arrived, until the writer next takes
    /// the output (see [`State::stamp`]).
    pub clock: Option<Instant>,
    /// `clock` is kept past the writer's next pass, which was queued before the batch's callers
    /// (and then comes round once more, after them).
    pub clock_kept: bool,
    /// Why the last reconnect round failed (or, before one did, why the connection ended): a
    /// call that times out while the client reconnects names it.
    pub last_error: Option<Error>,
    /// An error no retry fixes (auth failed, unsupported version) from the last reconnect round:
    /// calls that find no connection fail with it at once. Cleared by the next connection.
    pub fatal: Option<Error>,
    /// The index in the endpoint list where the next connect round starts (see
    /// [`conn::connect_round`]).
    pub next_endpoint: usize,
    /// The node whose connection the heartbeat found silent last, and until when it is neither
    /// dialled nor followed as a leader hint (see [`conn::connect_round`]).
    pub silent: Option<(String, Instant)>,
    /// The callers' answer slots, by [`Waiter`] ticket, and the free ones.
    slots: Vec<Slot>,
    free_slots: Vec<usize>,
}

/// Send an `ACK` after this many answers (at least once per [`wire::ACK_EVERY`]).
const ACK_AFTER: u32 = wire::ACK_EVERY / 2;

impl State {
    /// Queues `req` on the current connection and returns its id; `None` without a connection.
    pub fn queue(&mut self, req: Req, waiter: Option<Waiter>, now: Instant) -> Option<u64> {
        self.enqueue(req, waiter, now, (None, false)).ok()
    }

    /// The time to stamp a request queued now with: when the batch of answers that the callers
    /// now running react to arrived, if the writer has not taken the output since (the reader
    /// sets it, the writer's next pass clears it, and the reader wakes the writer for that pass),
    /// else the clock. A clock read per request cost more than the rest of queuing it.
    ///
    /// The stamp is never later than the request's send (the writer sends it after its next
    /// pass), so a lock's local deadline, counted from it, stays on the safe side; and it is
    /// earlier than the call only by the time the connection task waits to run again, which
    /// is what a request's timeout may then end early by.
    #[inline]
    pub fn stamp(&self) -> Instant {
        match self.clock {
            Some(t) => t,
            None => Instant::now(),
        }
    }

    /// A new waiter (a slot for its answer), woken through `waker` once set.
    #[inline]
    pub fn waiter(&mut self, waker: Option<&Waker>) -> Waiter {
        let ticket = match self.free_slots.pop() {
            Some(t) => t,
            None => {
                self.slots.push(Slot::default());
                self.slots.len() - 1
            }
        };
        let slot = &mut self.slots[ticket];
        match (waker, &slot.waker) {
            // The slot's last user again (see [`Slot`]).
            (Some(w), Some(k)) if k.will_wake(w) => {}
            (w, _) => slot.waker = w.cloned(),
        }
        Waiter { ticket }
    }

    /// Hands `answer` to the caller behind `w` and wakes it.
    #[inline]
    pub fn deliver(&mut self, w: Waiter, answer: Result<Answer, Error>) {
        deliver(&mut self.slots, w, answer);
    }

    /// The answer of the request queued with the waiter `ticket` (whose slot is then freed), or
    /// `Pending` (then `cx` is woken with it).
    #[inline]
    pub fn poll_answer(&mut self, ticket: usize, cx: &mut Context<'_>) -> Poll<Result<Answer, Error>> {
        if let Some(a) = self.take_answer(ticket) {
            return Poll::Ready(a);
        }
        let slot = &mut self.slots[ticket];
        match &slot.waker {
            Some(k) if k.will_wake(cx.waker()) => {}
            _ => slot.waker = Some(cx.waker().clone()),
        }
        Poll::Pending
    }

    /// The answer in the slot `ticket`, if it came; the slot is freed.
    #[inline]
    pub fn take_answer(&mut self, ticket: usize) -> Option<Result<Answer, Error>> {
        let answer = self.slots[ticket].answer.take()?;
        // Its waker stays, for the slot's next user (see [`Slot`]).
        self.free_slots.push(ticket);
        Some(answer)
    }

    /// Frees the slot `ticket` (its caller has its answer or gave up).
    pub fn free_slot(&mut self, ticket: usize) {
        self.slots[ticket].answer = None;
        self.free_slots.push(ticket);
    }

    /// [`queue`](State::queue), giving `req` back when there is no connection; `deadline` and
    /// `late` as in [`Pending`].
    // Inlined: the request and its entry are then built where they go rather than moved through
    // each call (a move per call cost more than the rest of the step).
    #[inline(always)]
    fn enqueue(
        &mut self,
        req: Req,
        waiter: Option<Waiter>,
        now: Instant,
        (deadline, late): (Option<Instant>, bool),
    ) -> Result<u64, Req> {
        let Some(out) = self.out.as_mut() else { return Err(req) };
        let id = self.next_id;
        self.next_id += 1;
        // The writer takes the whole buffer at once: woken once, until it takes it.
        req.encode(id, &mut out.buf);
        if !out.due {
            out.due = true;
            out.wake.notify_one();
        }
        if out.beat_idle {
            out.beat_idle = false;
            out.beat.notify_one();
        }
        let first_sent = self.lease_clock.at(now);
        let p = Pending { req, first_sent, retried: false, waiter, needs_cancel: false, deadline, late };
        self.pending.insert(id, p);
        Ok(id)
    }

    /// Queues a caller's request, answered through a new waiter woken by `waker` (or an error once
    /// `bound` passes); returns its id and ticket, or gives `req` back when there is no connection.
    /// `now`: the request's time (`None`: [`stamp`](State::stamp)).
    #[inline(always)]
    pub fn queue_call(
        &mut self,
        inner: &Inner,
        req: Req,
        waker: Option<&Waker>,
        now: Option<Instant>,
        bound: Bound,
    ) -> Result<(u64, usize), Req> {
        if self.out.is_none() {
            return Err(req);
        }
        let now = match now {
            Some(t) => t,
            None => self.stamp(),
        };
        let deadline = match bound {
            Bound::None => None,
            Bound::At(at) => Some(at),
            Bound::After(d) => now.checked_add(d),
        };
        let late = match deadline {
            None => false,
            Some(at) => {
                // In order up to a plain call's deadline: an acquire's long wait would otherwise
                // hold every later call out of the queue. (A call's own deadline, from its start,
                // and a bound no longer than the request timeout are never later.)
                let plain = match bound {
                    Bound::After(d) if d > inner.opts.request_timeout => now.checked_add(inner.opts.request_timeout),
                    _ => None,
                };
                let pending = &self.pending;
                let late = self
                    .deadlines
                    .insert(at, self.next_id, plain, pending.len(), |at, id| request_live(pending, at, id));
                self.arm(inner, at);
                late
            }
        };
        let waiter = self.waiter(waker);
        let ticket = waiter.ticket;
        match self.enqueue(req, Some(waiter), now, (deadline, late)) {
            Ok(id) => Ok((id, ticket)),
            Err(req) => {
                self.free_slot(ticket);
                Err(req)
            }
        }
    }

    /// Removes the request `id` (answered, or given up by its caller).
    #[inline]
    pub fn take_pending(&mut self, id: u64) -> Option<Pending> {
        let p = self.pending.remove(id)?;
        if let Some(at) = p.deadline {
            let pending = &self.pending;
            self.deadlines.remove(at, id, p.late, |at, id| request_live(pending, at, id));
        }
        Some(p)
    }

    /// Fails the callers whose requests' deadlines passed: a call is forgotten (not sent again
    /// after a resume), an acquire withdrawn (as when its caller drops it).
    fn expire(&mut self, now: Instant, request_timeout: Duration) {
        while let Some((at, id)) = self.deadlines.pop_due(now) {
            if !request_live(&self.pending, at, id) {
                continue;
            }
            let Some(p) = self.pending.get_mut(id) else { continue };
            let Some(waiter) = p.waiter.take() else { continue };
            p.deadline = None;
            if p.req.op == Op::ACQUIRE {
                // The bound the acquire was given (`Bound::After`).
                let timeout = Duration::from_millis(p.req.wait_ms.into()) + request_timeout;
                let what = format!("acquire of {:?}", key_text(&p.req.key));
                // Withdrawn: a grant that still comes is released.
                self.cancel_acquire(id, now);
                let source = self.reconnect_cause();
                self.deliver(waiter, Err(Error::Timeout { what, timeout, source }));
            } else {
                let op = p.req.op;
                self.pending.remove(id);
                let source = self.reconnect_cause();
                self.deliver(
                    waiter,
                    Err(Error::Timeout { what: op_name(op).into(), timeout: request_timeout, source }),
                );
            }
        }
        // What is left may have been answered: drop those at the front, so that the timer sleeps
        // until a live deadline.
        let pending = &self.pending;
        self.deadlines.drop_dead(|at, id| request_live(pending, at, id));
    }

    /// While the client has no connection: the last connect error, for a call that times out
    /// meanwhile (docs/clients.md, rule 1).
    fn reconnect_cause(&self) -> Option<crate::error::Cause> {
        if self.out.is_some() {
            return None;
        }
        self.last_error.clone().map(|e| Arc::new(e) as crate::error::Cause)
    }

    /// The earliest instant the timer task has to act at, from `now`: a lock's lost time, at
    /// the latest [`wire::LOST_CHECK_MS`] from now while a lock is held (tokio's timers stop
    /// while the host is suspended; the lease clock does not), or a request's deadline.
    fn next_timer(&self, now: Instant) -> Option<Instant> {
        let check = now + Duration::from_millis(wire::LOST_CHECK_MS.into());
        let lock = self.timers.first().map(|at| self.lease_clock.to_instant(at).min(check));
        match (lock, self.deadlines.first()) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// Makes sure the timer task wakes by `at`: wakes it when that is earlier than what it
    /// sleeps until (rare: deadlines mostly come in order).
    pub fn arm(&mut self, inner: &Inner, at: Instant) {
        if self.timer_armed.is_none_or(|t| at < t) {
            self.timer_armed = Some(at);
            inner.timer_wake.notify_one();
        }
    }

    /// Queues one of the client's own requests: now, or (a release) on the next connection.
    pub fn queue_internal(&mut self, req: Req, now: Instant) {
        if self.out.is_some() {
            self.queue(req, None, now);
        } else if req.op == Op::RELEASE {
            self.deferred.push(req);
        }
    }

    /// Withdraws the acquire `id` whose caller gave up: sends `CANCEL` now, or marks it for the
    /// next connection. Returns false when the acquire is no longer pending.
    pub fn abandon_acquire(&mut self, id: u64, now: Instant) -> bool {
        let Some(p) = self.pending.get_mut(id) else { return false };
        p.waiter = None;
        self.cancel_acquire(id, now)
    }

    /// Sends `CANCEL` for the acquire `id` now, or marks it for the next connection; its caller
    /// (if still waiting) gets the acquire's final answer. False when it is no longer pending.
    pub fn cancel_acquire(&mut self, id: u64, now: Instant) -> bool {
        if !self.pending.contains_key(id) {
            return false;
        }
        if self.out.is_some() {
            let mut cancel = Req::new(Op::CANCEL, empty_key());
            cancel.token = id;
            self.queue(cancel, None, now);
        } else if let Some(p) = self.pending.get_mut(id) {
            p.needs_cancel = true;
        }
        true
    }

    /// The `x` of an `ACK`: the lowest id still awaited that is not an `ACQUIRE`, else the next id.
    ///
    /// Walks the ids up from the last `ACK`'s point: every id below it was answered or is an
    /// acquire, and stays so (ids only grow, and a request keeps its op), so each id is looked up
    /// about once over all `ACK`s. A scan of the whole table per `ACK` touched every slot of it
    /// (about 4 times the requests in flight): 2.5% of the client's time at 1,024 in flight.
    fn ack_point(&mut self) -> u64 {
        let mut id = self.ack_from.max(1);
        while id < self.next_id {
            match self.pending.get(id) {
                Some(p) if p.req.op != Op::ACQUIRE => break,
                _ => id += 1,
            }
        }
        self.ack_from = id;
        id
    }

    pub fn maybe_ack(&mut self, now: Instant) {
        if self.answers_since_ack >= ACK_AFTER && !self.ack_outstanding && self.out.is_some() {
            let mut ack = Req::new(Op::ACK, empty_key());
            ack.token = self.ack_point();
            self.answers_since_ack = 0;
            self.ack_outstanding = true;
            self.queue(ack, None, now);
        }
    }

    /// Fails every waiter with `err` and forgets every request (a restart, a close).
    pub fn fail_all(&mut self, err: &Error) {
        for (_, p) in self.pending.drain() {
            if let Some(w) = p.waiter {
                self.deliver(w, Err(err.clone()));
            }
        }
        self.deadlines.clear();
        self.deferred.clear();
        self.ack_outstanding = false;
        self.answers_since_ack = 0;
    }

    /// The session could not be resumed in time: callers get `err`; acquires stay pending as
    /// abandoned (a resume still sends their `CANCEL` and releases a late grant), the client's
    /// own requests stay, the callers' other requests are forgotten.
    pub fn fail_waiters(&mut self, err: &Error) {
        let slots = &mut self.slots;
        self.pending.retain(|_, p| {
            let Some(w) = p.waiter.take() else { return true };
            deliver(slots, w, Err(err.clone()));
            if p.req.op == Op::ACQUIRE {
                p.needs_cancel = true;
                true
            } else {
                false
            }
        });
    }
}

#[inline]
fn deliver(slots: &mut [Slot], w: Waiter, answer: Result<Answer, Error>) {
    let slot = &mut slots[w.ticket];
    slot.answer = Some(answer);
    // Kept for the slot's next user (see [`Slot`]).
    if let Some(k) = &slot.waker {
        k.wake_by_ref();
    }
}

pub(crate) fn empty_key() -> Key {
    Key::Inline { len: 0, bytes: [0; Key::INLINE] }
}

/// Locks a mutex, recovering from poisoning (a panic elsewhere never makes the client panic).
pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

pub(crate) struct Inner {
    pub opts: ClientOptions,
    pub dialer: Dialer,
    pub state: Mutex<State>,
    /// Bumped whenever a connection is installed or lost, and at close.
    pub conn_tx: watch::Sender<u64>,
    /// True once the client is closed.
    pub closed_tx: watch::Sender<bool>,
    pub runtime: Handle,
    pub manager: Mutex<Option<JoinHandle<()>>>,
    /// Wakes the client's timer task ([`run_timers`]).
    pub timer_wake: Arc<Notify>,
}

impl Drop for Inner {
    fn drop(&mut self) {
        // The deadline timer holds the client weakly: let it see that the client is gone.
        self.timer_wake.notify_one();
    }
}

/// A request queued on the wire, whose answer its caller awaits ([`Inner::poll_answer`]).
pub(crate) struct Sent {
    pub id: u64,
    pub ticket: usize,
    /// Queued with the waker of the task that queued it, in the same poll: that poll may return
    /// `Pending` without looking for the answer (its delivery wakes the task).
    pub registered: bool,
}

impl Sent {
    /// The answer, as a future.
    pub fn answer(self, inner: &Inner) -> AnswerFuture<'_> {
        AnswerFuture { inner, ticket: self.ticket, fresh: self.registered }
    }
}

/// Resolves to the answer of a [`Sent`] request. Dropping it does not withdraw the request: its
/// owner does that ([`Inner::forget_request`], or withdrawing an acquire).
pub(crate) struct AnswerFuture<'a> {
    inner: &'a Inner,
    ticket: usize,
    fresh: bool,
}

impl Future for AnswerFuture<'_> {
    type Output = Result<Answer, Error>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        if std::mem::take(&mut self.fresh) {
            return Poll::Pending;
        }
        self.inner.poll_answer(self.ticket, cx)
    }
}

/// What [`Inner::try_send`] did.
pub(crate) enum Queued {
    Sent(Sent),
    /// Nothing: there is no connection. The request comes back, with a watch of the connection
    /// (subscribed with the state held: a connection installed later is announced later).
    NoConnection(Req, watch::Receiver<u64>),
}

impl Inner {
    pub fn lock_state(&self) -> MutexGuard<'_, State> {
        lock(&self.state)
    }

    /// Queues `req` once there is a connection, waiting for one until `deadline`; its answer is
    /// awaited within `bound`. `now` is the time of the call (read once: the clock is not free).
    /// With `gate`, the lock's state is checked as the frame is queued (under the same mutex),
    /// so that nothing is sent for a lock whose release has begun.
    pub async fn send(
        &self,
        req: Req,
        deadline: Instant,
        gate: Option<&Gate<'_>>,
        now: Instant,
        bound: Bound,
    ) -> Result<Sent, Error> {
        match self.try_send(req, gate, Some(now), bound, None)? {
            Queued::Sent(sent) => Ok(sent),
            // Boxed: the wait (a timer, a watch) would otherwise make every call's future that
            // much larger.
            Queued::NoConnection(req, conn_rx) => {
                Box::pin(self.send_when_connected(req, deadline, gate, bound, conn_rx)).await
            }
        }
    }

    /// Queues `req` if there is a connection, without waiting for one; `waker` (the calling
    /// task's, in this poll) is woken with the answer. `now`: the request's time (`None`:
    /// [`State::stamp`]).
    #[inline(always)]
    pub fn try_send(
        &self,
        req: Req,
        gate: Option<&Gate<'_>>,
        now: Option<Instant>,
        bound: Bound,
        waker: Option<&Waker>,
    ) -> Result<Queued, Error> {
        let mut st = self.lock_state();
        if let Some(g) = gate {
            st.gate(g, now)?;
        }
        if st.closed {
            return Err(Error::Closed);
        }
        let registered = waker.is_some();
        Ok(match st.queue_call(self, req, waker, now, bound) {
            Ok((id, ticket)) => Queued::Sent(Sent { id, ticket, registered }),
            Err(req) => match &st.fatal {
                // The last reconnect round failed in a way no retry fixes.
                Some(e) => return Err(e.clone()),
                None => Queued::NoConnection(req, self.conn_tx.subscribe()),
            },
        })
    }

    async fn send_when_connected(
        &self,
        mut req: Req,
        deadline: Instant,
        gate: Option<&Gate<'_>>,
        bound: Bound,
        mut conn_rx: watch::Receiver<u64>,
    ) -> Result<Sent, Error> {
        loop {
            match timeout_at(deadline, conn_rx.changed()).await {
                Ok(Ok(())) => {}
                Ok(Err(_)) => return Err(Error::Closed),
                Err(_) => return Err(self.no_connection_error(req.op)),
            }
            match self.try_send(req, gate, Some(Instant::now()), bound, None)? {
                Queued::Sent(sent) => return Ok(sent),
                Queued::NoConnection(r, rx) => (req, conn_rx) = (r, rx),
            }
        }
    }

    /// The error of a call `op` whose timeout passed while it waited for a connection: a
    /// timeout, naming the last connect error (docs/clients.md, rule 1).
    fn no_connection_error(&self, op: Op) -> Error {
        let st = self.lock_state();
        if st.closed {
            return Error::Closed;
        }
        let source = st.last_error.clone().map(|e| Arc::new(e) as crate::error::Cause);
        let what = match &source {
            Some(_) => op_name(op).to_owned(),
            None => format!("{} (waiting for a connection)", op_name(op)),
        };
        Error::Timeout { what, timeout: self.opts.request_timeout, source }
    }

    /// Sends `req` and waits for its answer, all within the request timeout. A request given up
    /// (timeout or drop) is forgotten: it is not sent again after a resume.
    pub async fn call(&self, req: Req, gate: Option<&Gate<'_>>) -> Result<Reply, Error> {
        let timeout = self.opts.request_timeout;
        let op = req.op;
        // Queued with the calling task's waker, in this poll (no clone of it when the task's last
        // request left it in the slot). At the deadline (the request timeout from the request's
        // stamp, see `State::stamp`) the timer task fails the call with `Error::Timeout` and
        // forgets it. (`send`, spelled out: one future less to step through.)
        let mut req = Some(req);
        let queued = std::future::poll_fn(|cx| {
            let Some(req) = req.take() else { return Poll::Ready(Err(Error::Closed)) };
            Poll::Ready(self.try_send(req, gate, None, Bound::After(timeout), Some(cx.waker())))
        })
        .await?;
        let sent = match queued {
            Queued::Sent(sent) => sent,
            Queued::NoConnection(req, conn_rx) => return Box::pin(self.call_connected(req, gate, conn_rx)).await,
        };
        self.reply(sent, op).await
    }

    /// [`call`](Inner::call) for a request that found no connection (`conn_rx` from
    /// [`try_send`](Inner::try_send)): waits for one, then for the answer, within the request
    /// timeout from now.
    pub async fn call_when_connected(&self, req: Req, conn_rx: watch::Receiver<u64>) -> Result<Reply, Error> {
        self.call_connected(req, None, conn_rx).await
    }

    async fn call_connected(
        &self,
        req: Req,
        gate: Option<&Gate<'_>>,
        conn_rx: watch::Receiver<u64>,
    ) -> Result<Reply, Error> {
        let op = req.op;
        // Waiting for a connection counts against the request timeout too.
        let deadline = Instant::now() + self.opts.request_timeout;
        let bound = Bound::At(deadline);
        let sent = self.send_when_connected(req, deadline, gate, bound, conn_rx).await?;
        self.reply(sent, op).await
    }

    /// Waits for the answer of `sent` (a request `op` that is not an acquire); dropped meanwhile,
    /// the request is forgotten.
    async fn reply(&self, sent: Sent, op: Op) -> Result<Reply, Error> {
        let mut forget = ForgetOnDrop { inner: self, id: Some((sent.id, sent.ticket)) };
        let answer = sent.answer(self).await;
        forget.id = None;
        reply_of(op, answer)
    }

    /// The answer of the request queued with the waiter `ticket` (whose slot is then freed), or
    /// `Pending` (then `cx` is woken with it).
    #[inline]
    pub fn poll_answer(&self, ticket: usize, cx: &mut Context<'_>) -> Poll<Result<Answer, Error>> {
        self.lock_state().poll_answer(ticket, cx)
    }

    /// The caller of the request `id` (waiter `ticket`) gives up on it: it is forgotten, or its
    /// answer, already delivered, dropped.
    pub fn forget_request(&self, id: u64, ticket: usize) {
        let mut st = self.lock_state();
        if st.take_answer(ticket).is_none() {
            st.take_pending(id);
            st.free_slot(ticket);
        }
    }

    /// [`Client::close`]'s first step: every acquire on the wire whose caller waits fails with
    /// [`Error::Closed`] and is withdrawn (`CANCEL`); waits, at most the cleanup timeout, until
    /// the server has answered each (a grant that raced the withdrawal is then released, and that
    /// release answered too).
    async fn withdraw_acquires(&self) {
        let withdrawn: Vec<u64> = {
            let mut st = self.lock_state();
            if st.closed || st.out.is_none() {
                return;
            }
            let ids: Vec<u64> = st
                .pending
                .iter()
                .filter(|(_, p)| p.req.op == Op::ACQUIRE && p.waiter.is_some())
                .map(|(id, _)| id)
                .collect();
            let now = Instant::now();
            for &id in &ids {
                let Some(w) = st.pending.get_mut(id).and_then(|p| p.waiter.take()) else { continue };
                st.deliver(w, Err(Error::Closed));
                st.cancel_acquire(id, now);
            }
            ids
        };
        if withdrawn.is_empty() {
            return;
        }
        let deadline = Instant::now() + self.opts.cleanup_timeout;
        // Polled: a close is rare, and its wait short.
        while Instant::now() < deadline {
            let settled = {
                let st = self.lock_state();
                // Without a connection nothing more can be withdrawn (the server drops the
                // session's waits when its grace ends).
                st.closed
                    || st.out.is_none()
                    || (withdrawn.iter().all(|&id| !st.pending.contains_key(id))
                        && !st.pending.values().any(|p| p.req.op == Op::RELEASE && p.waiter.is_none()))
            };
            if settled {
                return;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    /// Marks the client closed and fails everything in flight (no I/O but a best-effort `CANCEL`
    /// of the acquires still on the wire, flushed as the connection closes).
    pub fn shut(&self) {
        {
            let mut st = self.lock_state();
            if st.closed {
                return;
            }
            if st.out.is_some() {
                let acquires: Vec<u64> =
                    st.pending.iter().filter(|(_, p)| p.req.op == Op::ACQUIRE).map(|(id, _)| id).collect();
                let now = Instant::now();
                for id in acquires {
                    let mut cancel = Req::new(Op::CANCEL, empty_key());
                    cancel.token = id;
                    st.queue(cancel, None, now);
                }
            }
            st.closed = true;
            st.fail_all(&Error::Closed);
        }
        self.closed_tx.send_replace(true);
        self.conn_tx.send_modify(|v| *v += 1);
    }
}

/// The client's one timer task: sleeps until the earliest of the locks' lost times
/// (`State::timers`; while a lock is held, at most [`wire::LOST_CHECK_MS`]) and the requests'
/// deadlines (`State::deadlines`), fires the locks whose time came on the lease clock and fails
/// the requests whose time came, and sleeps again. `wake` is notified when something is due
/// earlier than what it sleeps until, and when the client goes away. A task and a timer per lock,
/// and a timer per request, cost far more.
pub(crate) async fn run_timers(weak: Weak<Inner>, wake: Arc<Notify>) {
    let mut next: Option<Instant> = None;
    loop {
        match next {
            Some(at) => {
                tokio::select! {
                    biased;
                    () = wake.notified() => {}
                    () = sleep_until(at) => {}
                }
            }
            None => wake.notified().await,
        }
        let Some(inner) = weak.upgrade() else { return };
        let now = Instant::now();
        let mut st = inner.lock_state();
        let tick = st.lease_clock.now();
        st.fire_due_locks(tick);
        st.expire(now, inner.opts.request_timeout);
        next = st.next_timer(now);
        st.timer_armed = next;
    }
}

fn op_name(op: Op) -> &'static str {
    match op {
        Op::ACQUIRE => "acquire",
        Op::RELEASE => "release",
        Op::EXTEND => "extend",
        Op::CANCEL => "cancel",
        Op::PING => "ping",
        Op::INSPECT => "inspect",
        Op::ACK => "ack",
        _ => "request",
    }
}

/// Forgets a request whose caller stops waiting before it has the answer (see
/// [`Inner::forget_request`]).
pub(crate) struct ForgetOnDrop<'a> {
    pub inner: &'a Inner,
    /// The request's id and waiter ticket, until its answer is taken.
    pub id: Option<(u64, usize)>,
}

impl Drop for ForgetOnDrop<'_> {
    fn drop(&mut self) {
        if let Some((id, ticket)) = self.id {
            self.inner.forget_request(id, ticket);
        }
    }
}

/// Maps a non-OK answer to its error.
pub(crate) fn status_error(op: Op, r: &Reply, key: &[u8], token: u64, wait: Duration) -> Error {
    let message = String::from_utf8_lossy(&r.data).into_owned();
    match r.status {
        Status::TIMED_OUT => Error::NotAcquired { key: key_text(key), wait, message },
        Status::NOT_HELD => Error::NotHeld { key: key_text(key), token },
        Status::INVALID => Error::InvalidArgument { field: Some(InvalidField(r.detail)), message },
        Status::BUSY => Error::Busy { limit: BusyLimit(r.detail), message },
        Status::SHUTTING_DOWN => Error::ShuttingDown { message },
        Status::CANCELLED => Error::Cancelled { key: key_text(key) },
        status => Error::Status { op, status, detail: r.detail, message },
    }
}

/// Checks a key: 1..=65535 bytes.
pub(crate) fn check_key(key: &[u8]) -> Result<Key, Error> {
    check_key_len(key)?;
    Ok(Key::new(key))
}

/// Checks a key's length: 1..=65535 bytes.
pub(crate) fn check_key_len(key: &[u8]) -> Result<(), Error> {
    if key.is_empty() {
        return Err(Error::invalid(Some(InvalidField::KEY), "key must not be empty"));
    }
    if key.len() > wire::MAX_KEY_LEN {
        return Err(Error::invalid(
            Some(InvalidField::KEY),
            format!("key is {} bytes, longer than the most the protocol allows ({})", key.len(), wire::MAX_KEY_LEN),
        ));
    }
    Ok(())
}

/// Converts a lease to whole milliseconds (rounded up: never less than asked): 1 ms ..= 2^32-1 ms.
pub(crate) fn lease_ms(lease: Duration) -> Result<u32, Error> {
    let ms = ceil_ms(lease);
    if lease < Duration::from_millis(1) {
        return Err(Error::invalid(
            Some(InvalidField::LEASE),
            format!("lease must be at least 1 ms (a Duration; got {lease:?})"),
        ));
    }
    u32::try_from(ms)
        .map_err(|_| Error::invalid(Some(InvalidField::LEASE), format!("lease must be below 2^32 ms (got {lease:?})")))
}

/// Converts a wait timeout to milliseconds (rounded up); `None` and anything from 2^32-1 ms on is
/// "without limit".
pub(crate) fn wait_ms(wait: Option<Duration>) -> u32 {
    match wait {
        None => wire::WAIT_FOREVER,
        Some(w) => u32::try_from(ceil_ms(w)).unwrap_or(wire::WAIT_FOREVER),
    }
}

/// `d` in whole milliseconds, rounded up (saturating): `d.as_nanos().div_ceil(1_000_000)`
/// without its 128-bit division.
fn ceil_ms(d: Duration) -> u64 {
    d.as_secs().saturating_mul(1000).saturating_add(u64::from(d.subsec_nanos().div_ceil(1_000_000)))
}

pub(crate) fn check_token(token: u64) -> Result<(), Error> {
    if token == 0 {
        return Err(Error::invalid(Some(InvalidField::TOKEN), "token must be positive (tokens start at 1)"));
    }
    Ok(())
}

/// What `INSPECT` says about a key.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct Inspection {
    /// Somebody holds the key.
    pub held: bool,
    /// Acquires queued on the key.
    pub waiters: u32,
    /// Time left on the holder's lease.
    pub lease_left: Duration,
    /// Time since the lock was granted.
    pub held_for: Duration,
    /// Lock-delay left before the key can be granted again (after an expiry).
    pub lock_delay_left: Duration,
    /// The key waits for storage before its next grant.
    pub stalled: bool,
    /// The server is in its start-up wait (a restarted single node waiting out the leases granted
    /// before its restart): no grant before it ends; [`lock_delay_left`](Self::lock_delay_left)
    /// is the time left.
    pub startup: bool,
    /// The holder's token: shown only to the holding session, or when the token asked about is
    /// the holder's.
    pub token: Option<u64>,
    /// The token asked about is the holder's.
    pub token_matches: bool,
    /// This client's session holds the key.
    pub held_by_this_session: bool,
}

impl Inspection {
    pub(crate) fn from_reply(r: &Reply) -> Result<Inspection, Error> {
        let data = InspectData::decode(&r.data).ok_or_else(|| Error::Protocol {
            message: format!("INSPECT answer carries {} data bytes, not {}", r.data.len(), wire::INSPECT_DATA_LEN),
        })?;
        let flags = data.flags;
        let token_matches = flags.contains(InspectFlags::TOKEN_MATCH);
        let held_by_this_session = flags.contains(InspectFlags::SESSION);
        Ok(Inspection {
            held: flags.contains(InspectFlags::HELD),
            waiters: r.detail,
            lease_left: Duration::from_millis(r.lease_ms.into()),
            held_for: Duration::from_millis(data.held_for_ms.into()),
            lock_delay_left: Duration::from_millis(data.lock_delay_ms.into()),
            stalled: flags.contains(InspectFlags::STALLED),
            startup: flags.contains(InspectFlags::STARTUP),
            token: (token_matches || held_by_this_session).then_some(r.token),
            token_matches,
            held_by_this_session,
        })
    }
}

struct ClientRef {
    inner: Arc<Inner>,
}

impl Drop for ClientRef {
    fn drop(&mut self) {
        // The last handle is gone: stop the connection in the background. Locks keep running
        // their lease on the server.
        self.inner.shut();
    }
}

/// A connection to a Ticketing server or cluster, safe to share between tasks: clone it freely
/// (clones share one connection and one session).
///
/// Every call is pipelined on one connection and answers are matched by request id, so an acquire
/// waiting in a queue never holds back other calls. If the connection drops, the client
/// reconnects in the background (the endpoints in order, the leader hint first, with backoff) and
/// resumes its session: calls in flight are sent again with their original request ids and
/// acquires keep their queue places. Locks survive a reconnect.
///
/// Dropping the last handle (including the one inside each [`Lock`](crate::Lock)) closes the
/// connection; [`close`](Client::close) closes it at once. Neither releases held locks unless
/// [`ClientOptions::release_on_close`] is set: the server keeps them until their lease ends.
#[derive(Clone)]
pub struct Client {
    handle: Arc<ClientRef>,
}

impl std::fmt::Debug for Client {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let st = self.inner().lock_state();
        f.debug_struct("Client")
            .field("endpoints", &self.inner().opts.endpoints)
            .field("session_id", &hex(&st.session_id))
            .field("connected", &st.out.is_some())
            .field("closed", &st.closed)
            .finish()
    }
}

pub(crate) fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// The reply in the answer to a request `op` that is not an acquire: a grant is a protocol error.
pub(crate) fn reply_of(op: Op, answer: Result<Answer, Error>) -> Result<Reply, Error> {
    match answer {
        Ok(Answer::Reply(r)) => Ok(r),
        Ok(Answer::Granted { .. }) => Err(Error::Protocol { message: format!("{op} answered as a grant") }),
        Err(e) => Err(e),
    }
}

/// [`Client::connect`]'s connect. A failed round fails at once (an address nobody serves, a server
/// that is down: the mistake shows at once), except one in which a node answered `NOT_LEADER`: the
/// cluster is electing a leader, as when the application and the cluster start together. Such
/// rounds are retried at the shortest reconnect backoff until the request timeout has passed since
/// the connect began; then the last round's error is returned. Dropping the future cancels it.
async fn first_connect(inner: &Inner) -> Result<conn::Established, Error> {
    // `None`: a request timeout too large to add to the clock, never reached.
    let give_up = Instant::now().checked_add(inner.opts.request_timeout);
    loop {
        match conn::connect_round(inner).await {
            Ok(est) => return Ok(est),
            Err(f) if !f.not_leader => return Err(f.error),
            Err(f) => {
                let pause = conn::backoff(&inner.opts, 1);
                if give_up.is_some_and(|t| t.saturating_duration_since(Instant::now()) < pause) {
                    return Err(f.error);
                }
                tokio::time::sleep(pause).await;
            }
        }
    }
}

impl Client {
    /// Connects to the first endpoint that completes the handshake, following a leader hint, and
    /// returns the client.
    ///
    /// Fails with [`Error::AuthFailed`], [`Error::UnsupportedVersion`] or [`Error::Tls`] at once,
    /// and with [`Error::Unavailable`] when no endpoint could be reached within its dial timeout.
    /// A round in which a node answered `NOT_LEADER` (a cluster electing a leader) is tried again
    /// at the shortest reconnect backoff until the request timeout has passed since the call
    /// began, then fails [`Error::Unavailable`]; dropping the future stops it.
    /// Must be called within a tokio runtime, which then runs the client's background task.
    pub async fn connect(options: ClientOptions) -> Result<Client, Error> {
        if options.endpoints.is_empty() {
            return Err(Error::invalid(None, "no endpoints given"));
        }
        let Ok(runtime) = Handle::try_current() else {
            return Err(Error::invalid(None, "Client::connect must run inside a tokio runtime"));
        };
        let dialer = Dialer::new(&options)?;
        let mut session_id = [0u8; wire::SESSION_ID_LEN];
        conn::fill_random(&mut session_id)?;
        let state = State {
            session_id,
            next_id: 1,
            ack_from: 1,
            state_id: None,
            grace: Duration::ZERO,
            out: None,
            epoch: 0,
            pending: IdTable::default(),
            deferred: Vec::new(),
            locks: IdTable::default(),
            era: 0,
            lease_clock: SuspendClock::new(options.wall_clock.clone()),
            timers: Deadlines::default(),
            deadlines: Deadlines::default(),
            timer_armed: None,
            answers_since_ack: 0,
            ack_outstanding: false,
            closed: false,
            hint: None,
            clock: None,
            clock_kept: false,
            last_error: None,
            fatal: None,
            next_endpoint: 0,
            silent: None,
            slots: Vec::new(),
            free_slots: Vec::new(),
        };
        let inner = Arc::new(Inner {
            opts: options,
            dialer,
            state: Mutex::new(state),
            conn_tx: watch::Sender::new(0),
            closed_tx: watch::Sender::new(false),
            runtime,
            manager: Mutex::new(None),
            timer_wake: Arc::new(Notify::new()),
        });
        let established = first_connect(&inner).await?;
        let first = match conn::install(&inner, established) {
            Ok(c) => c,
            Err(_) => return Err(Error::connection_lost("the connection could not be installed")),
        };
        inner.runtime.spawn(run_timers(Arc::downgrade(&inner), inner.timer_wake.clone()));
        let task = inner.runtime.spawn(conn::manage(inner.clone(), first));
        *lock(&inner.manager) = Some(task);
        Ok(Client { handle: Arc::new(ClientRef { inner }) })
    }

    pub(crate) fn inner(&self) -> &Arc<Inner> {
        &self.handle.inner
    }

    /// The client's 16-byte session id (random, kept across reconnects; a new one after a server
    /// restart).
    pub fn session_id(&self) -> [u8; 16] {
        self.inner().lock_state().session_id
    }

    /// Starts acquiring the lock on `key` (any non-empty string or bytes, at most 65,535) for
    /// `lease` (at least 1 ms; the lease starts when the lock is granted). Await the returned
    /// builder to wait in the key's FIFO queue without limit, or set
    /// [`wait`](Acquire::wait) first:
    ///
    /// ```no_run
    /// # async fn f(client: ticketing::Client) -> Result<(), ticketing::Error> {
    /// use std::time::Duration;
    /// let lock = client.acquire("order-1234", Duration::from_secs(30)).wait(Duration::from_secs(5)).await?;
    /// # Ok(()) }
    /// ```
    ///
    /// Dropping the future before it completes withdraws the request from the queue (`CANCEL`)
    /// and releases a grant that raced the cancellation, in the background: a cancelled acquire
    /// never leaves a lock held. Acquiring a key this client already holds queues behind itself
    /// unless [`refuse_held`](Acquire::refuse_held) is set.
    pub fn acquire(&self, key: impl AsRef<[u8]>, lease: Duration) -> Acquire {
        Acquire::new(self.clone(), key.as_ref(), lease)
    }

    /// Tries once to take the lock on `key`: `Ok(None)` when somebody else holds it (or it is
    /// queued for), without waiting.
    pub async fn try_acquire(&self, key: impl AsRef<[u8]>, lease: Duration) -> Result<Option<crate::Lock>, Error> {
        match self.acquire(key, lease).wait(Duration::ZERO).await {
            Ok(lock) => Ok(Some(lock)),
            Err(Error::NotAcquired { .. }) => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Runs `body` while holding the lock on `key` (waiting without limit), then releases it.
    /// Returns [`Error::LockLost`] when the lock was lost while the body ran. Shorthand for
    /// `client.acquire(key, lease).run(body)`; see [`Acquire::run`].
    pub async fn with_lock<T, F>(&self, key: impl AsRef<[u8]>, lease: Duration, body: F) -> Result<T, Error>
    where
        F: AsyncFnOnce(&crate::Lock) -> T,
    {
        self.acquire(key, lease).run(body).await
    }

    /// Releases the lock on `key` held with `token`, from any client: the token is the owner.
    /// Fails with [`Error::NotHeld`] when the token does not hold the key (expired, released,
    /// wrong): nothing changed. Prefer [`Lock::release`](crate::Lock::release) when you have the
    /// lock.
    pub async fn release(&self, key: impl AsRef<[u8]>, token: u64) -> Result<(), Error> {
        let key = check_key(key.as_ref())?;
        check_token(token)?;
        let mut req = Req::new(Op::RELEASE, key.clone());
        req.token = token;
        let r = self.inner().call(req, None).await?;
        match r.status {
            Status::OK => Ok(()),
            _ => Err(status_error(Op::RELEASE, &r, &key, token, Duration::ZERO)),
        }
    }

    /// Sets the lease of the lock on `key` held with `token` to `lease` from now, from any client,
    /// and returns the lease granted. Fails with [`Error::NotHeld`] when the token does not hold
    /// the key. Prefer [`Lock::extend`](crate::Lock::extend), which also moves the lock's deadline.
    pub async fn extend(&self, key: impl AsRef<[u8]>, token: u64, lease: Duration) -> Result<Duration, Error> {
        let key = check_key(key.as_ref())?;
        check_token(token)?;
        let mut req = Req::new(Op::EXTEND, key.clone());
        req.token = token;
        req.lease_ms = lease_ms(lease)?;
        let r = self.inner().call(req, None).await?;
        match r.status {
            Status::OK => Ok(Duration::from_millis(r.lease_ms.into())),
            _ => Err(status_error(Op::EXTEND, &r, &key, token, Duration::ZERO)),
        }
    }

    /// Asks the server about `key`: holder, lease left, queue length, lock-delay. Changes nothing.
    pub async fn inspect(&self, key: impl AsRef<[u8]>) -> Result<Inspection, Error> {
        self.inspect_token(key.as_ref(), 0).await
    }

    pub(crate) async fn inspect_token(&self, key: &[u8], token: u64) -> Result<Inspection, Error> {
        let key = check_key(key)?;
        let mut req = Req::new(Op::INSPECT, key.clone());
        req.token = token;
        let r = self.inner().call(req, None).await?;
        match r.status {
            Status::OK => Inspection::from_reply(&r),
            _ => Err(status_error(Op::INSPECT, &r, &key, token, Duration::ZERO)),
        }
    }

    /// Sends `PING` and returns the round-trip time.
    pub async fn ping(&self) -> Result<Duration, Error> {
        let start = Instant::now();
        let r = self.inner().call(Req::new(Op::PING, empty_key()), None).await?;
        match r.status {
            Status::OK => Ok(start.elapsed()),
            _ => Err(status_error(Op::PING, &r, &[], 0, Duration::ZERO)),
        }
    }

    /// Whether this client holds a lock on `key` that is neither released nor lost.
    pub fn holds(&self, key: impl AsRef<[u8]>) -> bool {
        let key = key.as_ref();
        self.inner().lock_state().locks.values().any(|h| h.is_held() && *h.key == *key)
    }

    /// Closes the client: calls in flight fail with [`Error::Closed`], keep-alive stops, and later
    /// calls fail with [`Error::Closed`].
    ///
    /// Acquires still queued on the server are withdrawn first: their callers get
    /// [`Error::Closed`] at once, `CANCEL` goes to the server, and `close` waits (at most the
    /// [`cleanup_timeout`](ClientOptions::cleanup_timeout)) for the server to confirm, releasing a
    /// grant that raced the withdrawal: a closed client is never granted a lock it would hold
    /// until its session ends. (Without a connection nothing can be withdrawn: the server drops
    /// the session's waits when its grace ends.)
    ///
    /// Locks still held are not released (the server keeps them until their lease ends) unless
    /// [`ClientOptions::release_on_close`] is set, in which case they are released first, each
    /// bounded by the request timeout. Returns within a few seconds even when the server does not
    /// answer. Idempotent.
    pub async fn close(&self) {
        let inner = self.inner();
        inner.withdraw_acquires().await;
        if inner.opts.release_on_close {
            let locks: Vec<(u64, u32, Key)> = {
                let st = inner.lock_state();
                let held = st.locks.iter().filter(|(_, h)| h.is_held());
                if st.closed { Vec::new() } else { held.map(|(token, h)| (token, h.era, h.key.clone())).collect() }
            };
            let mut tasks = Vec::new();
            for (token, era, key) in locks {
                let inner = inner.clone();
                tasks.push(inner.runtime.clone().spawn(async move {
                    let _ = ReleaseFuture::new(&inner, Gate { token, era, key: &key }).await;
                }));
            }
            for t in tasks {
                let _ = t.await;
            }
        }
        inner.shut();
        let task = lock(&inner.manager).take();
        if let Some(mut task) = task {
            // The manager flushes what is queued (bounded) and stops; never wait long for it.
            if tokio::time::timeout(Duration::from_secs(2), &mut task).await.is_err() {
                task.abort();
            }
        }
    }
}
