using System;
using System.Collections.Generic;
using System.Diagnostics;
using System.Linq;
using System.Security.Cryptography;
using System.Threading;
using System.Threading.Tasks;
using Ticketing.Protocol;

namespace Ticketing
{
    /// <summary>
    /// The engine's connection life: the first connect, reconnect rounds with backoff and leader
    /// hints, adopting a connection per its <c>WELCOME</c> (resume, session ended, restarted
    /// server), connection failures, the session grace, the heartbeat, and closing.
    /// </summary>
    internal sealed partial class Engine
    {
        // ---- connecting ----

        /// <summary>
        /// Connects for the first time; throws when a round fails, except a round in which a node
        /// answered <c>NOT_LEADER</c> (a cluster electing a leader, as when the application and the
        /// cluster start together): such rounds are retried at the shortest backoff until the
        /// request timeout has passed since the connect began (then the last round's error is
        /// thrown), or <paramref name="ct"/> is cancelled.
        /// </summary>
        internal async Task StartAsync(CancellationToken ct)
        {
            using (ct.Register(() => _closeCts.Cancel()))
            {
                Dialer.Dialed d = null;
                var elapsed = Stopwatch.StartNew();
                while (d == null)
                {
                    try
                    {
                        d = await DialRoundAsync().ConfigureAwait(false);
                    }
                    catch (ClosedException) when (ct.IsCancellationRequested)
                    {
                        throw new OperationCanceledException("connecting was cancelled", ct);
                    }
                    catch (UnavailableException e) when (SawElection())
                    {
                        TimeSpan pause = Backoff(0);
                        if (elapsed.Elapsed + pause > Opts.RequestTimeout)
                        {
                            throw;
                        }
                        Log.TraceEvent(TraceEventType.Verbose, 0, "no leader yet; connecting again in {0} ms: {1}",
                            (long)pause.TotalMilliseconds, e.Message);
                        try
                        {
                            await TimerQueue.Shared.Delay(pause, _closeCts.Token).ConfigureAwait(false);
                        }
                        catch (OperationCanceledException)
                        {
                            throw new OperationCanceledException("connecting was cancelled", ct);
                        }
                    }
                }
                var after = new List<Action>();
                lock (_mu)
                {
                    Install(d, after); // no state id yet: never asks to dial again
                }
                Run(after);
            }
        }

        /// <summary>Whether a node answered <c>NOT_LEADER</c> in the last round (an election).</summary>
        private bool SawElection()
        {
            lock (_mu)
            {
                return _election;
            }
        }

        /// <summary>
        /// How long a node whose connection went silent (a heartbeat <c>PING</c> unanswered: frozen,
        /// or cut off) is left out of the connect rounds, as an endpoint and as a leader hint, when
        /// there are other endpoints: it still accepts TCP and would cost the handshake wait, and
        /// the other nodes keep naming it as the leader until they elect another one
        /// (docs/clients.md, rule 1). After that it is tried last.
        /// </summary>
        internal const double SilentSkipMs = 2000;

