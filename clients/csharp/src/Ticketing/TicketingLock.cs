using System;
using System.Threading;
using System.Threading.Tasks;
using Ticketing.Protocol;
using Ticketing.Threading;

namespace Ticketing
{
    /// <summary>
    /// A held lock: its key, its fencing token, its lease, a local deadline and a lost signal
    /// (<see cref="HandleLostToken"/>). Dispose it to release it.
    /// </summary>
    /// <remarks>
    /// <para>Pass <see cref="Token"/> to the resource you protect and have it reject any token lower
    /// than the highest it has seen (fencing).</para>
    /// <para><b>Lost.</b> The lock is lost at the first of: its local deadline (the time the server
    /// says passed since the acquire first reached it, plus the lease, measured from when the
    /// acquire was first sent and slowed by the clock-rate bound, a few milliseconds early: never
    /// later than the server's), the server's <c>EXPIRED</c> notice, a <c>NOT_HELD</c> answer to an
    /// extend or release, or a reconnect to a restarted server. Then <see cref="LostReason"/> is set
    /// and <see cref="HandleLostToken"/> is cancelled, once; never after a successful release. Stop
    /// the work that needed the lock. The deadline runs on a clock that counts the time the host
    /// is suspended, as the server's lease does.</para>
    /// <para>The owner is the token, not a thread: any task may release or extend. Members are safe
    /// for concurrent use.</para>
    /// <para>It is the <see cref="IDistributedSynchronizationHandle"/> that
    /// <see cref="TicketingDistributedLockProvider"/>'s locks return.</para>
    /// </remarks>
    public sealed class TicketingLock : IDistributedSynchronizationHandle
    {
        private const double RateFactor = 1.0 - 2.0 * Wire.ClockRateBoundPpm / 1000000.0; // 1 - 2ρ

        private readonly Engine _engine;
        private readonly SuspendClock _clock;
        private readonly byte[] _key;
        private readonly AcquireOptions _options;
        private readonly long _grantedAt;
        private readonly object _gate = new object();

        /// <summary>
        /// How close to the lost time the deadline timer is armed. Farther away the client's lost
        /// check (<see cref="LostWatch"/>, every <see cref="Wire.LostCheckMs"/>) arms it, four
        /// checks ahead: a lock released well before its deadline, as most are, never puts an
        /// entry on the timer heap (an allocation, a delegate and two heap operations under the
        /// timer queue's lock per lock).
        /// </summary>
        internal const int DeadlineTimerWindowMs = 4 * Wire.LostCheckMs;

        // guarded by _gate
        // The lost signal's sources, made when first asked for (most locks are released without
        // anyone asking): a task made with options captured the execution context on Mono.
        private CancellationTokenSource _lostCts;
        private TaskCompletionSource<LostReason> _lost;
        private bool _lostTokenFired; // the token is being (or was) cancelled: a source made from now on starts cancelled
        private bool _lostTaskFired; // the callbacks ran: a Lost task made from now on starts completed
        private uint _leaseMs;
        private long _deadline; // on _clock
        private ulong _extendId; // the request id of the EXTEND whose answer set the deadline; 0: the grant's
        private LostReason? _lostReason;
        private bool _released;
        private bool _started; // Start ran: the deadline is watched (timer and lost check)
        private Task _releasing;
        private TimerEntry _deadlineTimer;
        private TimerEntry _keepAliveTimer;

        /// <summary>A granted lock: deadline = first send + (detail + lease) · (1 − 2ρ) (PROTOCOL.md, "The lost signal").</summary>
        internal TicketingLock(Engine engine, byte[] key, ulong token, uint leaseMs, uint detailMs, long firstSent, AcquireOptions options)
        {
            _engine = engine;
            _clock = engine.Opts.DeadlineClock;
            _key = key;
            Token = token;
            _leaseMs = leaseMs;
            _options = options;
            _grantedAt = options.KeepAlive && options.MaxHold != null ? Clock.Now : 0; // read only for MaxHold
            _deadline = firstSent + Clock.FromMs(((double)detailMs + leaseMs) * RateFactor);
        }

