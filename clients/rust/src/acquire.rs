//! The acquire builder and its future.

use std::fmt;
use std::future::{Future, IntoFuture};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, ready};
use std::time::Duration;

use tokio::time::{Instant, timeout_at};

use crate::client::{
    Answer, AnswerFuture, Bound, Client, Gate, Inner, Key, Queued, Req, check_key_len, lease_ms, status_error, wait_ms,
};
use crate::error::{Error, key_text};
use crate::lock::{Lock, release_unclaimed, start_keepalive};
use crate::wire::{self, Op, Status};

/// An acquire being set up: returned by [`Client::acquire`]; `.await` it (it implements
/// [`IntoFuture`]) for a [`Lock`], or [`run`](Acquire::run) a body under the lock.
///
/// Defaults: wait without limit, no keep-alive, no max hold, queue behind a lock this client
/// already holds, scoped helpers report a lost lock.
#[must_use = "an acquire does nothing until it is awaited"]
pub struct Acquire {
    client: Client,
    key: Key,
    lease: Duration,
    wait: Option<Duration>,
    keep_alive: bool,
    max_hold: Option<Duration>,
    refuse_held: bool,
    report_lost: bool,
    cancel: Option<Pin<Box<dyn Future<Output = ()> + Send>>>,
}

impl fmt::Debug for Acquire {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Acquire")
            .field("key", &key_text(&self.key))
            .field("lease", &self.lease)
            .field("wait", &self.wait)
            .field("keep_alive", &self.keep_alive)
            .field("max_hold", &self.max_hold)
            .field("refuse_held", &self.refuse_held)
            .field("report_lost", &self.report_lost)
            .field("cancel_on", &self.cancel.is_some())
            .finish()
    }
}

impl Acquire {
    #[inline]
    pub(crate) fn new(client: Client, key: &[u8], lease: Duration) -> Acquire {
        Acquire {
            client,
            key: Key::new(key),
            lease,
            wait: None,
            keep_alive: false,
            max_hold: None,
            refuse_held: false,
            report_lost: true,
            cancel: None,
        }
    }

    /// Waits at most `timeout` in the key's queue, then fails with [`Error::NotAcquired`].
    /// `Duration::ZERO` tries once. Sub-millisecond parts round up; from 2^32 − 1 ms on it means
    /// without limit. Default: without limit.
    #[inline]
    pub fn wait(mut self, timeout: Duration) -> Self {
        self.wait = Some(timeout);
        self
    }

    /// Extends the lock in the background every lease/3 (with the same lease) until it is
    /// released or lost, or [`max_hold`](Acquire::max_hold) passes. Default: off.
    pub fn keep_alive(mut self, on: bool) -> Self {
        self.keep_alive = on;
        self
    }

    /// Caps keep-alive: after this long from the grant it stops, and the lock then runs out its
    /// lease. Default: none.
    pub fn max_hold(mut self, max_hold: Duration) -> Self {
        self.max_hold = Some(max_hold);
        self
    }

    /// Fails at once with [`Error::AlreadyHeld`] when this client already holds the key, instead
    /// of queueing behind itself. Default: off (the owner is the token, not the client: two
    /// tasks sharing a client exclude each other).
    pub fn refuse_held(mut self, on: bool) -> Self {
        self.refuse_held = on;
        self
    }

