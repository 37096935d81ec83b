//! A held lock: its token, lease, local deadline, lost signal, keep-alive, and the guard that
//! releases it on drop.
//!
//! A lock's state lives in the client's table of held locks (`State::locks`, by token), under the
//! client's one mutex, from its grant until its [`Lock`] is dropped (or, for a grant nobody took,
//! until its release is queued). So the requests that change a lock and the answers that end it
//! are handled under the one mutex they are queued and answered under anyway: a lock costs no
//! allocation, no mutex and no reference count of its own.

use std::fmt;
use std::future::Future;
use std::ops::Deref;
use std::pin::Pin;
use std::sync::{Arc, MutexGuard, Weak};
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::sync::watch;
use tokio::task::AbortHandle;
use tokio::time::{Instant, sleep};

use crate::client::{Bound, Client, Gate, Inner, Key, Reply, Req, State, lease_ms, reply_of, status_error};
use crate::clock::Tick;
use crate::error::{Error, LostReason, key_text};
use crate::wire::{self, Op, Status};

/// Microseconds of local time per millisecond of lease: `1000 · (1 − 2ρ)`.
const MICROS_PER_LEASE_MS: u64 = 1000 - 2 * wire::CLOCK_RATE_BOUND_PPM as u64 / 1000;

/// `t_first + total_ms · (1 − 2ρ)`, `t_first` being when the request was first sent: never later
/// than the server's lease end, which is `total_ms` after the request's first arrival.
pub(crate) fn local_deadline(t_first: Tick, total_ms: u64) -> Tick {
    t_first + Duration::from_micros(total_ms.saturating_mul(MICROS_PER_LEASE_MS))
}

/// When the lost signal fires for a deadline: `min(5 ms, lease / 10)` before it.
pub(crate) fn lost_at(deadline: Tick, lease_ms: u32) -> Tick {
    let margin = Duration::from_micros((u64::from(lease_ms) * 100).min(u64::from(wire::LOST_MARGIN_MS) * 1000));
    deadline.checked_sub(margin).unwrap_or(deadline)
}

/// A lock's state, in the client's table of held locks (see the module's documentation).
pub(crate) struct Held {
    pub key: Key,
    /// The client's `State::era` when it was granted: a [`Lock`] finds its state by token and
    /// era (tokens never repeat on one server or cluster; the era tells the lock states of a
    /// server the client saw restart from those of the new one).
    pub era: u32,
    pub lease_ms: u32,
    /// On the lease clock (`State::lease_clock`).
    pub deadline: Tick,
    /// The request id of the `EXTEND OK` that set `lease_ms` and `deadline` (0: the grant). The
    /// server applies a lock's extends in id order, so an older one's answer, read or handled
    /// after a newer one's, changes nothing.
    pub extend_id: u64,
    /// Its entry in the client's deadline timers (`State::timers`): the lost time, and where it
    /// went (see `Deadlines::insert`). `None` once released or lost.
    pub timer: Option<(Tick, bool)>,
    pub released: bool,
    pub releasing: bool,
    pub lost: Option<LostReason>,
    /// A release of the lock, lost before it, queued its `RELEASE` in the background (once).
    told: bool,
    /// The lost signal, made when first asked for (most locks are released without anyone
    /// watching): one channel per lock would cost two allocations and a wake-up of eight
    /// notifiers on drop.
    lost_tx: Option<watch::Sender<Option<LostReason>>>,
    keepalive: Option<AbortHandle>,
}

impl Held {
    /// Neither released nor lost.
    pub fn is_held(&self) -> bool {
        !self.released && self.lost.is_none()
    }

    fn lost_rx(&mut self) -> watch::Receiver<Option<LostReason>> {
        let lost = self.lost;
        self.lost_tx.get_or_insert_with(|| watch::Sender::new(lost)).subscribe()
    }

    fn stop_keepalive(&mut self) {
        if let Some(t) = self.keepalive.take() {
            t.abort();
        }
    }
}