        /// <summary>
        /// One round: the leader hint first, then every endpoint once, leaving out the node just
        /// found silent for <see cref="SilentSkipMs"/> (unless it is the only endpoint).
        /// </summary>
        private async Task<Dialer.Dialed> DialRoundAsync()
        {
            var order = new List<string>();
            byte[] session;
            int start;
            Endpoint skip = null;
            lock (_mu)
            {
                if (Opts.Endpoints.Count > 1 && _silent != null && Clock.Now < _silentTill)
                {
                    skip = _silent;
                }
                if (_leaderHint != null && !IsEndpoint(_leaderHint, skip))
                {
                    order.Add(_leaderHint);
                }
                _leaderHint = null;
                session = (byte[])_sessionId.Clone();
                start = _endpointIndex;
            }
            for (int i = 0; i < Opts.Endpoints.Count; i++)
            {
                Endpoint ep = Opts.Endpoints[(start + i) % Opts.Endpoints.Count];
                if (!ep.Equals(skip))
                {
                    order.Add(ep.ToString());
                }
            }
            var failures = new List<TicketingException>();
            TicketingException definitive = null;
            int redirects = 0;
            for (int i = 0; i < order.Count; i++)
            {
                if (_closeCts.IsCancellationRequested)
                {
                    throw new ClosedException("the client was closed while connecting");
                }
                Endpoint ep;
                try
                {
                    ep = Endpoint.Parse(order[i]);
                }
                catch (ArgumentException)
                {
                    failures.Add(new UnavailableException("bad leader address \"" + order[i] + "\""));
                    continue;
                }
                try
                {
                    Dialer.Dialed d = await Dialer.DialAsync(ep, Opts, session, _rng, _closeCts.Token).ConfigureAwait(false);
                    lock (_mu)
                    {
                        int idx = Opts.Endpoints.IndexOf(ep);
                        if (idx >= 0)
                        {
                            _endpointIndex = idx;
                        }
                    }
                    return d;
                }
                catch (ClosedException)
                {
                    throw;
                }
                catch (Dialer.NotLeaderException e)
                {
                    failures.Add(e);
                    if (e.Leader != null && !IsEndpoint(e.Leader, skip) && redirects++ < Opts.Endpoints.Count + 2)
                    {
                        order.Insert(i + 1, e.Leader);
                    }
                }
                catch (TicketingException e) when (e is UnavailableException || e is ProtocolException || e is ShuttingDownException || e is BusyException)
                {
                    failures.Add(e);
                }
                catch (TicketingException e)
                {
                    // auth, version, TLS: the same on every endpoint of one deployment
                    failures.Add(e);
                    if (definitive == null)
                    {
                        definitive = e;
                    }
                }
            }
            lock (_mu)
            {
                _election = failures.Any(f => f is Dialer.NotLeaderException);
            }
            if (_closeCts.IsCancellationRequested)
            {
                throw new ClosedException("the client was closed while connecting");
            }
            if (definitive != null)
            {
                throw definitive;
            }
            if (failures.Count == 1 && !(failures[0] is Dialer.NotLeaderException))
            {
                throw failures[0];
            }
            // When every endpoint said "not leader", the first such answer is the cause (a cluster electing).
            throw new UnavailableException("no endpoint could be connected to: " + string.Join("; ", failures.Select(f => f.Message)),
                failures.All(f => f is Dialer.NotLeaderException) ? failures[0] : null);
        }

        /// <summary>Whether the address <paramref name="text"/> names <paramref name="ep"/> (false when <paramref name="ep"/> is null).</summary>
        private static bool IsEndpoint(string text, Endpoint ep)
        {
            if (ep == null)
            {
                return false;
            }
            try
            {
                return ep.Equals(Endpoint.Parse(text));
            }
            catch (ArgumentException)
            {
                return false;
            }
        }

        /// <summary>_mu must be held. Starts the reconnect loop unless it runs or the client is closed.</summary>
        private void EnsureConnecting()
        {
            if (_connecting || _closed || _conn != null)
            {
                return;
            }
            _connecting = true;
            Task.Run(ReconnectLoopAsync);
        }

