//! A held lock: its token, lease, local deadline, lost signal, keep-alive, and the guard that
//! releases it on drop.

use std::cell::RefCell;
use std::fmt;
use std::future::Future;
use std::ops::Deref;
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, Weak};
use std::task::{Context, Poll, ready};
use std::time::Duration;

use tokio::sync::watch;
use tokio::task::AbortHandle;
use tokio::time::{Instant, sleep};

use crate::client::{Bound, Client, Inner, Key, Queued, Reply, Req, lease_ms, lock, reply_of, status_error};
use crate::error::{Error, LostReason, key_text};
use crate::wire::{self, Op, Status};

/// Microseconds of local time per millisecond of lease: `1000 · (1 − 2ρ)`.
const MICROS_PER_LEASE_MS: u64 = 1000 - 2 * wire::CLOCK_RATE_BOUND_PPM as u64 / 1000;

/// `t_send + total_ms · (1 − 2ρ)`: never later than the server's deadline.
pub(crate) fn local_deadline(t_send: Instant, total_ms: u64) -> Instant {
    t_send + Duration::from_micros(total_ms.saturating_mul(MICROS_PER_LEASE_MS))
}

/// When the lost signal fires for a deadline: `min(5 ms, lease / 10)` before it.
pub(crate) fn lost_at(deadline: Instant, lease_ms: u32) -> Instant {
    let margin = Duration::from_micros((u64::from(lease_ms) * 100).min(u64::from(wire::LOST_MARGIN_MS) * 1000));
    deadline.checked_sub(margin).unwrap_or(deadline)
}

/// The most lock states kept for reuse per thread (104 bytes each on x86-64 with their reference
/// counts, so at most about 100 KiB per thread). One batch of answers can end as many locks as there are pairs in flight, and
/// the next batch grants as many: at 1,024 in flight a pool of 256 overflowed every batch (0.6
/// allocations per acquire + release).
const LOCK_POOL_MAX: usize = 1024;

thread_local! {
    /// The states of dropped locks that nothing else referred to, each held only here, for the
    /// next grants made on this thread ([`LockShared::renew`]): an allocation and a free per lock
    /// cost more than keeping them. Per thread, not per client: a lock's last handle is mostly
    /// dropped on the thread that runs the client's connection (always, on a current-thread
    /// runtime), and putting it there then costs no lock of the client's state. (A lock state
    /// refers to no client.)
    static POOL: RefCell<Vec<Arc<LockShared>>> = const { RefCell::new(Vec::new()) };
}

/// Keeps `shared` (whose only reference this is) for a next grant, if the pool has room.
fn pool_put(shared: Arc<LockShared>) {
    // Dropped after the pool's borrow ends: it holds nothing that could reach the pool, but a
    // drop under the borrow would be one more thing to reason about.
    let _spare = POOL.try_with(|p| match p.try_borrow_mut() {
        Ok(mut p) if p.len() < LOCK_POOL_MAX => {
            p.push(shared);
            None
        }
        _ => Some(shared),
    });
}

/// A lock state from the pool, if there is one.
pub(crate) fn pool_take() -> Option<Arc<LockShared>> {
    POOL.try_with(|p| p.try_borrow_mut().ok().and_then(|mut p| p.pop())).ok().flatten()
}

pub(crate) struct LockState {
    lease_ms: u32,
    deadline: Instant,
    released: bool,
    releasing: bool,
    lost: Option<LostReason>,
    /// The lost signal, made when first asked for (most locks are released without anyone
    /// watching): one channel per lock would cost two allocations and a wake-up of eight
    /// notifiers on drop.
    lost_tx: Option<watch::Sender<Option<LostReason>>>,
    keepalive: Option<AbortHandle>,
}

impl LockState {
    /// The state of a lock just granted: held, nobody watching, no keep-alive.
    fn granted(lease_ms: u32, deadline: Instant) -> LockState {
        LockState { lease_ms, deadline, released: false, releasing: false, lost: None, lost_tx: None, keepalive: None }
    }