/// Whether the lock `token` is in the deadline timers at `at`.
pub(crate) fn lock_live(locks: &crate::table::IdTable<Held>, at: Tick, token: u64) -> bool {
    locks.get(token).is_some_and(|h| h.timer.is_some_and(|(t, _)| t == at))
}

fn lost_error(key: &[u8], token: u64, reason: LostReason) -> Error {
    Error::LockLost { key: key_text(key), token, reason }
}

impl State {
    /// Registers a lock just granted, its lost signal due `min(5 ms, lease/10)` before
    /// `deadline`; returns the era it belongs to.
    #[inline]
    pub fn register(&mut self, inner: &Inner, token: u64, key: Key, lease_ms: u32, deadline: Tick) -> u32 {
        let at = lost_at(deadline, lease_ms);
        let late = self.add_timer(at, token);
        let era = self.era;
        let held = Held {
            key,
            era,
            lease_ms,
            deadline,
            extend_id: 0,
            timer: Some((at, late)),
            released: false,
            releasing: false,
            lost: None,
            told: false,
            lost_tx: None,
            keepalive: None,
        };
        self.locks.insert(token, held);
        self.arm(inner, self.lease_clock.to_instant(at));
        era
    }

    fn add_timer(&mut self, at: Tick, token: u64) -> bool {
        let locks = &self.locks;
        self.timers.insert(at, token, None, locks.len(), |at, token| lock_live(locks, at, token))
    }

    /// Takes the lock `token` out of the deadline timers.
    fn stop_timer(&mut self, token: u64) {
        let Some((at, late)) = self.locks.get_mut(token).and_then(|h| h.timer.take()) else { return };
        let locks = &self.locks;
        self.timers.remove(at, token, late, |at, token| lock_live(locks, at, token));
    }

    /// The state of the lock `token` granted in `era`, if its [`Lock`] still has one.
    #[inline]
    pub fn lock_entry(&mut self, token: u64, era: u32) -> Option<&mut Held> {
        self.locks.get_mut(token).filter(|h| h.era == era)
    }

    /// Fires the lost signal of the lock `token` (once; never after a successful release).
    /// Returns whether it fired.
    pub fn fire_lost(&mut self, token: u64, reason: LostReason) -> bool {
        let Some(h) = self.locks.get_mut(token) else { return false };
        if !h.is_held() {
            return false;
        }
        h.lost = Some(reason);
        h.stop_keepalive();
        if let Some(tx) = &h.lost_tx {
            tx.send_replace(Some(reason));
        }
        self.stop_timer(token);
        true
    }

    /// Fires lost for every lock whose lost time passed by `now`.
    pub fn fire_due_locks(&mut self, now: Tick) {
        while let Some((at, token)) = self.timers.pop_due(now) {
            let Some(h) = self.locks.get_mut(token) else { continue };
            if h.timer.is_some_and(|(t, _)| t == at) {
                h.timer = None;
                self.fire_lost(token, LostReason::Expired);
            }
        }
        // The timer task wakes every LOST_CHECK_MS while an entry is left: drop those of the
        // locks released or dropped meanwhile.
        let locks = &self.locks;
        self.timers.drop_dead(|at, token| lock_live(locks, at, token));
    }

    /// Fires lost for the lock `token` of `era` if its lost time passed by `now`: a call that
    /// asks about a lock sees it lost at once, though the timer task may wake up to
    /// `LOST_CHECK_MS` after a suspend.
    pub fn fire_if_due(&mut self, token: u64, era: u32, now: Tick) {
        let due = self.lock_entry(token, era).and_then(|h| h.timer).is_some_and(|(at, _)| at <= now);
        if due {
            self.fire_lost(token, LostReason::Expired);
        }
    }

    /// Every lock is lost with `reason` (the server restarted): their states stay, for their
    /// [`Lock`]s, in an era of their own.
    pub fn lose_all(&mut self, reason: LostReason) {
        self.timers.clear();
        let tokens: Vec<u64> = self.locks.keys().collect();
        for token in tokens {
            if let Some(h) = self.locks.get_mut(token) {
                h.timer = None;
            }
            self.fire_lost(token, reason);
        }
        self.era = self.era.wrapping_add(1);
    }