        private async Task ReconnectLoopAsync()
        {
            int round = 0;
            var after = new List<Action>();
            while (true)
            {
                lock (_mu)
                {
                    if (_closed || _conn != null)
                    {
                        _connecting = false;
                        return;
                    }
                    if (_inflight.Count == 0 && _unsent.Count == 0 && _held.Count == 0
                        && Clock.ToMs(Clock.Now - _droppedAt) > _graceMs)
                    {
                        _connecting = false; // idle: the next request starts a new loop
                        return;
                    }
                }
                try
                {
                    Dialer.Dialed d = await DialRoundAsync().ConfigureAwait(false);
                    bool again;
                    lock (_mu)
                    {
                        again = Install(d, after);
                        if (!again)
                        {
                            _connecting = false;
                        }
                    }
                    Run(after);
                    if (!again)
                    {
                        return;
                    }
                    round = 0;
                    continue;
                }
                catch (ClosedException)
                {
                    lock (_mu)
                    {
                        _connecting = false;
                    }
                    return;
                }
                catch (TicketingException e) when (!(e is AuthFailedException || e is UnsupportedVersionException))
                {
                    // Unavailable, not the leader, TLS, busy...: calls keep waiting (each bounded by
                    // its own timeout) while the loop retries with backoff.
                    Log.TraceEvent(TraceEventType.Verbose, 0, "reconnect round failed: {0}", e.Message);
                    lock (_mu)
                    {
                        _lastConnectError = e;
                    }
                }
                catch (TicketingException e)
                {
                    // No retry fixes these: fail what waits at once (and keep trying, for later calls).
                    Log.TraceEvent(TraceEventType.Warning, 0, "reconnect refused: {0}", e.Message);
                    lock (_mu)
                    {
                        _lastConnectError = e;
                        foreach (Request r in _unsent.ToList())
                        {
                            FailLocked(r, e, after);
                        }
                        foreach (Request r in InflightInOrder())
                        {
                            if (!r.Abandoned)
                            {
                                FailLocked(r, e, after);
                            }
                        }
                    }
                    Run(after);
                }
                catch (Exception e)
                {
                    Log.TraceEvent(TraceEventType.Error, 0, "reconnect failed unexpectedly: {0}", e);
                }
                lock (_mu)
                {
                    if (_election)
                    {
                        // A node answered NOT_LEADER: the cluster is electing a leader, which takes
                        // well under a second; the next round comes after the shortest pause.
                        round = 0;
                    }
                }
                TimeSpan pause = Backoff(round);
                round++;
                try
                {
                    await TimerQueue.Shared.Delay(pause, _closeCts.Token).ConfigureAwait(false);
                }
                catch (OperationCanceledException)
                {
                    lock (_mu)
                    {
                        _connecting = false;
                    }
                    return;
                }
            }
        }

        /// <summary>The pause before reconnect round <paramref name="round"/>: doubling from the minimum to the maximum, with jitter.</summary>
        private TimeSpan Backoff(int round)
        {
            double min = Opts.BackoffMin.TotalMilliseconds;
            double max = Opts.BackoffMax.TotalMilliseconds;
            double baseMs = Math.Min(max, min * Math.Pow(2, Math.Min(round, 20)));
            lock (_jitter)
            {
                return TimeSpan.FromMilliseconds(baseMs / 2 + _jitter.NextDouble() * baseMs / 2);
            }
        }