    fn stop_tasks(&mut self) {
        if let Some(t) = self.keepalive.take() {
            t.abort();
        }
    }

    fn lost_rx(&mut self) -> watch::Receiver<Option<LostReason>> {
        let lost = self.lost;
        self.lost_tx.get_or_insert_with(|| watch::Sender::new(lost)).subscribe()
    }
}

/// The state behind a [`Lock`], shared with its keep-alive task (which holds it weakly) and with
/// the client's table of held locks and deadline timers (weakly too).
///
/// It holds no reference to the client: every caller has one at hand (the [`Lock`]'s own
/// [`Client`], the connection's tasks), and a clone per lock would be two more updates of a
/// counter that every thread touches.
pub(crate) struct LockShared {
    pub key: Key,
    pub token: u64,
    state: Mutex<LockState>,
}

impl LockShared {
    /// A lock just granted. The caller registers it (`State::register`) with
    /// `lost_at(deadline, lease_ms)`, which starts its deadline timer.
    pub fn new(key: Key, token: u64, lease_ms: u32, deadline: Instant) -> Arc<LockShared> {
        Arc::new(LockShared { key, token, state: Mutex::new(LockState::granted(lease_ms, deadline)) })
    }

    /// [`new`](LockShared::new), in the allocation of `spare` (a dropped lock's, from the client's
    /// pool) when nothing else refers to it.
    #[inline]
    pub fn renew(
        spare: Option<Arc<LockShared>>,
        key: Key,
        token: u64,
        lease_ms: u32,
        deadline: Instant,
    ) -> Arc<LockShared> {
        if let Some(mut spare) = spare
            && let Some(shared) = Arc::get_mut(&mut spare)
        {
            shared.key = key;
            shared.token = token;
            let s = shared.state.get_mut().unwrap_or_else(PoisonError::into_inner);
            *s = LockState::granted(lease_ms, deadline);
            return spare;
        }
        LockShared::new(key, token, lease_ms, deadline)
    }

