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
    /// The session engine behind <see cref="TicketingClient"/>: request ids, the in-flight table,
    /// the connection and its replacement (reconnect, resume, leader hints), ACK, heartbeat,
    /// timeouts and the registry of held locks.
    /// </summary>
    /// <remarks>
    /// Locking: one monitor, <c>_mu</c>, guards the engine's state. No I/O and no user code runs
    /// under it: frames are queued to the connection, and written once <c>_mu</c> is released (by
    /// the caller, or from the pool); completions are collected and posted once <c>_mu</c> is
    /// released (<see cref="Completions"/>: their continuations run on the reader thread after
    /// its frame, or on the pool). A <see cref="TicketingLock"/>'s own monitor is never held while
    /// taking <c>_mu</c>.
    /// </remarks>
    internal sealed partial class Engine : IConnectionListener
    {
        internal static readonly TraceSource Log = new TraceSource("Ticketing");

        internal readonly Settings Opts;

        /// <summary>Compares the deadlines of this client's locks with the deadline clock every <c>LOST_CHECK_MS</c>.</summary>
        internal readonly LostWatch Watch;

        private readonly object _mu = new object();
        private readonly RandomNumberGenerator _rng = RandomNumberGenerator.Create();
        private readonly Random _jitter = new Random();
        private readonly CancellationTokenSource _closeCts = new CancellationTokenSource();

        // Everything below is guarded by _mu.
        private byte[] _sessionId;
        private byte[] _stateId; // null until the first WELCOME
        private long _generation; // bumped when the state id changes
        private uint _graceMs;
        private ulong _nextId = 1;
        // By id; not sorted (a sorted map cost a tree node and a rebalance per request): the few
        // paths that need the id order (re-sends, ACK) sort with InflightInOrder.
        private readonly Dictionary<ulong, Request> _inflight = new Dictionary<ulong, Request>();
        private readonly List<Request> _unsent = new List<Request>();
        private readonly TimeoutList _timeouts; // the request timeouts of most requests (Request.cs)
        private readonly Dictionary<ulong, TicketingLock> _held = new Dictionary<ulong, TicketingLock>();
        private Connection _conn;
        private bool _connecting;
        private long _droppedAt;
        private TimerEntry _graceTimer;
        private TimerEntry _heartbeatTimer;
        private Request _heartbeat;
        private long _heartbeatSent; // Clock ticks
        private string _leaderHint;
        private int _endpointIndex;
        private Endpoint _silent; // the node whose connection the heartbeat found silent last...
        private long _silentTill; // ...which is neither dialled nor followed as a hint until then (Clock ticks)
        private TicketingException _lastConnectError; // of the last failed round since the connection dropped
        private bool _election; // a node answered NOT_LEADER in the last round
        private int _answersSinceAck;
        private bool _ackInFlight;
        private bool _closing;
        private bool _closed;
        private Task _closeTask;

        internal Engine(Settings opts)
        {
            Opts = opts;
            _timeouts = new TimeoutList(OnTimeoutsDue);
            Watch = new LostWatch(opts.DeadlineClock);
            _sessionId = NewSessionId();
        }

        private byte[] NewSessionId()
        {
            byte[] id = new byte[Wire.SessionId];
            do
            {
                _rng.GetBytes(id);
            }
            while (id.All(b => b == 0));
            return id;
        }

        internal string SessionIdHex
        {
            get
            {
                lock (_mu)
                {
                    return Args.Hex(_sessionId);
                }
            }
        }

        internal bool IsClosed
        {
            get
            {
                lock (_mu)
                {
                    return _closing;
                }
            }
        }

        private static void Run(List<Action> after)
        {
            foreach (Action a in after)
            {
                a();
            }
            after.Clear();
        }

        // ---- requests ----

        /// <summary>Sends (or queues until connected) a request made without a handler; returns its answer.</summary>
        internal Task<ResponseFrame> Submit(Request r)
        {
            Send(r);
            return r.Answer;
        }

        /// <summary>
        /// Sends (or queues until connected) a request; its outcome goes to its handler or its
        /// <see cref="Request.Answer"/>. Refused at once (on this thread) when the client is closed.
        /// </summary>
        internal void Send(Request r)
        {
            Connection flush = null;
            bool closed = false;
            lock (_mu)
            {
                if (_closed || (_closing && !r.Internal))
                {
                    r.Done = true;
                    closed = true;
                }
                else
                {
                    long now = Clock.Now; // one clock read for the timeout and the first send
                    if (r.Op != Op.Acquire || _conn == null)
                    {
                        _timeouts.Add(r, Opts.RequestTimeout.TotalMilliseconds, now);
                    }
                    if (_conn != null)
                    {
                        SendLocked(r, true, now);
                        flush = _conn;
                    }
                    else
                    {
                        _unsent.Add(r);
                        EnsureConnecting();
                    }
                }
            }
            if (closed)
            {
                // Nobody awaits the task yet: completed here, its awaiter goes on at once.
                r.FailNow(new ClosedException("the client is closed"));
                r.SetSettled();
            }
            // The caller's own thread writes the frame (and any queued with it), off _mu: no
            // thread switch before it reaches the socket (Connection's remarks).
            flush?.Flush();
        }

        /// <summary>_mu must be held and _conn set. Takes the next id (unless it has one) and queues the frame.</summary>
        private void SendLocked(Request r)
        {
            SendLocked(r, false, null);
        }

        /// <summary>
        /// _mu must be held and _conn set. Takes the next id (unless it has one) and queues the
        /// frame; with <paramref name="callerFlushes"/> the caller calls <see cref="Connection.Flush"/>
        /// once it let _mu go, else the frame is flushed from the pool. <paramref name="now"/>: the
        /// <see cref="Clock.Now"/> the caller just read, if it did.
        /// </summary>
        private void SendLocked(Request r, bool callerFlushes, long? now)
        {
            if (r.Id == 0)
            {
                long m = now ?? Clock.Now;
                r.Id = _nextId++;
                r.FirstSent = Opts.DeadlineClock.At(m);
                r.Generation = _generation;
                if (r.Op == Op.Acquire)
                {
                    r.CancelTimer();
                    if (r.WaitMs == 0)
                    {
                        _timeouts.Add(r, Opts.RequestTimeout.TotalMilliseconds, m); // a single try: the request timeout only
                    }
                    else if (r.WaitMs != Wire.WaitForever)
                    {
                        // Queued time is bounded by the wait timeout, the answer by the request timeout.
                        r.Timer = Clock.Once(r.WaitMs + Opts.RequestTimeout.TotalMilliseconds, TimeoutAction(r));
                    }
                }
            }
            _inflight[r.Id] = r;
            if (callerFlushes)
            {
                _conn.EnqueueForFlush(r);
            }
            else
            {
                _conn.Enqueue(r);
            }
        }

        /// <summary>
        /// The action that times <paramref name="r"/> out: a method of its own, as a lambda in
        /// <see cref="SendLocked(Request, bool, long?)"/> made the compiler allocate its closure on every call.
        /// </summary>
        private Action TimeoutAction(Request r)
        {
            return () => OnTimeout(r);
        }

        /// <summary>On the timer thread: the requests of <see cref="_timeouts"/> that are due time out.</summary>
        private void OnTimeoutsDue()
        {
            List<Request> due;
            lock (_mu)
            {
                due = _timeouts.TakeDue();
            }
            if (due != null)
            {
                foreach (Request r in due)
                {
                    OnTimeout(r);
                }
            }
        }

        private void OnTimeout(Request r)
        {
            var after = new List<Action>();
            lock (_mu)
            {
                if (r.Done)
                {
                    return;
                }
                double requestMs = Opts.RequestTimeout.TotalMilliseconds;
                double ms = r.Op == Op.Acquire && r.Id != 0 && r.WaitMs != Wire.WaitForever ? r.WaitMs + requestMs : requestMs;
                // While the client reconnects, the timeout names the last connect error (its inner exception).
                TicketingException why = _conn == null ? _lastConnectError : null;
                var e = new RequestTimeoutException(r.Describe() + " got no answer within "
                    + (long)ms + " ms (request timeout " + (long)requestMs + " ms)"
                    + (_conn == null ? "; not connected" : "")
                    + (why != null ? ", last connect error: " + why.Message : ""), why);
                if (r.Op == Op.Acquire)
                {
                    AbandonLocked(r, e, after);
                }
                else
                {
                    FailLocked(r, e, after);
                }
            }
            Run(after);
        }

        /// <summary>_mu must be held. Ends a request with an error (it is no longer awaited).</summary>
        private void FailLocked(Request r, Exception e, List<Action> after)
        {
            if (r.Id != 0)
            {
                _inflight.Remove(r.Id);
            }
            _unsent.Remove(r);
            r.CancelTimer();
            if (r.Op == Op.Ack)
            {
                _ackInFlight = false;
            }
            if (r == _heartbeat)
            {
                _heartbeat = null;
            }
            bool answer = !r.Done;
            r.Done = true;
            after.Add(() =>
            {
                if (answer)
                {
                    r.PostError(e);
                }
                r.SetSettled();
            });
        }

        /// <summary>
        /// Gives up on an <c>ACQUIRE</c> for its caller: it fails with <paramref name="cause"/>, and the
        /// engine withdraws it (<c>CANCEL</c> now, or on the session's next connection) and releases
        /// any grant that still comes.
        /// </summary>
        internal void Abandon(Request r, Exception cause)
        {
            var after = new List<Action>();
            lock (_mu)
            {
                AbandonLocked(r, cause, after);
            }
            Run(after);
        }

        private void AbandonLocked(Request r, Exception cause, List<Action> after)
        {
            if (r.Done)
            {
                return;
            }
            r.Done = true;
            r.Abandoned = true;
            r.CancelTimer();
            after.Add(() => r.PostError(cause));
            if (_unsent.Remove(r) || r.Id == 0 || !_inflight.ContainsKey(r.Id))
            {
                after.Add(() => r.SetSettled());
                return;
            }
            if (_conn != null)
            {
                SendCancelLocked(r);
            }
        }

        private void SendCancelLocked(Request acquire)
        {
            acquire.CancelSent = true;
            var c = new Request(Op.Cancel, null, acquire.Id, 0, 0, true);
            _timeouts.Add(c, Opts.RequestTimeout.TotalMilliseconds);
            SendLocked(c);
        }

        /// <summary>_mu must be held. Releases a grant nobody will use (a cancelled acquire's).</summary>
        private void ReleaseGrantLocked(byte[] key, ulong token, Request acquire)
        {
            var rel = new Request(Op.Release, key, token, 0, 0, true);
            rel.Answer.ContinueWith(_ => acquire.SetSettled(), TaskContinuationOptions.ExecuteSynchronously);
            _timeouts.Add(rel, Opts.RequestTimeout.TotalMilliseconds);
            if (_conn != null)
            {
                SendLocked(rel);
            }
            else
            {
                _unsent.Add(rel);
                EnsureConnecting();
            }
        }

        // ---- reading ----

        public void OnFrame(Connection c, ResponseFrame f)
        {
            List<Action> after = null;
            Request answered = null;
            string failWhy = null;
            lock (_mu)
            {
                if (c != _conn)
                {
                    return;
                }
                if (f.RequestId == 0)
                {
                    after = new List<Action>();
                    failWhy = PushLocked(c, f, after);
                }
                else
                {
                    Request r;
                    if (!_inflight.TryGetValue(f.RequestId, out r))
                    {
                        Log.TraceEvent(TraceEventType.Verbose, 0, "answer for request {0} nobody awaits", f.RequestId);
                    }
                    else if (f.Status == Status.NotLeader)
                    {
                        r.NotRun = true;
                        _leaderHint = f.Data.Length == 0 ? null : Args.Utf8(f.Data);
                        failWhy = c.Endpoint + " is not the leader" + (_leaderHint == null ? "" : "; the leader is " + _leaderHint);
                    }
                    else if (AnsweredLocked(r, f, ref after))
                    {
                        answered = r;
                    }
                }
            }
            if (answered != null)
            {
                // The common case, without a closure: the caller's answer (its continuation runs
                // after this frame, on this reader thread: Completions).
                answered.PostAnswer(f);
                answered.SetSettled();
            }
            if (after != null)
            {
                Run(after);
            }
            if (failWhy != null)
            {
                OnFailure(c, new ConnectionLostException(failWhy));
            }
        }

        /// <summary>
        /// _mu must be held. Takes <paramref name="r"/> out of the table; true when its caller is to
        /// get <paramref name="f"/> (then complete it, once _mu is let go); other follow-ups go to
        /// <paramref name="after"/> (made when needed).
        /// </summary>
        private bool AnsweredLocked(Request r, ResponseFrame f, ref List<Action> after)
        {
            _inflight.Remove(r.Id);
            r.CancelTimer();
            if (r.Op == Op.Ack)
            {
                _ackInFlight = false;
            }
            else
            {
                _answersSinceAck++;
            }
            if (r == _heartbeat)
            {
                _heartbeat = null;
            }
            bool answer = false;
            if (r.Abandoned)
            {
                if (r.Op == Op.Acquire && f.Status == Status.Ok)
                {
                    ReleaseGrantLocked(r.Key, f.Token, r);
                }
                else
                {
                    (after = after ?? new List<Action>()).Add(SettleAction(r));
                }
            }
            else if (!r.Done)
            {
                r.Done = true;
                answer = true;
            }
            MaybeAckLocked();
            return answer;
        }

        /// <summary>
        /// An action that settles <paramref name="r"/>: a method of its own, as a lambda in
        /// <see cref="AnsweredLocked"/> made the compiler allocate its closure on every call.
        /// </summary>
        private static Action SettleAction(Request r)
        {
            return r.SetSettled;
        }

        /// <summary>_mu must be held. Handles <c>EXPIRED</c> and <c>GOAWAY</c>; returns why to drop the connection, or null.</summary>
        private string PushLocked(Connection c, ResponseFrame f, List<Action> after)
        {
            if (f.Op == Op.Expired)
            {
                TicketingLock l;
                if (_held.TryGetValue(f.Token, out l) && l.KeyEquals(f.Data))
                {
                    LostReason lost = f.Detail == (uint)ExpiredReason.Stopping ? LostReason.ServerStopping : LostReason.Expired;
                    after.Add(() => l.MarkLost(lost));
                }
                return null;
            }
            if (f.Op == Op.Goaway)
            {
                _leaderHint = f.Data.Length == 0 ? null : Args.Utf8(f.Data);
                if (_leaderHint == null && Opts.Endpoints.Count > 1)
                {
                    _endpointIndex = (_endpointIndex + 1) % Opts.Endpoints.Count;
                }
                return c.Endpoint + " sent GOAWAY (reason " + f.Detail + ")";
            }
            Log.TraceEvent(TraceEventType.Verbose, 0, "ignoring unknown push op 0x{0:x2}", (byte)f.Op);
            return null;
        }

        /// <summary>_mu must be held. The requests in flight, in id order (the order they were sent).</summary>
        private List<Request> InflightInOrder()
        {
            List<Request> l = _inflight.Values.ToList();
            l.Sort((a, b) => a.Id.CompareTo(b.Id));
            return l;
        }

        /// <summary>_mu must be held. Sends <c>ACK</c> when due and none is unanswered.</summary>
        private void MaybeAckLocked()
        {
            if (_answersSinceAck < Wire.AckEvery / 2 || _ackInFlight || _conn == null || _closed)
            {
                return;
            }
            ulong x = _nextId;
            foreach (Request r in _inflight.Values)
            {
                if (r.Op != Op.Acquire && r.Id < x)
                {
                    x = r.Id; // the lowest id of a request other than ACQUIRE still in flight
                }
            }
            var ack = new Request(Op.Ack, null, x, 0, 0, true);
            _timeouts.Add(ack, Opts.RequestTimeout.TotalMilliseconds);
            _ackInFlight = true;
            _answersSinceAck = 0;
            SendLocked(ack);
        }

        // ---- locks ----

        /// <summary>Why <see cref="Register"/> refused a granted lock.</summary>
        internal enum Refusal
        {
            /// <summary>Registered: not refused.</summary>
            None,

            /// <summary>The client was closed (or is closing) while the grant was being handled.</summary>
            Closed,

            /// <summary>The grant belongs to a lock state that is gone (the server restarted meanwhile).</summary>
            Restarted,
        }

        /// <summary>
        /// Registers a granted lock, or says why not: the client closed, or the server restarted,
        /// while the grant was being handled (the caller's continuation runs after the answer, so
        /// either may come first).
        /// </summary>
        internal Refusal Register(TicketingLock l, long requestGeneration)
        {
            lock (_mu)
            {
                if (_closed || _closing)
                {
                    return Refusal.Closed;
                }
                if (requestGeneration != _generation)
                {
                    return Refusal.Restarted;
                }
                _held[l.Token] = l;
                return Refusal.None;
            }
        }

        internal void Unregister(TicketingLock l)
        {
            lock (_mu)
            {
                TicketingLock cur;
                if (_held.TryGetValue(l.Token, out cur) && cur == l)
                {
                    _held.Remove(l.Token);
                }
            }
        }

        /// <summary>Tells whether this client holds a lock on the key that is not lost.</summary>
        internal bool Holds(byte[] key)
        {
            List<TicketingLock> locks;
            lock (_mu)
            {
                locks = _held.Values.ToList();
            }
            return locks.Any(l => l.KeyEquals(key) && !l.IsLost);
        }
    }
}