    /// The answer to a lock's own `RELEASE` was `OK`: it is released (the lost signal can no
    /// longer fire).
    pub fn released(&mut self, token: u64) {
        if let Some(h) = self.locks.get_mut(token) {
            h.released = true;
            h.stop_keepalive();
            self.stop_timer(token);
        }
    }

    /// Takes the lock `token` of `era` out of the table (its [`Lock`] is dropped): its lost
    /// signal's sender goes (its watchers see it closed), keep-alive stops. Returns whether it
    /// was released.
    pub fn drop_lock(&mut self, token: u64, era: u32) -> bool {
        let Some(h) = self.lock_entry(token, era) else { return false };
        h.stop_keepalive();
        let released = h.released;
        self.stop_timer(token);
        // Dropped where it is, not moved out first (it is a hundred bytes).
        self.locks.delete(token);
        released
    }

    /// A grant nobody will use (its acquire was given up): forgotten, and released in the
    /// background, without firing lost.
    pub fn abandon_lock(&mut self, token: u64, era: u32, key: Key) {
        if self.lock_entry(token, era).is_none() {
            return;
        }
        if !self.drop_lock(token, era) {
            let mut release = Req::new(Op::RELEASE, key);
            release.token = token;
            self.queue_internal(release, Instant::now());
        }
    }

    /// Moves the deadline timer of the lock `token` (still held) to `at`.
    fn move_timer(&mut self, inner: &Inner, token: u64, at: Tick) {
        let Some((old, old_late)) = self.locks.get(token).and_then(|h| h.timer) else { return };
        if old == at {
            return;
        }
        let late = self.add_timer(at, token);
        if let Some(h) = self.locks.get_mut(token) {
            h.timer = Some((at, late));
        }
        let locks = &self.locks;
        self.timers.remove(old, token, old_late, |at, token| lock_live(locks, at, token));
        self.arm(inner, self.lease_clock.to_instant(at));
    }

    /// Checks that a request may be sent for the lock `g` (neither lost nor being released) at
    /// `now` (`None`: [`stamp`](State::stamp)).
    pub fn gate(&mut self, g: &Gate<'_>, now: Option<Instant>) -> Result<(), Error> {
        let now = now.unwrap_or_else(|| self.stamp());
        let now = self.lease_clock.at(now);
        self.fire_if_due(g.token, g.era, now);
        let Some(h) = self.lock_entry(g.token, g.era) else {
            return Err(lost_error(g.key, g.token, LostReason::ServerRestarted));
        };
        if let Some(reason) = h.lost {
            return Err(lost_error(g.key, g.token, reason));
        }
        if h.released || h.releasing {
            return Err(Error::NotHeld { key: key_text(g.key), token: g.token });
        }
        Ok(())
    }

    /// The release's first step, at `now`: marks the lock releasing (stops keep-alive) and
    /// returns the reason it was lost before, or the outcome when there is nothing to wait for.
    ///
    /// A lock lost before reports it at once, whether or not the server can be reached
    /// (docs/clients.md, rule 4), and its `RELEASE` goes in the background (once), for a server
    /// that may still hold it so that the next waiter need not wait for the lease: not after a
    /// restart (the new server has nothing of the old state) nor after a `NOT_HELD`.
    fn begin_release(&mut self, g: &Gate<'_>, now: Instant) -> Result<Option<LostReason>, Result<(), Error>> {
        let tick = self.lease_clock.at(now);
        self.fire_if_due(g.token, g.era, tick);
        let Some(h) = self.lock_entry(g.token, g.era) else {
            return Err(Err(lost_error(g.key, g.token, LostReason::ServerRestarted)));
        };
        if h.released {
            return Err(Ok(()));
        }
        if let Some(reason) = h.lost {
            if !h.told && !matches!(reason, LostReason::ServerRestarted | LostReason::NotHeld) {
                h.told = true;
                let mut release = Req::new(Op::RELEASE, g.key.clone());
                release.token = g.token;
                self.queue_internal(release, now);
            }
            return Err(Err(lost_error(g.key, g.token, reason)));
        }
        h.releasing = true;
        h.stop_keepalive();
        Ok(h.lost)
    }

