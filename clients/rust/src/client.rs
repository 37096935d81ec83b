//! The client: one multiplexed connection, the session, and the table of requests in flight.
//!
//! Lock ordering: a lock's `LockShared::state` may be taken before `Inner::state`, never the
//! other way round. Code holding `Inner::state` collects what it must do to locks (fire lost,
//! forget a grant) and does it after letting go. No mutex is held across an `.await`.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, Weak};
use std::time::Duration;

use tokio::runtime::Handle;
use tokio::sync::{Notify, oneshot, watch};
use tokio::task::JoinHandle;
use tokio::time::{Instant, timeout_at};

use crate::acquire::Acquire;
use crate::conn::{self, Dialer};
use crate::error::{Error, key_text};
use crate::lock::LockShared;
use crate::options::ClientOptions;
use crate::wire::{self, BusyLimit, InspectData, InspectFlags, InvalidField, Op, Request, Status};

/// The sender half that completes one request.
pub(crate) type Waiter = oneshot::Sender<Result<Answer, Error>>;

/// What a request's waiter receives.
pub(crate) enum Answer {
    /// The server's answer.
    Reply(Reply),
    /// `ACQUIRE OK`: the lock, already registered for `EXPIRED` pushes and its deadline running.
    Granted(Arc<LockShared>),
}

/// A response, owned.
#[derive(Debug)]
pub(crate) struct Reply {
    pub status: Status,
    pub token: u64,
    pub lease_ms: u32,
    pub detail: u32,
    pub data: Vec<u8>,
    /// When the request was (last) queued for the wire.
    pub t_send: Instant,
}

/// A request's fields, kept so that it can be sent again with its id after a resume.
#[derive(Clone, Debug)]
pub(crate) struct Req {
    pub op: Op,
    pub token: u64,
    pub lease_ms: u32,
    pub wait_ms: u32,
    pub key: Arc<[u8]>,
}

impl Req {
    pub fn new(op: Op, key: Arc<[u8]>) -> Req {
        Req { op, token: 0, lease_ms: 0, wait_ms: 0, key }
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
    /// When the request was first queued for the wire.
    pub first_sent: Instant,
    /// When it was last queued (its first send, or its re-send after a resume).
    pub t_send: Instant,
    /// Sent again after a resume (an `ACQUIRE OK` then also bounds its deadline from the re-send).
    pub retried: bool,
    /// `None` for the client's own requests and for acquires whose caller gave up (a grant that
    /// still arrives for those is released).
    pub waiter: Option<Waiter>,
    /// An abandoned acquire that still needs its `CANCEL` (it was given up while disconnected).
    pub needs_cancel: bool,
}

/// The current connection's output: frames queued here reach the wire in order.
pub(crate) struct Outbox {
    pub buf: Vec<u8>,
    pub wake: Arc<Notify>,
}

pub(crate) struct State {
    pub session_id: [u8; wire::SESSION_ID_LEN],
    pub next_id: u64,
    /// The state id of the first `WELCOME` (replaced when a restart is detected).
    pub state_id: Option<[u8; wire::STATE_ID_LEN]>,
    /// Session grace announced by the last `WELCOME`.
    pub grace: Duration,
    /// The connection's output; `None` while there is no connection.
    pub out: Option<Outbox>,
    /// Bumped at every connect and disconnect; a task that saw another epoch is stale.
    pub epoch: u64,
    pub pending: BTreeMap<u64, Pending>,
    /// Releases to send on the next connection to the same server (grants that raced a cancel
    /// while disconnected).
    pub deferred: Vec<Req>,
    /// Locks held through this client, by token (for `EXPIRED`, restarts, refuse-held).
    pub locks: HashMap<u64, Weak<LockShared>>,
    registrations: u32,
    pub answers_since_ack: u32,
    pub ack_outstanding: bool,
    pub closed: bool,
    /// The leader's address from `NOT_LEADER`/`GOAWAY`/`CHALLENGE`, tried first.
    pub hint: Option<String>,
    /// Why the last reconnect round failed.
    pub last_error: Option<Error>,
}

/// Send an `ACK` after this many answers (at least once per [`wire::ACK_EVERY`]).
const ACK_AFTER: u32 = wire::ACK_EVERY / 2;

impl State {
    /// Queues `req` on the current connection and returns its id; `None` without a connection.
    pub fn queue(&mut self, req: Req, waiter: Option<Waiter>, now: Instant) -> Option<u64> {
        let out = self.out.as_mut()?;
        let id = self.next_id;
        self.next_id += 1;
        req.encode(id, &mut out.buf);
        out.wake.notify_one();
        self.pending
            .insert(id, Pending { req, first_sent: now, t_send: now, retried: false, waiter, needs_cancel: false });
        Some(id)
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
        let Some(p) = self.pending.get_mut(&id) else { return false };
        p.waiter = None;
        self.cancel_acquire(id, now)
    }