        /// <summary>
        /// _mu must be held. Adopts a new connection per its <c>WELCOME</c>: first state, resume,
        /// session ended, or a different state id (then every lock is lost and it returns true:
        /// dial again at once, with a new session id).
        /// </summary>
        private bool Install(Dialer.Dialed d, List<Action> after)
        {
            if (_closed)
            {
                d.Close();
                return false;
            }
            WelcomeFrame w = d.Welcome;
            if (_stateId != null && !Handshake.ProofsEqual(_stateId, w.StateId))
            {
                Log.TraceEvent(TraceEventType.Information, 0, "server at {0} has a new state id: every lock is lost", d.Endpoint);
                _generation++;
                _stateId = w.StateId;
                var e = new ServerRestartedException("the server at " + d.Endpoint
                    + " restarted (its state id changed): the request was in flight and is not sent again; every lock of this client is lost");
                // Only what the old state may have run fails: requests in flight on it, and the
                // client's own clean-up of it. A request not sent yet, or answered NOT_LEADER (it
                // never ran), goes to the new state as a new request.
                var requeue = new List<Request>();
                foreach (Request r in InflightInOrder())
                {
                    if (r.NotRun && !r.Internal && !r.Abandoned)
                    {
                        _inflight.Remove(r.Id);
                        r.Id = 0;
                        r.NotRun = false;
                        requeue.Add(r);
                    }
                    else
                    {
                        FailLocked(r, e, after);
                    }
                }
                _inflight.Clear();
                foreach (Request r in _unsent.ToList())
                {
                    if (r.Internal)
                    {
                        FailLocked(r, e, after);
                    }
                }
                _unsent.InsertRange(0, requeue);
                foreach (TicketingLock l in _held.Values.ToList())
                {
                    after.Add(() => l.MarkLost(LostReason.ServerRestarted));
                }
                _held.Clear();
                _sessionId = NewSessionId();
                _nextId = 1;
                _ackInFlight = false;
                _answersSinceAck = 0;
                d.Close();
                return true;
            }
            _stateId = w.StateId;
            _graceMs = w.SessionGraceMs;
            _lastConnectError = null;
            if (_graceTimer != null)
            {
                _graceTimer.Dispose();
                _graceTimer = null;
            }
            _conn = new Connection(d, this);
            _conn.Start();
            if (w.Resumed)
            {
                foreach (Request r in InflightInOrder())
                {
                    r.NotRun = false;
                    _conn.Enqueue(r);
                }
                foreach (Request r in InflightInOrder())
                {
                    if (r.Abandoned && !r.CancelSent && r.Op == Op.Acquire)
                    {
                        SendCancelLocked(r);
                    }
                }
            }
            else
            {
                var e = new ConnectionLostException("the connection to the server dropped and the session could not be resumed;"
                    + " the outcome of the request is unknown");
                foreach (Request r in InflightInOrder())
                {
                    if (r.NotRun)
                    {
                        r.NotRun = false;
                        _conn.Enqueue(r);
                    }
                    else
                    {
                        _inflight.Remove(r.Id);
                        r.CancelTimer();
                        if (r.Op == Op.Ack)
                        {
                            _ackInFlight = false;
                        }
                        if (r.Abandoned)
                        {
                            after.Add(() => r.SetSettled());
                        }
                        else
                        {
                            FailLocked(r, e, after);
                        }
                    }
                }
                _ackInFlight = false;
                _answersSinceAck = 0;
            }
            while (_unsent.Count > 0)
            {
                Request r = _unsent[0];
                _unsent.RemoveAt(0);
                SendLocked(r);
            }
            StartHeartbeatLocked(_conn);
            return false;
        }

        public void OnFailure(Connection c, TicketingException cause)
        {
            OnFailure(c, cause, false);
        }

        /// <summary>
        /// Gives <paramref name="c"/> up: the next connection resumes the session. After an
        /// unanswered heartbeat (<paramref name="silent"/>: a frozen or cut-off node, whose kernel
        /// still accepts connections) the node just left is neither dialled nor followed as a
        /// leader hint for <see cref="SilentSkipMs"/>, and is tried last after that.
        /// </summary>
        private void OnFailure(Connection c, TicketingException cause, bool silent)
        {
            lock (_mu)
            {
                if (c != _conn)
                {
                    c.Close();
                    return;
                }
                Log.TraceEvent(TraceEventType.Verbose, 0, "connection lost: {0}", cause.Message);
                int idx = Opts.Endpoints.IndexOf(c.Endpoint);
                if (silent && idx >= 0)
                {
                    _endpointIndex = (idx + 1) % Opts.Endpoints.Count;
                }
                if (silent)
                {
                    _silent = c.Endpoint;
                    _silentTill = Clock.Now + Clock.FromMs(SilentSkipMs);
                }
                _conn = null;
                _droppedAt = Clock.Now;
                c.Close();
                if (_heartbeat != null)
                {
                    _inflight.Remove(_heartbeat.Id);
                    _heartbeat.CancelTimer();
                    _heartbeat.Done = true;
                    _heartbeat = null;
                }
                if (_heartbeatTimer != null)
                {
                    _heartbeatTimer.Dispose();
                    _heartbeatTimer = null;
                }
                if (_closed)
                {
                    return;
                }
                _graceTimer = Clock.Once(_graceMs, OnGraceOver);
                EnsureConnecting();
            }
        }