    /// The release's outcome, from the answer to its `RELEASE` (or the call's error).
    fn end_release(
        &mut self,
        g: &Gate<'_>,
        lost_before: Option<LostReason>,
        r: Result<Reply, Error>,
    ) -> Result<(), Error> {
        let (token, key) = (g.token, g.key);
        let r = match r {
            Ok(r) => r,
            Err(e) => {
                if let Some(h) = self.lock_entry(token, g.era) {
                    h.releasing = false;
                }
                // A lock lost earlier reports that, whatever became of the courtesy release.
                return Err(match lost_before {
                    Some(reason) => lost_error(key, token, reason),
                    None => e,
                });
            }
        };
        if r.status == Status::NOT_HELD && self.lock_entry(token, g.era).is_some() {
            self.fire_lost(token, LostReason::NotHeld);
        }
        let Some(h) = self.lock_entry(token, g.era) else {
            return Err(lost_error(key, token, LostReason::ServerRestarted));
        };
        h.releasing = false;
        match r.status {
            // The answer marked it released (`State::released`).
            Status::OK => match h.lost.or(lost_before) {
                Some(reason) => Err(lost_error(key, token, reason)),
                None => Ok(()),
            },
            Status::NOT_HELD => match (h.released, h.lost) {
                (true, _) => Ok(()), // a concurrent release won
                (false, reason) => Err(lost_error(key, token, reason.unwrap_or(LostReason::NotHeld))),
            },
            _ => Err(status_error(Op::RELEASE, &r, key, token, Duration::ZERO)),
        }
    }

    /// The extend's outcome, from the answer to its `EXTEND`.
    fn end_extend(&mut self, inner: &Inner, g: &Gate<'_>, r: &Reply) -> Result<Duration, Error> {
        let (token, key) = (g.token, g.key);
        if r.status == Status::NOT_HELD && self.lock_entry(token, g.era).is_some() {
            self.fire_lost(token, LostReason::NotHeld);
        }
        let Some(h) = self.lock_entry(token, g.era) else {
            return Err(lost_error(key, token, LostReason::ServerRestarted));
        };
        match r.status {
            Status::OK => {
                if let Some(reason) = h.lost {
                    return Err(lost_error(key, token, reason));
                }
                if h.released {
                    return Err(Error::NotHeld { key: key_text(key), token });
                }
                // Checked under the mutex the deadline is set under: the keep-alive's extends
                // and the application's may be answered, and handled, in any order.
                if r.id > h.extend_id {
                    h.extend_id = r.id;
                    h.lease_ms = r.lease_ms;
                    h.deadline = local_deadline(r.t_first, u64::from(r.lease_ms));
                    let at = lost_at(h.deadline, h.lease_ms);
                    self.move_timer(inner, token, at);
                }
                Ok(Duration::from_millis(r.lease_ms.into()))
            }
            Status::NOT_HELD => Err(match h.lost {
                Some(reason) => lost_error(key, token, reason),
                None => Error::NotHeld { key: key_text(key), token },
            }),
            _ => Err(status_error(Op::EXTEND, r, key, token, Duration::ZERO)),
        }
    }
}

/// Sets the lease of the lock `g` to `lease` from now and moves its deadline.
async fn extend_lock(inner: &Inner, g: Gate<'_>, lease: Duration) -> Result<Duration, Error> {
    let ms = lease_ms(lease)?;
    let mut req = Req::new(Op::EXTEND, g.key.clone());
    req.token = g.token;
    req.lease_ms = ms;
    let r = inner.call(req, Some(&g)).await?;
    inner.lock_state().end_extend(inner, &g, &r)
}