    #[inline]
    fn state(&self) -> MutexGuard<'_, LockState> {
        lock(&self.state)
    }

    /// Takes the lock out of the client's table and timers (it is released, lost or abandoned).
    fn forget(&self, inner: &Inner) {
        inner.lock_state().forget_lock(self.token);
    }

    pub fn deadline_passed(&self, inner: &Inner) {
        let due = {
            let s = self.state();
            Instant::now() >= lost_at(s.deadline, s.lease_ms)
        };
        if due {
            self.fire_lost(inner, LostReason::Expired);
        }
    }

    /// The lock's state, held while a request for it is queued; refuses once its release has
    /// begun or it is lost.
    pub fn gate(&self) -> Result<MutexGuard<'_, LockState>, Error> {
        let s = self.state();
        if let Some(reason) = s.lost {
            return Err(self.lost_error(reason));
        }
        if s.released || s.releasing {
            return Err(Error::NotHeld { key: key_text(&self.key), token: self.token });
        }
        Ok(s)
    }

    pub fn lost_error(&self, reason: LostReason) -> Error {
        Error::LockLost { key: key_text(&self.key), token: self.token, reason }
    }

    /// Neither released nor lost.
    pub fn is_held(&self) -> bool {
        let s = self.state();
        !s.released && s.lost.is_none()
    }

    /// Fires the lost signal (once; never after a successful release). Returns whether it fired.
    pub fn fire_lost(&self, inner: &Inner, reason: LostReason) -> bool {
        {
            let mut s = self.state();
            if s.released || s.lost.is_some() {
                return false;
            }
            s.lost = Some(reason);
            s.stop_tasks();
            if let Some(tx) = &s.lost_tx {
                tx.send_replace(Some(reason));
            }
        }
        self.forget(inner);
        true
    }

    /// A grant nobody will use (its acquire was given up): forget it and release it in the
    /// background, without firing lost.
    pub fn abandon(&self, inner: &Inner) {
        {
            let mut s = self.state();
            s.released = true;
            s.stop_tasks();
        }
        let mut st = inner.lock_state();
        st.forget_lock(self.token);
        let mut release = Req::new(Op::RELEASE, self.key.clone());
        release.token = self.token;
        st.queue_internal(release, Instant::now());
    }

    /// Releases the lock (see [`Lock::release`]).
    pub fn release<'a>(self: &'a Arc<Self>, inner: &'a Inner) -> ReleaseFuture<'a> {
        ReleaseFuture { shared: self, inner, step: ReleaseStep::Start }
    }

    /// The release's first step: marks the lock releasing (stops keep-alive) and returns the
    /// reason it was lost before, or the outcome when there is nothing to send.
    fn begin_release(&self) -> Result<Option<LostReason>, Result<(), Error>> {
        let lost_before = {
            let mut s = self.state();
            if s.released {
                return Err(Ok(()));
            }
            s.releasing = true;
            if let Some(k) = s.keepalive.take() {
                k.abort();
            }
            s.lost
        };
        if lost_before == Some(LostReason::ServerRestarted) {
            // The server that granted it is gone: nothing to tell the new one.
            self.state().releasing = false;
            return Err(Err(self.lost_error(LostReason::ServerRestarted)));
        }
        Ok(lost_before)
    }

    /// The lock's own `RELEASE`.
    fn release_request(&self) -> Req {
        let mut req = Req::new(Op::RELEASE, self.key.clone());
        req.token = self.token;
        req.forget = true;
        req
    }

    /// The release's outcome, from the answer to its `RELEASE` (or the call's error).
    fn end_release(
        &self,
        inner: &Inner,
        lost_before: Option<LostReason>,
        r: Result<Reply, Error>,
    ) -> Result<(), Error> {
        let r = match r {
            Ok(r) => r,
            Err(e) => {
                self.state().releasing = false;
                // A lock lost earlier reports that, whatever became of the courtesy release.
                return Err(match lost_before {
                    Some(reason) => self.lost_error(reason),
                    None => e,
                });
            }
        };
        match r.status {
            Status::OK => {
                // The client's table and timers let go of it with the answer (`Req::forget`).
                let lost = {
                    let mut s = self.state();
                    s.released = true;
                    s.releasing = false;
                    s.stop_tasks();
                    s.lost
                };
                match lost.or(lost_before) {
                    Some(reason) => Err(self.lost_error(reason)),
                    None => Ok(()),
                }
            }
            Status::NOT_HELD => {
                self.fire_lost(inner, LostReason::NotHeld);
                let s = {
                    let mut s = self.state();
                    s.releasing = false;
                    (s.released, s.lost)
                };
                match s {
                    (true, _) => Ok(()), // a concurrent release won
                    (false, reason) => Err(self.lost_error(reason.unwrap_or(LostReason::NotHeld))),
                }
            }
            _ => {
                self.state().releasing = false;
                Err(status_error(Op::RELEASE, &r, &self.key, self.token, Duration::ZERO))
            }
        }
    }

    pub async fn extend(self: &Arc<Self>, inner: &Inner, lease: Duration) -> Result<Duration, Error> {
        let ms = lease_ms(lease)?;
        let mut req = Req::new(Op::EXTEND, self.key.clone());
        req.token = self.token;
        req.lease_ms = ms;
        let r = inner.call(req, Some(self)).await?;
        match r.status {
            Status::OK => {
                let mut s = self.state();
                if let Some(reason) = s.lost {
                    return Err(self.lost_error(reason));
                }
                if s.released {
                    return Err(Error::NotHeld { key: key_text(&self.key), token: self.token });
                }
                s.lease_ms = r.lease_ms;
                s.deadline = local_deadline(r.t_send, u64::from(r.lease_ms));
                // The lock's state, then the client's: the documented order.
                inner.lock_state().move_timer(inner, self.token, lost_at(s.deadline, s.lease_ms));
                Ok(Duration::from_millis(r.lease_ms.into()))
            }
            Status::NOT_HELD => {
                self.fire_lost(inner, LostReason::NotHeld);
                let lost = self.state().lost;
                Err(match lost {
                    Some(reason) => self.lost_error(reason),
                    None => Error::NotHeld { key: key_text(&self.key), token: self.token },
                })
            }
            _ => Err(status_error(Op::EXTEND, &r, &self.key, self.token, Duration::ZERO)),
        }
    }

    /// Starts keep-alive: `EXTEND` with the lease every lease/3 until release, loss, or `max_hold`.
    pub fn start_keepalive(self: &Arc<Self>, inner: &Arc<Inner>, max_hold: Option<Duration>) {
        let stop_at = max_hold.map(|d| Instant::now() + d);
        let weak = Arc::downgrade(self);
        let task = inner.runtime.spawn(keepalive(weak, Arc::downgrade(inner), stop_at)).abort_handle();
        let mut s = self.state();
        if s.released || s.releasing || s.lost.is_some() {
            task.abort();
        } else {
            s.keepalive = Some(task);
        }
    }
}