        /// <summary>The session grace passed without a reconnect: the answers still awaited are lost.</summary>
        private void OnGraceOver()
        {
            var after = new List<Action>();
            lock (_mu)
            {
                if (_conn != null || _closed)
                {
                    return;
                }
                var e = new ConnectionLostException("the connection dropped and was not back within the session grace ("
                    + _graceMs + " ms); the outcome of the request is unknown");
                foreach (Request r in InflightInOrder())
                {
                    if (r.Abandoned)
                    {
                        continue;
                    }
                    if (r.Op == Op.Acquire)
                    {
                        AbandonLocked(r, e, after); // withdrawn on the next connection if the session lives on
                    }
                    else
                    {
                        FailLocked(r, e, after);
                    }
                }
            }
            Run(after);
        }

        /// <summary>
        /// The heartbeat's timing (docs/clients.md, the heartbeat interval): while any request waits
        /// for an answer (a queued <c>ACQUIRE</c> included) a <c>PING</c> goes after
        /// <see cref="BusyHeartbeatMs"/> of silence at most, and a <c>PING</c> unanswered within
        /// min(heartbeat, <see cref="MaxPingWaitMs"/>) gives the connection up: the client
        /// reconnects and resumes, and the calls in flight keep waiting, so that a frozen leader is
        /// left about 1 s after it froze.
        /// </summary>
        internal const double BusyHeartbeatMs = 250;

        /// <summary>The longest a heartbeat <c>PING</c> may stay unanswered; see <see cref="BusyHeartbeatMs"/>.</summary>
        internal const double MaxPingWaitMs = 750;

        /// <summary>_mu must be held. Starts the heartbeat of a new connection (one pending check at a time).</summary>
        private void StartHeartbeatLocked(Connection c)
        {
            double interval = Opts.HeartbeatInterval.TotalMilliseconds;
            if (interval <= 0)
            {
                return;
            }
            ScheduleHeartbeatLocked(c, Math.Min(interval, BusyHeartbeatMs));
        }

        private void ScheduleHeartbeatLocked(Connection c, double ms)
        {
            if (_heartbeatTimer != null)
            {
                _heartbeatTimer.Dispose();
            }
            _heartbeatTimer = Clock.Once(ms, () => HeartbeatCheck(c));
        }

        /// <summary>
        /// Sends a <c>PING</c> when nothing has arrived for the heartbeat interval
        /// (<see cref="BusyHeartbeatMs"/> while requests wait), and gives the connection up when a
        /// <c>PING</c> stays unanswered for min(heartbeat, <see cref="MaxPingWaitMs"/>).
        /// </summary>
        private void HeartbeatCheck(Connection c)
        {
            TicketingException silent;
            lock (_mu)
            {
                if (c != _conn || _closed)
                {
                    return;
                }
                double interval = Opts.HeartbeatInterval.TotalMilliseconds;
                long now = Clock.Now;
                if (_heartbeat != null)
                {
                    double wait = Math.Min(interval, MaxPingWaitMs);
                    double waited = Clock.ToMs(now - _heartbeatSent);
                    if (waited < wait)
                    {
                        ScheduleHeartbeatLocked(c, wait - waited);
                        return;
                    }
                    silent = new RequestTimeoutException("the server (" + c.Endpoint + ") did not answer a heartbeat PING within "
                        + (long)wait + " ms");
                }
                else
                {
                    double due = _inflight.Count > 0 ? Math.Min(interval, BusyHeartbeatMs) : interval;
                    double idle = Clock.ToMs(now - c.LastReceive);
                    if (idle < due)
                    {
                        // Checked again at least every BusyHeartbeatMs: a request made meanwhile shortens the interval.
                        ScheduleHeartbeatLocked(c, Math.Min(due - idle, BusyHeartbeatMs));
                        return;
                    }
                    var ping = new Request(Op.Ping, null, 0, 0, 0, true);
                    _heartbeat = ping;
                    _heartbeatSent = now;
                    SendLocked(ping);
                    ScheduleHeartbeatLocked(c, Math.Min(interval, MaxPingWaitMs));
                    return;
                }
            }
            OnFailure(c, silent, true);
        }