/// Starts keep-alive for the lock `token` of `era`: `EXTEND` with the lease every lease/3 until
/// release, loss, or `max_hold`.
pub(crate) fn start_keepalive(inner: &Arc<Inner>, token: u64, era: u32, key: Key, max_hold: Option<Duration>) {
    let stop_at = max_hold.map(|d| Instant::now() + d);
    let task = inner.runtime.spawn(keepalive(Arc::downgrade(inner), token, era, key, stop_at)).abort_handle();
    let mut st = inner.lock_state();
    match st.lock_entry(token, era) {
        Some(h) if h.is_held() && !h.releasing => h.keepalive = Some(task),
        _ => task.abort(),
    }
}

async fn keepalive(client: Weak<Inner>, token: u64, era: u32, key: Key, stop_at: Option<Instant>) {
    let mut failed = false;
    // Bounded by the lock's life: every pass holds the client only weakly, and ends when the
    // lock is gone, released, lost, or past `stop_at` (its release, loss and drop also abort it).
    loop {
        let lease = {
            let Some(inner) = client.upgrade() else { return };
            let mut st = inner.lock_state();
            match st.lock_entry(token, era) {
                Some(h) if h.is_held() => Duration::from_millis(h.lease_ms.into()),
                _ => return,
            }
        };
        let mut period = (lease / 3).max(Duration::from_millis(1));
        if failed {
            period = period.min(Duration::from_millis(250));
        }
        sleep(period).await;
        if stop_at.is_some_and(|t| Instant::now() >= t) {
            return;
        }
        let Some(inner) = client.upgrade() else { return };
        match extend_lock(&inner, Gate { token, era, key: &key }, lease).await {
            Ok(_) => failed = false,
            Err(Error::LockLost { .. } | Error::NotHeld { .. } | Error::Closed) => return,
            Err(_) => failed = true,
        }
    }
}

/// The future of a lock's release. Not an `async fn`: a release is the hot path, and most are
/// queued at their first poll and then only await their answer, which this does without stepping
/// through (and moving the request into) the futures of a general call.
pub(crate) struct ReleaseFuture<'a> {
    inner: &'a Inner,
    lock: Gate<'a>,
    step: ReleaseStep<'a>,
}

enum ReleaseStep<'a> {
    /// Not polled yet.
    Start,
    /// Queued (request `id`, waiter `ticket`), awaiting the answer: dropped then, the request is
    /// forgotten (as a dropped call's).
    Waiting {
        id: u64,
        ticket: usize,
        lost_before: Option<LostReason>,
    },
    /// Waiting for a connection first.
    Boxed(Pin<Box<dyn Future<Output = Result<(), Error>> + Send + 'a>>),
    Done,
}

impl<'a> ReleaseFuture<'a> {
    pub(crate) fn new(inner: &'a Inner, lock: Gate<'a>) -> ReleaseFuture<'a> {
        ReleaseFuture { inner, lock, step: ReleaseStep::Start }
    }
}

impl Drop for ReleaseFuture<'_> {
    fn drop(&mut self) {
        if let ReleaseStep::Waiting { id, ticket, .. } = self.step {
            self.inner.forget_request(id, ticket);
        }
    }
}