async fn keepalive(weak: Weak<LockShared>, client: Weak<Inner>, stop_at: Option<Instant>) {
    let mut failed = false;
    // Bounded by the lock's life: every pass holds the lock only weakly and ends when it is gone,
    // released, lost, or past `stop_at`.
    loop {
        let lease = match weak.upgrade() {
            Some(l) => Duration::from_millis(l.state().lease_ms.into()),
            None => return,
        };
        let mut period = (lease / 3).max(Duration::from_millis(1));
        if failed {
            period = period.min(Duration::from_millis(250));
        }
        sleep(period).await;
        if stop_at.is_some_and(|t| Instant::now() >= t) {
            return;
        }
        let (Some(l), Some(inner)) = (weak.upgrade(), client.upgrade()) else { return };
        match l.extend(&inner, lease).await {
            Ok(_) => failed = false,
            Err(Error::LockLost { .. } | Error::NotHeld { .. } | Error::Closed) => return,
            Err(_) => failed = true,
        }
    }
}

/// The future of a lock's release ([`LockShared::release`]). Not an `async fn`: a release is
/// the hot path, and most are queued at their first poll and then only await their answer, which
/// this does without stepping through (and moving the request into) the futures of a general
/// call.
pub(crate) struct ReleaseFuture<'a> {
    shared: &'a Arc<LockShared>,
    inner: &'a Inner,
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
        let (shared, inner) = (this.shared, this.inner);
        match this.step {
            ReleaseStep::Start => {
                let lost_before = match shared.begin_release() {
                    Ok(l) => l,
                    Err(outcome) => {
                        this.step = ReleaseStep::Done;
                        return Poll::Ready(outcome);
                    }
                };
                let timeout = inner.opts.request_timeout;
                // Queued with this task's waker, in this poll (as `Inner::call` does).
                match inner.try_send(shared.release_request(), None, None, Bound::After(timeout), Some(cx.waker())) {
                    Ok(Queued::Sent(sent)) => {
                        // Its answer wakes this task: no need to look now.
                        this.step = ReleaseStep::Waiting { id: sent.id, ticket: sent.ticket, lost_before };
                        Poll::Pending
                    }
                    Ok(Queued::NoConnection(req, conn_rx)) => {
                        let mut f: Pin<Box<dyn Future<Output = Result<(), Error>> + Send + 'a>> =
                            Box::pin(async move {
                                let r = inner.call_when_connected(req, conn_rx).await;
                                shared.end_release(inner, lost_before, r)
                            });
                        let out = f.as_mut().poll(cx);
                        this.step = if out.is_ready() { ReleaseStep::Done } else { ReleaseStep::Boxed(f) };
                        out
                    }
                    Err(e) => {
                        this.step = ReleaseStep::Done;
                        Poll::Ready(shared.end_release(inner, lost_before, Err(e)))
                    }
                }
            }
            ReleaseStep::Waiting { ticket, lost_before, .. } => {
                let answer = ready!(inner.poll_answer(ticket, cx));
                this.step = ReleaseStep::Done;
                let r = reply_of(Op::RELEASE, answer);
                Poll::Ready(shared.end_release(inner, lost_before, r))
            }
            ReleaseStep::Boxed(ref mut f) => {
                let out = ready!(f.as_mut().poll(cx));
                this.step = ReleaseStep::Done;
                Poll::Ready(out)
            }
            ReleaseStep::Done => panic!("release future polled after completion"),
        }
    }
}