        // ---- closing ----

        /// <summary>Closes once; every call returns the same task.</summary>
        internal Task CloseAsync()
        {
            TaskCompletionSource<bool> done;
            lock (_mu)
            {
                if (_closeTask != null)
                {
                    return _closeTask;
                }
                done = new TaskCompletionSource<bool>(TaskCreationOptions.RunContinuationsAsynchronously);
                _closeTask = done.Task;
            }
            CloseCoreAsync().ContinueWith(t =>
            {
                if (t.IsFaulted)
                {
                    Log.TraceEvent(TraceEventType.Error, 0, "closing failed: {0}", t.Exception);
                }
                done.TrySetResult(true);
            }, TaskContinuationOptions.ExecuteSynchronously);
            return done.Task;
        }

        private async Task CloseCoreAsync()
        {
            var after = new List<Action>();
            var waits = new List<Task>();
            var toRelease = new List<TicketingLock>();
            List<TicketingLock> stillHeld;
            bool connected;
            lock (_mu)
            {
                _closing = true;
                var e = new ClosedException("the client was closed");
                foreach (Request r in _unsent.ToList())
                {
                    if (!r.Internal)
                    {
                        FailLocked(r, e, after);
                    }
                }
                foreach (Request r in InflightInOrder())
                {
                    if (r.Op == Op.Acquire && !r.Done)
                    {
                        AbandonLocked(r, e, after);
                        waits.Add(r.Settled);
                    }
                    else if (r.Abandoned)
                    {
                        waits.Add(r.Settled);
                    }
                }
                if (Opts.ReleaseOnClose)
                {
                    toRelease.AddRange(_held.Values);
                }
                connected = _conn != null;
            }
            Run(after);
            foreach (TicketingLock l in toRelease)
            {
                waits.Add(l.ReleaseInternalAsync(true).ContinueWith(t => { var ignored = t.Exception; }, TaskContinuationOptions.ExecuteSynchronously));
            }
            if (connected && waits.Count > 0)
            {
                TimeSpan bound = Opts.CleanupTimeout < Opts.RequestTimeout ? Opts.CleanupTimeout : Opts.RequestTimeout;
                await TimerQueue.Shared.WaitAsync(Task.WhenAll(waits), bound).ConfigureAwait(false);
            }
            lock (_mu)
            {
                _closed = true;
                var e = new ClosedException("the client was closed");
                foreach (Request r in _unsent.ToList())
                {
                    FailLocked(r, e, after);
                }
                foreach (Request r in InflightInOrder())
                {
                    FailLocked(r, e, after);
                }
                _timeouts.Clear(); // every request on it was failed above
                stillHeld = _held.Values.ToList(); // their keep-alive stops (below); their deadlines still fire
                _held.Clear();
                if (_conn != null)
                {
                    _conn.Close();
                    _conn = null;
                }
                if (_heartbeatTimer != null)
                {
                    _heartbeatTimer.Dispose();
                    _heartbeatTimer = null;
                }
                if (_graceTimer != null)
                {
                    _graceTimer.Dispose();
                    _graceTimer = null;
                }
            }
            _closeCts.Cancel();
            foreach (TicketingLock l in stillHeld)
            {
                l.StopKeepAlive();
            }
            Run(after);
        }
    }
}