impl<'a> Future for ReleaseFuture<'a> {
    type Output = Result<(), Error>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = &mut *self;
        let (inner, g) = (this.inner, this.lock);
        match this.step {
            ReleaseStep::Start => {
                let mut st = inner.lock_state();
                let now = st.stamp();
                let lost_before = match st.begin_release(&g, now) {
                    Ok(l) => l,
                    Err(outcome) => {
                        this.step = ReleaseStep::Done;
                        return Poll::Ready(outcome);
                    }
                };
                if st.closed {
                    this.step = ReleaseStep::Done;
                    return Poll::Ready(st.end_release(&g, lost_before, Err(Error::Closed)));
                }
                let mut req = Req::new(Op::RELEASE, g.key.clone());
                req.token = g.token;
                req.forget = true;
                let bound = Bound::After(inner.opts.request_timeout);
                // Queued with this task's waker, in this poll (as `Inner::call` does); its answer
                // wakes this task: no need to look now.
                match st.queue_call(inner, req, Some(cx.waker()), Some(now), bound) {
                    Ok((id, ticket)) => {
                        this.step = ReleaseStep::Waiting { id, ticket, lost_before };
                        Poll::Pending
                    }
                    Err(req) => {
                        let conn_rx = inner.conn_tx.subscribe();
                        drop(st);
                        let mut f: Pin<Box<dyn Future<Output = Result<(), Error>> + Send + 'a>> =
                            Box::pin(async move {
                                let r = inner.call_when_connected(req, conn_rx).await;
                                inner.lock_state().end_release(&g, lost_before, r)
                            });
                        let out = f.as_mut().poll(cx);
                        this.step = if out.is_ready() { ReleaseStep::Done } else { ReleaseStep::Boxed(f) };
                        out
                    }
                }
            }
            ReleaseStep::Waiting { ticket, lost_before, .. } => {
                let mut st = inner.lock_state();
                let Poll::Ready(answer) = st.poll_answer(ticket, cx) else { return Poll::Pending };
                this.step = ReleaseStep::Done;
                Poll::Ready(st.end_release(&g, lost_before, reply_of(Op::RELEASE, answer)))
            }
            ReleaseStep::Boxed(ref mut f) => {
                let out = std::task::ready!(f.as_mut().poll(cx));
                this.step = ReleaseStep::Done;
                Poll::Ready(out)
            }
            ReleaseStep::Done => panic!("release future polled after completion"),
        }
    }
}

/// Releases the lock `g` and then forgets it (a grant whose acquire was withdrawn: nobody has
/// its [`Lock`]), within `deadline`; past it, the release finishes in the background.
pub(crate) async fn release_unclaimed(inner: &Inner, g: Gate<'_>, deadline: Instant) {
    let done = tokio::time::timeout_at(deadline, ReleaseFuture::new(inner, g)).await.is_ok();
    let mut st = inner.lock_state();
    if done {
        st.drop_lock(g.token, g.era);
    } else {
        st.abandon_lock(g.token, g.era, g.key.clone());
    }
}

/// A held lock: its key, fencing token, lease and local deadline, with a lost signal.
///
/// Pass [`token`](Lock::token) to the resource you protect and have it reject any token lower
/// than the highest it has seen (fencing): that is what makes a holder that woke up late, its
/// lease gone, harmless.
///
/// The lock is **lost** at the first of: its local deadline (the lease counted from when the
/// request was first sent, a little early, so never after the server's), an `EXPIRED` notice
/// from the server, a `NOT_HELD` answer to an extend or release, or a reconnect that finds the
/// server restarted. Watch for it with [`lost`](Lock::lost) or [`lost_watch`](Lock::lost_watch),
/// and stop the work that needed the lock when it fires. It never fires after a successful
/// release.
///
/// Dropping a `Lock` does **not** release it (the server reclaims it when the lease ends, and
/// keep-alive stops); call [`release`](Lock::release), or turn it into a [`LockGuard`] that
/// releases on drop. Any task holding the token may release or extend the lock.
///
/// A `Lock` dropped unused is a mistake the compiler reports (`#[must_use]`): the key would stay
/// held, blocking every other holder, until its lease ends.
///
/// ```compile_fail
/// #![deny(unused_must_use)]
/// async fn f(client: ticketing::Client) {
///     // error: the lock is dropped at once, and the key stays held until its lease ends
///     client.acquire("k", std::time::Duration::from_secs(30)).await.unwrap();
/// }
/// ```
///
/// ```
/// #![deny(unused_must_use)]
/// async fn f(client: ticketing::Client) {
///     let lock = client.acquire("k", std::time::Duration::from_secs(30)).await.unwrap();
///     let _ = lock.release().await;
/// }
/// ```
#[must_use = "dropping a Lock does not release it: the key stays held until its lease ends; call release() or into_guard()"]
pub struct Lock {
    client: Client,
    key: Key,
    token: u64,
    /// Its state's era (see [`Held::era`]).
    era: u32,
}