    /// Cancels the acquire when `signal` completes (a `CancellationToken`'s `cancelled()`, a
    /// oneshot receiver, a shutdown future...), and **waits for the clean-up**: the request is
    /// withdrawn with `CANCEL`, and a grant that raced the cancellation is released, before the
    /// acquire fails with [`Error::Cancelled`] (bounded by
    /// [`ClientOptions::cleanup_timeout`](crate::ClientOptions::cleanup_timeout); the clean-up
    /// then finishes in the background). Once it returns, the server no longer counts this
    /// client as waiting. Dropping the future instead does the same clean-up in the background.
    ///
    /// ```no_run
    /// # async fn f(client: ticketing::Client) -> Result<(), ticketing::Error> {
    /// use std::time::Duration;
    /// let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    /// let waiting = client.acquire("k", Duration::from_secs(10)).cancel_on(async move {
    ///     let _ = stopped.await;
    /// });
    /// # drop(stop);
    /// match waiting.await {
    ///     Err(ticketing::Error::Cancelled { .. }) => println!("withdrawn, nothing held"),
    ///     other => println!("{other:?}"),
    /// }
    /// # Ok(()) }
    /// ```
    pub fn cancel_on(mut self, signal: impl Future<Output = ()> + Send + 'static) -> Self {
        self.cancel = Some(Box::pin(signal));
        self
    }

    /// For [`run`](Acquire::run): whether a lock lost while the body ran is reported as
    /// [`Error::LockLost`]. Default: on.
    pub fn report_lost(mut self, on: bool) -> Self {
        self.report_lost = on;
        self
    }

    /// Acquires the lock, runs `body` with it, then releases it, and returns the body's output.
    ///
    /// If the lock was lost while the body ran, returns [`Error::LockLost`] naming the reason
    /// after the body finishes (unless [`report_lost`](Acquire::report_lost) is off). The body
    /// should also watch [`Lock::lost`] to stop early. If the body panics or the future is
    /// dropped, the lock is released in the background.
    ///
    /// ```no_run
    /// # async fn f(client: ticketing::Client) -> Result<(), ticketing::Error> {
    /// use std::time::Duration;
    /// let rows = client
    ///     .acquire("daily-batch", Duration::from_secs(60))
    ///     .keep_alive(true)
    ///     .run(async |lock| {
    ///         // ... the batch, passing lock.token() to every write ...
    ///         42
    ///     })
    ///     .await?;
    /// # Ok(()) }
    /// ```
    pub async fn run<T, F>(self, body: F) -> Result<T, Error>
    where
        F: AsyncFnOnce(&Lock) -> T,
    {
        let report = self.report_lost;
        let guard = self.await?.into_guard();
        let out = body(&guard).await;
        let lost = guard.lost_reason();
        let key = key_text(guard.key());
        let token = guard.token();
        let released = guard.release().await;
        match (lost, released) {
            (Some(reason), _) if report => Err(Error::LockLost { key, token, reason }),
            (_, Err(Error::LockLost { .. })) if !report => Ok(out),
            (_, Err(e)) => Err(e),
            (_, Ok(())) => Ok(out),
        }
    }

    /// Checks the arguments; the request and how long its answer is waited for.
    #[inline(always)]
    fn request(&self) -> Result<(Req, Bound), Error> {
        check_key_len(&self.key)?;
        let lease = lease_ms(self.lease)?;
        let wait = wait_ms(self.wait);
        if self.refuse_held && self.client.holds(&self.key) {
            return Err(Error::AlreadyHeld { key: key_text(&self.key) });
        }
        let mut req = Req::new(Op::ACQUIRE, self.key.clone());
        req.lease_ms = lease;
        req.wait_ms = wait;
        // The request timeout bounds everything but the time spent queued: with a wait limit the
        // server answers by then; without one, the heartbeat watches the connection. When the
        // bound passes, the client's timer withdraws the acquire (`CANCEL`, and a grant that still
        // comes is released) and fails it with `Error::Timeout`.
        let bound = match wait {
            wire::WAIT_FOREVER => Bound::None,
            _ => Bound::After(Duration::from_millis(wait.into()) + self.client.inner().opts.request_timeout),
        };
        Ok((req, bound))
    }