    /// Sends `CANCEL` for the acquire `id` now, or marks it for the next connection; its caller
    /// (if still waiting) gets the acquire's final answer. False when it is no longer pending.
    pub fn cancel_acquire(&mut self, id: u64, now: Instant) -> bool {
        if !self.pending.contains_key(&id) {
            return false;
        }
        if self.out.is_some() {
            let mut cancel = Req::new(Op::CANCEL, empty_key());
            cancel.token = id;
            self.queue(cancel, None, now);
        } else if let Some(p) = self.pending.get_mut(&id) {
            p.needs_cancel = true;
        }
        true
    }

    /// The `x` of an `ACK`: the lowest id still awaited that is not an `ACQUIRE`, else the next id.
    fn ack_point(&self) -> u64 {
        self.pending.iter().find(|(_, p)| p.req.op != Op::ACQUIRE).map(|(id, _)| *id).unwrap_or(self.next_id)
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

    pub fn register(&mut self, token: u64, lock: &Arc<LockShared>) {
        self.registrations = self.registrations.wrapping_add(1);
        if self.registrations.is_multiple_of(1024) {
            self.locks.retain(|_, w| w.strong_count() > 0);
        }
        self.locks.insert(token, Arc::downgrade(lock));
    }

    /// Fails every waiter with `err` and forgets every request (a restart, a close).
    pub fn fail_all(&mut self, err: &Error) {
        for (_, p) in std::mem::take(&mut self.pending) {
            if let Some(w) = p.waiter {
                let _ = w.send(Err(err.clone()));
            }
        }
        self.deferred.clear();
        self.ack_outstanding = false;
        self.answers_since_ack = 0;
    }

    /// The session could not be resumed in time: callers get `err`; acquires stay pending as
    /// abandoned (a resume still sends their `CANCEL` and releases a late grant), the client's
    /// own requests stay, the callers' other requests are forgotten.
    pub fn fail_waiters(&mut self, err: &Error) {
        self.pending.retain(|_, p| {
            let Some(w) = p.waiter.take() else { return true };
            let _ = w.send(Err(err.clone()));
            if p.req.op == Op::ACQUIRE {
                p.needs_cancel = true;
                true
            } else {
                false
            }
        });
    }
}

pub(crate) fn empty_key() -> Arc<[u8]> {
    Arc::from(&[][..])
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
}

/// A request queued on the wire.
pub(crate) struct Sent {
    pub id: u64,
    pub rx: oneshot::Receiver<Result<Answer, Error>>,
}

impl Inner {
    pub fn lock_state(&self) -> MutexGuard<'_, State> {
        lock(&self.state)
    }

    /// Queues `req` once there is a connection, waiting for one until `deadline`. With `gate`,
    /// the lock's state is checked and held while the frame is queued, so that nothing is sent
    /// for a lock whose release has begun.
    pub async fn send(&self, req: Req, deadline: Instant, gate: Option<&LockShared>) -> Result<Sent, Error> {
        loop {
            let mut conn_rx = self.conn_tx.subscribe();
            {
                let _gate = match gate {
                    Some(l) => Some(l.gate()?),
                    None => None,
                };
                let mut st = self.lock_state();
                if st.closed {
                    return Err(Error::Closed);
                }
                if st.out.is_some() {
                    let (tx, rx) = oneshot::channel();
                    if let Some(id) = st.queue(req.clone(), Some(tx), Instant::now()) {
                        return Ok(Sent { id, rx });
                    }
                }
            }
            match timeout_at(deadline, conn_rx.changed()).await {
                Ok(Ok(())) => {}
                Ok(Err(_)) => return Err(Error::Closed),
                Err(_) => return Err(self.no_connection_error()),
            }
        }
    }

    fn no_connection_error(&self) -> Error {
        let st = self.lock_state();
        if st.closed {
            return Error::Closed;
        }
        match &st.last_error {
            Some(e) => e.clone(),
            None => Error::Timeout { what: "waiting for a connection".into(), timeout: self.opts.request_timeout },
        }
    }

    /// Sends `req` and waits for its answer, all within the request timeout. A request given up
    /// (timeout or drop) is forgotten: it is not sent again after a resume.
    pub async fn call(&self, req: Req, gate: Option<&LockShared>) -> Result<Reply, Error> {
        let timeout = self.opts.request_timeout;
        let deadline = Instant::now() + timeout;
        let op = req.op;
        let sent = self.send(req, deadline, gate).await?;
        let mut forget = ForgetOnDrop { inner: self, id: Some(sent.id) };
        let answer = timeout_at(deadline, sent.rx).await;
        forget.id = None;
        match answer {
            Ok(Ok(Ok(Answer::Reply(r)))) => Ok(r),
            Ok(Ok(Ok(Answer::Granted(_)))) => Err(Error::Protocol { message: format!("{op} answered as a grant") }),
            Ok(Ok(Err(e))) => Err(e),
            Ok(Err(_)) => Err(Error::Closed),
            Err(_) => {
                lock(&self.state).pending.remove(&sent.id);
                Err(Error::Timeout { what: op_name(op).into(), timeout })
            }
        }
    }