impl fmt::Debug for Lock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (lease_ms, released, lost) = self
            .state(|h| h.map_or((0, false, Some(LostReason::ServerRestarted)), |h| (h.lease_ms, h.released, h.lost)));
        f.debug_struct("Lock")
            .field("key", &key_text(&self.key))
            .field("token", &self.token)
            .field("lease_ms", &lease_ms)
            .field("released", &released)
            .field("lost", &lost)
            .finish()
    }
}

impl Lock {
    pub(crate) fn new(client: Client, key: Key, token: u64, era: u32) -> Lock {
        Lock { client, key, token, era }
    }

    /// The client's state, this lock's lost signal fired first if its time has come (see
    /// [`State::fire_if_due`]).
    fn checked_state(&self) -> MutexGuard<'_, State> {
        let mut st = self.client.inner().lock_state();
        let now = st.lease_clock.now();
        st.fire_if_due(self.token, self.era, now);
        st
    }

    /// Runs `f` with the lock's state (`None`: a server restart replaced it, see [`Held::era`]).
    fn state<T>(&self, f: impl FnOnce(Option<&mut Held>) -> T) -> T {
        f(self.checked_state().lock_entry(self.token, self.era))
    }

    fn gate(&self) -> Gate<'_> {
        Gate { token: self.token, era: self.era, key: &self.key }
    }

    /// The key.
    pub fn key(&self) -> &[u8] {
        &self.key
    }

    /// The fencing token: larger than every token granted before it, on any key.
    pub fn token(&self) -> u64 {
        self.token
    }

    /// The lease last granted (by the acquire or the last successful extend).
    pub fn lease(&self) -> Duration {
        Duration::from_millis(self.state(|h| h.map_or(0, |h| h.lease_ms)).into())
    }

    /// The local deadline: the end of the lease counted from when its request was first sent,
    /// never later than the server's. A successful extend moves it. The lost signal fires
    /// `min(5 ms, lease / 10)` before it.
    ///
    /// The deadline runs on a clock that counts the time the host spends suspended, as the
    /// server's lease does; the `Instant` (whose clock may not) is when it comes if the host is
    /// not suspended meanwhile.
    pub fn deadline(&self) -> std::time::Instant {
        let mut st = self.checked_state();
        match st.lock_entry(self.token, self.era).map(|h| h.deadline) {
            Some(d) => st.lease_clock.to_instant(d).into_std(),
            None => std::time::Instant::now(),
        }
    }

    /// Why the lock was lost, or `None` while it is not lost.
    pub fn lost_reason(&self) -> Option<LostReason> {
        self.state(|h| h.map_or(Some(LostReason::ServerRestarted), |h| h.lost))
    }

    /// Whether the lock is lost.
    pub fn is_lost(&self) -> bool {
        self.lost_reason().is_some()
    }

    /// Whether a release of this lock succeeded.
    pub fn is_released(&self) -> bool {
        self.state(|h| h.is_some_and(|h| h.released))
    }

    /// Resolves when the lock is lost, with the reason (at once if it already is). Never resolves
    /// after a successful release. Use it to stop work that needs the lock:
    ///
    /// ```no_run
    /// # async fn f(lock: ticketing::Lock, work: impl std::future::Future<Output = ()>) {
    /// tokio::select! {
    ///     _ = work => {}
    ///     reason = lock.lost() => eprintln!("lock lost ({reason}); stopping"),
    /// }
    /// # }
    /// ```
    pub async fn lost(&self) -> LostReason {
        let mut rx = self.lost_watch();
        // The sender lives in the lock's state, which lives as long as `self`: `wait_for` can
        // only end with a reason.
        let reason = rx.wait_for(Option::is_some).await.map(|r| *r);
        match reason {
            Ok(r) => r.unwrap_or(LostReason::Expired),
            Err(_) => std::future::pending().await,
        }
    }

    /// A watch channel of the lost reason (`None` while not lost), for tasks that outlive a borrow
    /// of the lock. The sender is dropped with the lock.
    pub fn lost_watch(&self) -> watch::Receiver<Option<LostReason>> {
        self.state(|h| match h {
            Some(h) => h.lost_rx(),
            // A state the restart replaced: lost, and nothing more will change.
            None => watch::Sender::new(Some(LostReason::ServerRestarted)).subscribe(),
        })
    }

    /// Releases the lock: the next waiter is granted at once.
    ///
    /// Returns `Ok(())` (also when it was already released). A lock that was lost before reports
    /// [`Error::LockLost`] with the reason **at once**, without waiting for the server (which may
    /// be unreachable): the work done under the lock may not have been protected. It is still
    /// released on the server in the background, in case the server still holds it (not after a
    /// restart or a `NOT_HELD`: nothing is left to release). A `NOT_HELD` answer makes the lock
    /// lost (reason `not held`). Keep-alive stops when the release is sent. On a transport error
    /// ([`Error::Timeout`], ...) the lock is still held as far as the client knows; call it
    /// again.
    pub fn release(&self) -> impl Future<Output = Result<(), Error>> + Send + '_ {
        ReleaseFuture::new(self.client.inner(), self.gate())
    }

    /// Sets the lease to `lease` from now (it may shorten it) and moves the local deadline;
    /// returns the lease granted. Fails with [`Error::LockLost`] when the lock is lost or the
    /// server answers `NOT_HELD` (which makes it lost). Of concurrent extends (keep-alive's and
    /// yours), the one sent last sets the lease and the deadline, as on the server.
    pub async fn extend(&self, lease: Duration) -> Result<Duration, Error> {
        extend_lock(self.client.inner(), self.gate(), lease).await
    }

    /// Asks the server whether this lock's token still holds its key (`INSPECT` with the
    /// token). Does not change the lost signal.
    pub async fn verify(&self) -> Result<bool, Error> {
        Ok(self.client.inspect_token(&self.key, self.token).await?.token_matches)
    }

    /// The client this lock was acquired through.
    pub fn client(&self) -> &Client {
        &self.client
    }

    /// Turns the lock into a guard that releases it when dropped.
    pub fn into_guard(self) -> LockGuard {
        LockGuard { lock: Some(self) }
    }
}