    /// The acquire's first step, without waiting: checks the arguments and queues the request
    /// when there is a connection (and no cancel signal), its answer to wake `waker`. Returns the
    /// request's id and waiter ticket, or `None` when it queued nothing ([`execute`] does it all).
    ///
    /// [`execute`]: Acquire::execute
    fn start(&self, waker: &std::task::Waker) -> Result<Option<(u64, usize)>, Error> {
        if self.cancel.is_some() {
            return Ok(None);
        }
        let (req, bound) = self.request()?;
        match self.client.inner().try_send(req, None, None, bound, Some(waker))? {
            Queued::Sent(sent) => Ok(Some((sent.id, sent.ticket))),
            Queued::NoConnection(..) => Ok(None),
        }
    }

    /// The whole acquire, for what [`start`](Acquire::start) leaves: waiting for a connection,
    /// a cancel signal.
    async fn execute(mut self) -> Result<Lock, Error> {
        let (req, bound) = self.request()?;
        let inner = self.client.inner();
        let now = Instant::now();
        let sent = inner.send(req, now + inner.opts.request_timeout, None, now, bound).await?;
        let mut pending = PendingAcquire { inner, key: &self.key, id: sent.id, ticket: sent.ticket, armed: true };
        let answer = match self.cancel.take() {
            None => pending.answer().await,
            Some(signal) => {
                tokio::select! {
                    biased;
                    a = pending.answer() => a,
                    // Boxed: rare, and large (it may release a grant).
                    () = signal => return Err(Box::pin(pending.withdraw()).await),
                }
            }
        };
        pending.armed = false;
        drop(pending);
        self.finish(answer)
    }

    /// Maps the acquire's answer to the lock or the error.
    // Inlined: its result (and the acquire) are then built where they go rather than moved
    // through a call.
    #[inline(always)]
    fn finish(self, answer: Result<Answer, Error>) -> Result<Lock, Error> {
        match answer {
            Err(e) => Err(e),
            Ok(Answer::Granted { token, era }) => {
                if self.keep_alive {
                    start_keepalive(self.client.inner(), token, era, self.key.clone(), self.max_hold);
                }
                Ok(Lock::new(self.client, self.key, token, era))
            }
            Ok(Answer::Reply(r)) if r.status == Status::OK => {
                Err(Error::Protocol { message: "ACQUIRE OK delivered without a lock".into() })
            }
            Ok(Answer::Reply(r)) => {
                Err(status_error(Op::ACQUIRE, &r, &self.key, 0, self.wait.unwrap_or(Duration::MAX)))
            }
        }
    }
}

/// Gives up the acquire `id` (waiter `ticket`) of `key` whose caller went away: withdraws it
/// (`CANCEL`), or releases the grant already delivered for it.
fn abandon(inner: &Inner, id: u64, ticket: usize, key: &Key) {
    let mut st = inner.lock_state();
    match st.take_answer(ticket) {
        Some(Ok(Answer::Granted { token, era })) => st.abandon_lock(token, era, key.clone()),
        Some(_) => {}
        None => {
            st.abandon_acquire(id, Instant::now());
            st.free_slot(ticket);
        }
    }
}

/// An acquire on the wire whose caller may give up: dropping it armed withdraws the request
/// (`CANCEL`) and releases a grant that already arrived for it.
struct PendingAcquire<'a> {
    inner: &'a Arc<Inner>,
    key: &'a Key,
    id: u64,
    ticket: usize,
    armed: bool,
}

impl PendingAcquire<'_> {
    fn answer(&self) -> AnswerFuture<'_> {
        crate::client::Sent { id: self.id, ticket: self.ticket, registered: false }.answer(self.inner)
    }

    /// Withdraws the acquire and waits (up to the cleanup timeout) for its final answer,
    /// releasing a grant that raced the cancellation; returns the error to report.
    async fn withdraw(&mut self) -> Error {
        let cleanup = self.inner.opts.cleanup_timeout;
        let deadline = Instant::now() + cleanup;
        self.inner.lock_state().cancel_acquire(self.id, Instant::now());
        let answer = timeout_at(deadline, self.answer()).await;
        match answer {
            Ok(Ok(Answer::Granted { token, era })) => {
                self.armed = false;
                release_unclaimed(self.inner, Gate { token, era, key: self.key }, deadline).await;
            }
            Ok(_) => self.armed = false,
            // Still no answer: dropping `self` armed finishes the clean-up in the background.
            Err(_) => {}
        }
        Error::Cancelled { key: key_text(self.key) }
    }
}