        /// <summary>The key as text (the string given to acquire; a binary key that is not UTF-8 as "0x" and hex).</summary>
        public string Key => _keyText ?? (_keyText = Args.Text(_key)); // decoded when first asked for: most callers never do

        private string _keyText;

        /// <summary>A copy of the key's bytes.</summary>
        public byte[] KeyBytes => (byte[])_key.Clone();

        /// <summary>
        /// The fencing token: larger than every token granted before it, on any key, across
        /// restarts and leader changes.
        /// </summary>
        public ulong Token { get; }

        /// <summary>The lease last granted (by the acquire or the last successful extend).</summary>
        public TimeSpan Lease
        {
            get
            {
                lock (_gate)
                {
                    return TimeSpan.FromMilliseconds(_leaseMs);
                }
            }
        }

        /// <summary>The time left until the local deadline (zero or negative once it passed).</summary>
        public TimeSpan TimeLeft
        {
            get
            {
                lock (_gate)
                {
                    return Clock.ToTimeSpan(_deadline - _clock.ExactNow);
                }
            }
        }

        /// <summary>Tells whether the lock is lost.</summary>
        public bool IsLost
        {
            get
            {
                CheckDeadline();
                lock (_gate)
                {
                    return _lostReason != null;
                }
            }
        }

        /// <summary>Tells whether this handle released the lock (or a release found it gone).</summary>
        public bool IsReleased
        {
            get
            {
                lock (_gate)
                {
                    return _released;
                }
            }
        }

        /// <summary>Why the lock was lost, or null while it is not. Set before <see cref="HandleLostToken"/> fires.</summary>
        public LostReason? LostReason
        {
            get
            {
                CheckDeadline();
                lock (_gate)
                {
                    return _lostReason;
                }
            }
        }

        /// <summary>
        /// Cancelled when the lock is lost (never for a lock released first). Pass it to the work
        /// the lock protects, or register a callback; read <see cref="LostReason"/> for why.
        /// </summary>
        public CancellationToken HandleLostToken
        {
            get
            {
                lock (_gate)
                {
                    if (_lostCts == null)
                    {
                        _lostCts = new CancellationTokenSource();
                        if (_lostTokenFired)
                        {
                            _lostCts.Cancel(); // nothing is registered yet: no callback runs under _gate
                        }
                    }
                    return _lostCts.Token;
                }
            }
        }

        /// <summary>A task that completes with the reason when the lock is lost; it never completes for a lock released first.</summary>
        public Task<LostReason> Lost
        {
            get
            {
                lock (_gate)
                {
                    if (_lost == null)
                    {
                        _lost = new TaskCompletionSource<LostReason>(TaskCreationOptions.RunContinuationsAsynchronously);
                        if (_lostTaskFired)
                        {
                            _lost.TrySetResult(_lostReason.Value); // no continuation yet
                        }
                    }
                    return _lost.Task;
                }
            }
        }

        /// <summary>Whether the deadline timer is armed now (for tests: <see cref="DeadlineTimerWindowMs"/>).</summary>
        internal bool DeadlineTimerArmed
        {
            get
            {
                lock (_gate)
                {
                    return _deadlineTimer != null;
                }
            }
        }

        internal bool KeyEquals(byte[] other)
        {
            return other != null && other.Length == _key.Length && Handshake.ProofsEqual(other, _key);
        }

        /// <summary>Arms the deadline timer, the watch and the keep-alive; called once the lock is registered.</summary>
        internal void Start()
        {
            lock (_gate)
            {
                if (_lostReason != null)
                {
                    return; // lost meanwhile (EXPIRED): nothing to watch
                }
                _started = true;
                // ExactNow: Now can miss a suspend that ended less than a look ago, and a timer
                // placed from it would fire that much late (the lost check would catch it only
                // at its next run).
                ArmDeadlineLocked(_clock.ExactNow);
                _engine.Watch.Add(this);
                if (_options.KeepAlive)
                {
                    ScheduleKeepAliveLocked();
                }
            }
        }