impl Drop for Lock {
    fn drop(&mut self) {
        // A lock not released runs out its lease on the server.
        self.client.inner().lock_state().drop_lock(self.token, self.era);
    }
}

/// A [`Lock`] that is released when the guard is dropped (in the background, on the client's
/// runtime), like tokio's `OwnedMutexGuard`. Prefer [`release`](LockGuard::release) where you can
/// await: it reports the outcome. Dereferences to the [`Lock`].
///
/// A guard dropped while the lock is lost still tells the server (which may still hold it), in
/// the background.
#[must_use = "dropping the guard releases the lock at once"]
pub struct LockGuard {
    /// Always there but in [`release`](LockGuard::release), [`into_lock`](LockGuard::into_lock)
    /// and the drop, which take it.
    lock: Option<Lock>,
}

impl fmt::Debug for LockGuard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("LockGuard").field(&**self).finish()
    }
}

impl LockGuard {
    fn take(&mut self) -> Lock {
        match self.lock.take() {
            Some(l) => l,
            None => unreachable!("a guard's lock is taken only once, by a method that consumes it"),
        }
    }

    /// Releases the lock and reports the outcome (see [`Lock::release`]).
    pub async fn release(mut self) -> Result<(), Error> {
        let lock = self.take();
        lock.release().await
    }

    /// Takes the lock back out of the guard: dropping it then no longer releases it.
    pub fn into_lock(mut self) -> Lock {
        self.take()
    }
}

impl Deref for LockGuard {
    type Target = Lock;

    fn deref(&self) -> &Lock {
        match &self.lock {
            Some(l) => l,
            None => unreachable!("a guard's lock is taken only once, by a method that consumes it"),
        }
    }
}

impl Drop for LockGuard {
    fn drop(&mut self) {
        if let Some(lock) = self.lock.take()
            && !lock.is_released()
        {
            let runtime = lock.client.inner().runtime.clone();
            runtime.spawn(async move {
                let _ = lock.release().await;
            });
        }
    }
}