impl Drop for PendingAcquire<'_> {
    fn drop(&mut self) {
        if self.armed {
            abandon(self.inner, self.id, self.ticket, self.key);
        }
    }
}

/// The future of an [`Acquire`]: resolves to the [`Lock`] once granted. Dropping it before then
/// withdraws the request from the queue and releases a grant that raced the drop.
///
/// Not a boxed `async fn`: an acquire is the hot path, and most are queued at their first poll
/// and then only await their answer, which this does without an allocation of its own.
#[must_use = "futures do nothing unless polled"]
pub struct AcquireFuture {
    // The acquire stays where it is from the start to the answer (each step only changes `step`):
    // moving it between the steps' variants cost more than the rest of the step.
    /// Until the answer is handed over, or the acquire moves into [`Step::Boxed`].
    acquire: Option<Acquire>,
    step: Step,
}

enum Step {
    /// Not polled yet.
    Start,
    /// Queued (request `id`, waiter `ticket`: see [`Inner::poll_answer`]), awaiting the answer:
    /// dropped then, the future withdraws the request like [`PendingAcquire`].
    Waiting {
        id: u64,
        ticket: usize,
    },
    /// Anything else (waiting for a connection, a cancel signal).
    Boxed(Pin<Box<dyn Future<Output = Result<Lock, Error>> + Send>>),
    Done,
}

impl Drop for AcquireFuture {
    fn drop(&mut self) {
        if let (Step::Waiting { id, ticket }, Some(a)) = (&self.step, &self.acquire) {
            abandon(a.client.inner(), *id, *ticket, &a.key);
        }
    }
}

impl fmt::Debug for AcquireFuture {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("AcquireFuture")
    }
}

impl Future for AcquireFuture {
    type Output = Result<Lock, Error>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = &mut *self;
        loop {
            match this.step {
                Step::Start => {
                    let Some(acquire) = &this.acquire else { panic!("AcquireFuture polled after completion") };
                    match acquire.start(cx.waker()) {
                        Err(e) => {
                            this.step = Step::Done;
                            return Poll::Ready(Err(e));
                        }
                        // Its answer wakes this task (and cannot be there yet but from another
                        // thread, which then wakes it too): no need to look now.
                        Ok(Some((id, ticket))) => {
                            this.step = Step::Waiting { id, ticket };
                            return Poll::Pending;
                        }
                        Ok(None) => {
                            let Some(acquire) = this.acquire.take() else { unreachable!() };
                            this.step = Step::Boxed(Box::pin(acquire.execute()));
                        }
                    }
                }
                Step::Waiting { ticket, .. } => {
                    let answer = match &this.acquire {
                        Some(a) => ready!(a.client.inner().poll_answer(ticket, cx)),
                        None => Err(Error::Closed),
                    };
                    // Answered: nothing to withdraw any more.
                    this.step = Step::Done;
                    return Poll::Ready(match this.acquire.take() {
                        Some(a) => a.finish(answer),
                        None => Err(Error::Closed),
                    });
                }
                Step::Boxed(ref mut f) => {
                    let out = ready!(f.as_mut().poll(cx));
                    this.step = Step::Done;
                    return Poll::Ready(out);
                }
                Step::Done => panic!("AcquireFuture polled after completion"),
            }
        }
    }
}

impl IntoFuture for Acquire {
    type Output = Result<Lock, Error>;
    type IntoFuture = AcquireFuture;

    #[inline]
    fn into_future(self) -> AcquireFuture {
        AcquireFuture { acquire: Some(self), step: Step::Start }
    }
}