        /// <summary>When the lost signal is due, on the deadline clock: the deadline less a margin for timer latency.</summary>
        private long LostAtLocked()
        {
            return _deadline - Clock.FromMs(Math.Min(Wire.LostMarginMs, _leaseMs / 10.0));
        }

        /// <summary>
        /// Arms the deadline timer for the lost time when it is within <see cref="DeadlineTimerWindowMs"/>;
        /// else leaves it to the lost check (<see cref="CheckDeadline(long)"/>), with no timer.
        /// </summary>
        private void ArmDeadlineLocked(long now)
        {
            _deadlineTimer?.Dispose();
            _deadlineTimer = null;
            long left = LostAtLocked() - now;
            if (left <= Clock.FromMs(DeadlineTimerWindowMs))
            {
                _deadlineTimer = Clock.Once(Clock.ToMs(left), OnDeadlineTimer);
            }
        }

        private void OnDeadlineTimer()
        {
            lock (_gate)
            {
                if (_lostReason != null || _released)
                {
                    return;
                }
                long now = _clock.ExactNow;
                if (now < LostAtLocked())
                {
                    ArmDeadlineLocked(now); // an extend moved the deadline, or the timer was early
                    return;
                }
                SetLostLocked(Ticketing.LostReason.Expired);
            }
            AfterLost(Ticketing.LostReason.Expired);
        }

        /// <summary>
        /// Fires the lost signal if the deadline clock, read at <paramref name="now"/>, is past the
        /// lost time; else arms the deadline timer once the lost time is within
        /// <see cref="DeadlineTimerWindowMs"/> (the lost check calls this every <see cref="Wire.LostCheckMs"/>).
        /// </summary>
        internal void CheckDeadline(long now)
        {
            lock (_gate)
            {
                if (_lostReason != null || _released)
                {
                    return;
                }
                if (now < LostAtLocked())
                {
                    if (_deadlineTimer == null && _started)
                    {
                        ArmDeadlineLocked(now);
                    }
                    return;
                }
                SetLostLocked(Ticketing.LostReason.Expired);
            }
            AfterLost(Ticketing.LostReason.Expired);
        }

        /// <summary>
        /// Compares the deadline with the clock now: a call that asks about the lock's state must
        /// not wait for the timer, which stood still if the host was suspended.
        /// </summary>
        private void CheckDeadline()
        {
            CheckDeadline(_clock.ExactNow);
        }

        // ---- operations ----

        /// <summary>
        /// Releases the lock; the next waiter gets it at once. Releasing again does nothing.
        /// </summary>
        /// <param name="cancellationToken">stops waiting for the answer (the release may still happen)</param>
        /// <returns>a task that completes when the server answered</returns>
        /// <exception cref="LockLostException">the lock was lost (earlier: thrown at once, without waiting for the server, which is told in the background; or the server answered <c>NOT_HELD</c>)</exception>
        /// <exception cref="TicketingException">a timeout, a closed client, a lost connection...</exception>
        public Task ReleaseAsync(CancellationToken cancellationToken = default(CancellationToken))
        {
            Task release = ReleaseInternalAsync(false);
            return cancellationToken.CanBeCanceled ? TicketingClient.WithCancellation(release, cancellationToken, () => "release of " + Describe()) : release;
        }

        /// <summary>Releases the lock and blocks until the server answered; see <see cref="ReleaseAsync"/>.</summary>
        public void Release()
        {
            ReleaseAsync().GetAwaiter().GetResult();
        }