/// A held lock: its key, fencing token, lease and local deadline, with a lost signal.
///
/// Pass [`token`](Lock::token) to the resource you protect and have it reject any token lower
/// than the highest it has seen (fencing): that is what makes a holder that woke up late, its
/// lease gone, harmless.
///
/// The lock is **lost** at the first of: its local deadline (the lease measured from when the
/// request was sent, a little early, so never after the server's), an `EXPIRED` notice from the
/// server, a `NOT_HELD` answer to an extend or release, or a reconnect that finds the server
/// restarted. Watch for it with [`lost`](Lock::lost) or [`lost_watch`](Lock::lost_watch), and stop
/// the work that needed the lock when it fires. It never fires after a successful release.
///
/// Dropping a `Lock` does **not** release it (the server reclaims it when the lease ends, and
/// keep-alive stops); call [`release`](Lock::release), or turn it into a [`LockGuard`] that
/// releases on drop. Any task holding the token may release or extend the lock.
pub struct Lock {
    /// Always there but in the drop, which moves it into the pool of lock states (a clone and
    /// a drop of it would be two more updates of its reference count).
    shared: Option<Arc<LockShared>>,
    client: Client,
}

impl fmt::Debug for Lock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let s = self.shared().state();
        f.debug_struct("Lock")
            .field("key", &key_text(&self.shared().key))
            .field("token", &self.shared().token)
            .field("lease_ms", &s.lease_ms)
            .field("released", &s.released)
            .field("lost", &s.lost)
            .finish()
    }
}

impl Lock {
    pub(crate) fn new(shared: Arc<LockShared>, client: Client) -> Lock {
        Lock { shared: Some(shared), client }
    }

    fn shared(&self) -> &Arc<LockShared> {
        match &self.shared {
            Some(s) => s,
            None => unreachable!("a lock's state is taken only by its drop"),
        }
    }

    /// The key.
    pub fn key(&self) -> &[u8] {
        &self.shared().key
    }

    /// The fencing token: larger than every token granted before it, on any key.
    pub fn token(&self) -> u64 {
        self.shared().token
    }

    /// The lease last granted (by the acquire or the last successful extend).
    pub fn lease(&self) -> Duration {
        Duration::from_millis(self.shared().state().lease_ms.into())
    }

    /// The local deadline: the end of the lease measured from when its request was sent, never
    /// later than the server's. A successful extend moves it. The lost signal fires
    /// `min(5 ms, lease / 10)` before it.
    pub fn deadline(&self) -> std::time::Instant {
        self.shared().state().deadline.into_std()
    }

    /// Why the lock was lost, or `None` while it is not lost.
    pub fn lost_reason(&self) -> Option<LostReason> {
        self.shared().state().lost
    }

    /// Whether the lock is lost.
    pub fn is_lost(&self) -> bool {
        self.lost_reason().is_some()
    }

    /// Whether a release of this lock succeeded.
    pub fn is_released(&self) -> bool {
        self.shared().state().released
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
        let mut rx = self.shared().state().lost_rx();
        // The sender lives in `self`, so `wait_for` can only end with a reason.
        let reason = rx.wait_for(Option::is_some).await.map(|r| *r);
        match reason {
            Ok(r) => r.unwrap_or(LostReason::Expired),
            Err(_) => std::future::pending().await,
        }
    }