    /// Marks the client closed and fails everything in flight (no I/O).
    pub fn shut(&self) {
        {
            let mut st = self.lock_state();
            if st.closed {
                return;
            }
            st.closed = true;
            st.fail_all(&Error::Closed);
        }
        self.closed_tx.send_replace(true);
        self.conn_tx.send_modify(|v| *v += 1);
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

struct ForgetOnDrop<'a> {
    inner: &'a Inner,
    id: Option<u64>,
}

impl Drop for ForgetOnDrop<'_> {
    fn drop(&mut self) {
        if let Some(id) = self.id {
            self.inner.lock_state().pending.remove(&id);
        }
    }
}

/// Maps a non-OK answer to its error.
pub(crate) fn status_error(op: Op, r: &Reply, key: &[u8], token: u64, wait: Duration) -> Error {
    let message = String::from_utf8_lossy(&r.data).into_owned();
    match r.status {
        Status::TIMED_OUT => Error::NotAcquired { key: key_text(key), wait },
        Status::NOT_HELD => Error::NotHeld { key: key_text(key), token },
        Status::INVALID => Error::InvalidArgument { field: Some(InvalidField(r.detail)), message },
        Status::BUSY => Error::Busy { limit: BusyLimit(r.detail), message },
        Status::SHUTTING_DOWN => Error::ShuttingDown { message },
        Status::CANCELLED => Error::Cancelled { key: key_text(key) },
        status => Error::Status { op, status, detail: r.detail, message },
    }
}

/// Checks a key: 1..=65535 bytes.
pub(crate) fn check_key(key: &[u8]) -> Result<Arc<[u8]>, Error> {
    if key.is_empty() {
        return Err(Error::invalid(Some(InvalidField::KEY), "key must not be empty"));
    }
    if key.len() > wire::MAX_KEY_LEN {
        return Err(Error::invalid(
            Some(InvalidField::KEY),
            format!("key is {} bytes, longer than the most the protocol allows ({})", key.len(), wire::MAX_KEY_LEN),
        ));
    }
    Ok(Arc::from(key))
}

/// Converts a lease to whole milliseconds (rounded up: never less than asked): 1 ms ..= 2^32-1 ms.
pub(crate) fn lease_ms(lease: Duration) -> Result<u32, Error> {
    let ms = lease.as_nanos().div_ceil(1_000_000);
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
        Some(w) => u32::try_from(w.as_nanos().div_ceil(1_000_000)).unwrap_or(wire::WAIT_FOREVER),
    }
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

impl Client {
    /// Connects to the first endpoint that completes the handshake, following a leader hint, and
    /// returns the client.
    ///
    /// Fails with [`Error::AuthFailed`], [`Error::UnsupportedVersion`] or [`Error::Tls`] at once,
    /// and with [`Error::Unavailable`] when no endpoint could be reached within its dial timeout.
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
            state_id: None,
            grace: Duration::ZERO,
            out: None,
            epoch: 0,
            pending: BTreeMap::new(),
            deferred: Vec::new(),
            locks: HashMap::new(),
            registrations: 0,
            answers_since_ack: 0,
            ack_outstanding: false,
            closed: false,
            hint: None,
            last_error: None,
        };
        let inner = Arc::new(Inner {
            opts: options,
            dialer,
            state: Mutex::new(state),
            conn_tx: watch::Sender::new(0),
            closed_tx: watch::Sender::new(false),
            runtime,
            manager: Mutex::new(None),
        });
        let established = conn::connect_round(&inner).await?;
        let first = match conn::install(&inner, established) {
            Ok(c) => c,
            Err(_) => return Err(Error::connection_lost("the connection could not be installed")),
        };
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
        let locks: Vec<Arc<LockShared>> = {
            let st = self.inner().lock_state();
            st.locks.values().filter_map(Weak::upgrade).filter(|l| &*l.key == key).collect()
        };
        locks.iter().any(|l| l.is_held())
    }

    /// Closes the client: calls in flight fail with [`Error::Closed`], keep-alive stops, and later
    /// calls fail with [`Error::Closed`]. Locks still held are not released (the server keeps
    /// them until their lease ends) unless [`ClientOptions::release_on_close`] is set, in which
    /// case they are released first, each bounded by the request timeout. Returns within a few
    /// seconds even when the server does not answer. Idempotent.
    pub async fn close(&self) {
        let inner = self.inner();
        if inner.opts.release_on_close {
            let locks: Vec<Arc<LockShared>> = {
                let st = inner.lock_state();
                if st.closed { Vec::new() } else { st.locks.values().filter_map(Weak::upgrade).collect() }
            };
            let mut tasks = Vec::new();
            for l in locks {
                if l.is_held() {
                    tasks.push(inner.runtime.spawn(async move {
                        let _ = l.release().await;
                    }));
                }
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