        internal Task ReleaseInternalAsync(bool isInternal)
        {
            ReleaseCall done;
            LostReason? lostBefore;
            CheckDeadline();
            lock (_gate)
            {
                if (_released)
                {
                    return Task.CompletedTask;
                }
                if (_releasing != null)
                {
                    return _releasing;
                }
                if (_lostReason != null)
                {
                    // Known lost: answer at once, whether or not the server can be reached, and
                    // tell the server in the background (it may not have reclaimed the lock yet,
                    // so the next waiter need not wait for the lease), unless nothing is left to
                    // release there (a restarted server, a NOT_HELD answer).
                    _released = true;
                    lostBefore = _lostReason;
                    CancelTimersLocked();
                    done = null;
                }
                else
                {
                    StopKeepAliveLocked();
                    // Completed (ReleaseCall) where the release's answer is handled (the
                    // reader thread, or the pool: Completions), or here on the caller's thread
                    // before the task is returned; never under a lock, so continuations may run inline.
                    done = new ReleaseCall(this);
                    _releasing = done.Task;
                    lostBefore = null;
                }
            }
            if (done == null)
            {
                LostReason reason = lostBefore.Value;
                if (reason != Ticketing.LostReason.ServerRestarted && reason != Ticketing.LostReason.NotHeld)
                {
                    _engine.Submit(new Request(Op.Release, _key, Token, 0, 0, true)).ContinueWith(
                        t => { var ignored = t.Exception; }, TaskContinuationOptions.ExecuteSynchronously);
                }
                var failed = new TaskCompletionSource<bool>();
                failed.SetException(LostError(reason));
                return failed.Task;
            }
            try
            {
                _engine.Send(new Request(Op.Release, _key, Token, 0, 0, isInternal, done));
            }
            catch (Exception e)
            {
                done.OnError(null, e); // in the task, as for every other failure
            }
            return done.Task;
        }

        /// <summary>
        /// A release's task and its answer's handler in one object: the answer is handled where it
        /// arrives (the reader thread, or the pool: Completions), off every lock, with no async
        /// method between it and the caller's continuation.
        /// </summary>
        private sealed class ReleaseCall : TaskCompletionSource<bool>, IAnswerHandler
        {
            private readonly TicketingLock _lock;

            internal ReleaseCall(TicketingLock l)
            {
                _lock = l;
            }

            public void OnAnswer(Request r, ResponseFrame f)
            {
                Exception e;
                try
                {
                    e = _lock.Released(f);
                }
                catch (Exception thrown)
                {
                    e = thrown;
                }
                if (e == null)
                {
                    TrySetResult(true);
                }
                else
                {
                    TrySetException(e);
                }
            }

            public void OnError(Request r, Exception e)
            {
                lock (_lock._gate)
                {
                    _lock._releasing = null; // may be retried
                }
                TrySetException(e);
            }
        }

        /// <summary>What the answer to this lock's release means: null when released, else the error.</summary>
        private Exception Released(ResponseFrame f)
        {
            if (f.Status == Status.Ok)
            {
                FinishRelease();
                return null;
            }
            if (f.Status == Status.NotHeld)
            {
                MarkLost(Ticketing.LostReason.NotHeld);
                FinishRelease();
                LostReason? reason;
                lock (_gate)
                {
                    reason = _lostReason;
                }
                return LostError(reason ?? Ticketing.LostReason.NotHeld);
            }
            lock (_gate)
            {
                _releasing = null;
            }
            return TicketingClient.StatusError(f, "release of " + Describe());
        }

        private void FinishRelease()
        {
            lock (_gate)
            {
                _released = true;
                CancelTimersLocked();
            }
            _engine.Unregister(this);
        }

        /// <summary>
        /// Sets the lease to <paramref name="lease"/> from now (it may shorten it) and moves the local
        /// deadline to when the extend was first sent plus the lease, unless the answer to a later
        /// extend of this lock (keep-alive's, another task's) was handled first: the server applies a
        /// lock's extends in the order they were sent, so the deadline and <see cref="Lease"/> follow
        /// the last one sent.
        /// </summary>
        /// <param name="lease">the new lease, at least 1 ms</param>
        /// <param name="cancellationToken">stops waiting for the answer</param>
        /// <returns>the lease the server granted</returns>
        /// <exception cref="ArgumentOutOfRangeException">the lease is below 1 ms or not below 2^32 ms</exception>
        /// <exception cref="LockLostException">the lock is lost, or the server answered <c>NOT_HELD</c></exception>
        public Task<TimeSpan> ExtendAsync(TimeSpan lease, CancellationToken cancellationToken = default(CancellationToken))
        {
            uint ms = Args.LeaseMs(lease);
            return TicketingClient.WithCancellation(ExtendInternalAsync(ms), cancellationToken, () => "extend of " + Describe());
        }