    /// A watch channel of the lost reason (`None` while not lost), for tasks that outlive a borrow
    /// of the lock. The sender is dropped with the lock's last handle.
    pub fn lost_watch(&self) -> watch::Receiver<Option<LostReason>> {
        self.shared().state().lost_rx()
    }

    /// Releases the lock: the next waiter is granted at once.
    ///
    /// Returns `Ok(())` (also when it was already released). A lock that was lost is still
    /// released on the server if it still holds (not after a restart: the new server cannot),
    /// and the call reports [`Error::LockLost`] with the reason; a `NOT_HELD` answer makes the
    /// lock lost (reason `not held`). Keep-alive stops when
    /// the release is sent. On a transport error ([`Error::Timeout`], ...) the lock is still
    /// held as far as the client knows; call it again.
    pub fn release(&self) -> impl Future<Output = Result<(), Error>> + Send + '_ {
        self.shared().release(self.client.inner())
    }

    /// Sets the lease to `lease` from now (it may shorten it) and moves the local deadline;
    /// returns the lease granted. Fails with [`Error::LockLost`] when the lock is lost or the
    /// server answers `NOT_HELD` (which makes it lost).
    pub async fn extend(&self, lease: Duration) -> Result<Duration, Error> {
        self.shared().extend(self.client.inner(), lease).await
    }

    /// Asks the server whether this lock's token still holds its key (`INSPECT` with the
    /// token). Does not change the lost signal.
    pub async fn verify(&self) -> Result<bool, Error> {
        Ok(self.client.inspect_token(&self.shared().key, self.shared().token).await?.token_matches)
    }

    /// The client this lock was acquired through.
    pub fn client(&self) -> &Client {
        &self.client
    }

    /// Turns the lock into a guard that releases it when dropped.
    pub fn into_guard(self) -> LockGuard {
        LockGuard { lock: self, armed: true }
    }
}

impl Drop for Lock {
    fn drop(&mut self) {
        let Some(mut shared) = self.shared.take() else { return };
        // The last reference to the lock's state (released or lost, so out of the client's table,
        // and no keep-alive task): the allocation is kept for a next grant (`LockShared::renew`).
        if let Some(s) = Arc::get_mut(&mut shared) {
            // What the lock's last handle lets go of goes now, as without the pool: the lost
            // signal's sender (its watchers see it closed), the keep-alive task's handle.
            let s = s.state.get_mut().unwrap_or_else(PoisonError::into_inner);
            s.lost_tx = None;
            s.keepalive = None;
            pool_put(shared);
        }
    }
}

/// A [`Lock`] that is released when the guard is dropped (in the background, on the client's
/// runtime), like tokio's `OwnedMutexGuard`. Prefer [`release`](LockGuard::release) where you can
/// await: it reports the outcome. Dereferences to the [`Lock`].
///
/// A guard dropped while the lock is lost still tells the server (which may still hold it).
#[must_use = "dropping the guard releases the lock at once"]
pub struct LockGuard {
    lock: Lock,
    armed: bool,
}

impl fmt::Debug for LockGuard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("LockGuard").field(&self.lock).finish()
    }
}

impl LockGuard {
    /// Releases the lock and reports the outcome (see [`Lock::release`]).
    pub async fn release(mut self) -> Result<(), Error> {
        self.armed = false;
        self.lock.release().await
    }

    /// Takes the lock back out of the guard: dropping it then no longer releases it.
    pub fn into_lock(mut self) -> Lock {
        self.armed = false;
        Lock::new(Arc::clone(self.lock.shared()), self.lock.client.clone())
    }
}

impl Deref for LockGuard {
    type Target = Lock;

    fn deref(&self) -> &Lock {
        &self.lock
    }
}

impl Drop for LockGuard {
    fn drop(&mut self) {
        if self.armed && !self.lock.is_released() {
            let lock = Lock::new(Arc::clone(self.lock.shared()), self.lock.client.clone());
            self.lock.client.inner().runtime.spawn(async move {
                let _ = lock.release().await;
            });
        }
    }
}