        private async Task<TimeSpan> ExtendInternalAsync(uint ms)
        {
            CheckDeadline();
            lock (_gate)
            {
                if (_lostReason != null)
                {
                    throw LostError(_lostReason.Value);
                }
                if (_released || _releasing != null)
                {
                    throw new NotHeldException(Describe() + " was released");
                }
            }
            var r = new Request(Op.Extend, _key, Token, ms, 0, false);
            ResponseFrame f = await _engine.Submit(r).ConfigureAwait(false);
            if (f.Status == Status.Ok)
            {
                lock (_gate)
                {
                    if (_lostReason != null)
                    {
                        throw LostError(_lostReason.Value);
                    }
                    // Checked under the lock that sets the deadline: two answers may be handled at once.
                    if (r.Id > _extendId)
                    {
                        _extendId = r.Id;
                        _leaseMs = f.LeaseMs;
                        _deadline = r.FirstSent + Clock.FromMs(f.LeaseMs * RateFactor);
                        if (!_released)
                        {
                            ArmDeadlineLocked(_clock.ExactNow);
                        }
                    }
                }
                return TimeSpan.FromMilliseconds(f.LeaseMs);
            }
            if (f.Status == Status.NotHeld)
            {
                MarkLost(Ticketing.LostReason.NotHeld);
                throw LostError(LostReason ?? Ticketing.LostReason.NotHeld);
            }
            throw TicketingClient.StatusError(f, "extend of " + Describe());
        }

        /// <summary>Asks the server whether this token still holds the key (<c>INSPECT</c> with the token).</summary>
        /// <param name="cancellationToken">stops waiting for the answer</param>
        /// <returns>true when the server says this lock holds the key</returns>
        public async Task<bool> VerifyAsync(CancellationToken cancellationToken = default(CancellationToken))
        {
            LockInfo info = await TicketingClient.WithCancellation(
                TicketingClient.InspectCoreAsync(_engine, _key, Token), cancellationToken, () => "verify of " + Describe()).ConfigureAwait(false);
            return info.TokenMatches && info.Token == Token;
        }

        /// <summary>
        /// Releases the lock (a <c>using</c> block). When the lock was lost while held it throws
        /// <see cref="LockLostException"/> naming the reason at once (the server is told in the
        /// background, unless it restarted or answered <c>NOT_HELD</c>), unless the
        /// acquire set <see cref="AcquireOptions.ThrowOnLost"/> to false. Disposing a released lock
        /// does nothing, and so does disposing it after its client was closed (the server then keeps
        /// the lock until its lease ends).
        /// </summary>
        /// <exception cref="LockLostException">the lock was lost meanwhile</exception>
        public void Dispose()
        {
            DisposeAsync().AsTask().GetAwaiter().GetResult();
        }

        /// <summary>Releases the lock asynchronously; see <see cref="Dispose"/>.</summary>
        /// <returns>a task that completes once released</returns>
        public ValueTask DisposeAsync()
        {
            return new ValueTask(DisposeCoreAsync());
        }

        private async Task DisposeCoreAsync()
        {
            try
            {
                await ReleaseInternalAsync(false).ConfigureAwait(false);
            }
            catch (LockLostException)
            {
                if (_options.ThrowOnLost)
                {
                    throw;
                }
            }
            catch (ClosedException)
            {
                // The client was closed first: the server keeps the lock until its lease ends.
            }
        }

        // ---- lost ----

        /// <summary>Marks the lock lost (once; never after a release) and fires the signal.</summary>
        internal void MarkLost(LostReason reason)
        {
            lock (_gate)
            {
                if (_lostReason != null || _released)
                {
                    return;
                }
                SetLostLocked(reason);
            }
            AfterLost(reason);
        }

        /// <summary>_gate must be held, the lock neither lost nor released; call <see cref="AfterLost"/> once _gate is let go.</summary>
        private void SetLostLocked(LostReason reason)
        {
            _lostReason = reason;
            CancelTimersLocked();
        }

        /// <summary>Fires the signal of a lock just marked lost, off its lock.</summary>
        private void AfterLost(LostReason reason)
        {
            _engine.Unregister(this);
            ThreadPool.QueueUserWorkItem(_ =>
            {
                CancellationTokenSource cts;
                lock (_gate)
                {
                    cts = _lostCts;
                    _lostTokenFired = true; // a token asked for from now on is cancelled already
                }
                try
                {
                    cts?.Cancel(); // runs the HandleLostToken callbacks here, off every lock
                }
                catch (AggregateException e)
                {
                    Engine.Log.TraceEvent(System.Diagnostics.TraceEventType.Warning, 0, "a HandleLostToken callback failed: {0}", e);
                }
                finally
                {
                    TaskCompletionSource<LostReason> lost;
                    lock (_gate)
                    {
                        lost = _lost;
                        _lostTaskFired = true;
                    }
                    lost?.TrySetResult(reason); // a task asked for later is made completed (Lost)
                }
            });
        }

        private void CancelTimersLocked()
        {
            _deadlineTimer?.Dispose();
            _deadlineTimer = null;
            _engine.Watch.Remove(this);
            StopKeepAliveLocked();
        }

        /// <summary>Stops the keep-alive (its client is closing); the lock runs out its lease.</summary>
        internal void StopKeepAlive()
        {
            lock (_gate)
            {
                StopKeepAliveLocked();
            }
        }

        private void StopKeepAliveLocked()
        {
            _keepAliveTimer?.Dispose();
            _keepAliveTimer = null;
        }

        private LockLostException LostError(LostReason reason)
        {
            return new LockLostException(Describe() + " was lost: " + reason.ToText(), reason);
        }

        internal string Describe()
        {
            return "lock on " + Args.Printable(_key) + " (token " + Token + ")";
        }

        // ---- keep-alive ----

        private void ScheduleKeepAliveLocked()
        {
            _keepAliveTimer = Clock.Once(Math.Max(1, _leaseMs / 3), KeepAliveTick);
        }

        private void KeepAliveTick()
        {
            uint ms;
            bool closed = _engine.IsClosed; // taken before _gate: _mu is never taken under _gate
            lock (_gate)
            {
                _keepAliveTimer = null;
                if (_lostReason != null || _released || _releasing != null || closed)
                {
                    return;
                }
                if (_options.MaxHold != null && Clock.ToMs(Clock.Now - _grantedAt) >= _options.MaxHold.Value.TotalMilliseconds)
                {
                    return; // the cap: the lock now runs out its lease
                }
                ms = _leaseMs;
            }
            ExtendInternalAsync(ms).ContinueWith(t =>
            {
                if (t.IsFaulted && t.Exception.InnerException is LockLostException)
                {
                    return;
                }
                bool closing = _engine.IsClosed;
                lock (_gate)
                {
                    if (_lostReason == null && !_released && _releasing == null && _keepAliveTimer == null && !closing)
                    {
                        ScheduleKeepAliveLocked();
                    }
                }
            }, TaskContinuationOptions.ExecuteSynchronously);
        }

        /// <inheritdoc/>
        public override string ToString()
        {
            lock (_gate)
            {
                return "TicketingLock{key=" + Args.Printable(_key) + ", token=" + Token + ", lease=" + _leaseMs + "ms"
                    + (_lostReason != null ? ", lost=" + _lostReason.Value.ToText() : "") + (_released ? ", released" : "") + "}";
            }
        }
    }
}
