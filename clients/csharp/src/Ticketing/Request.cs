using System;
using System.Collections.Generic;
using System.Diagnostics;
using System.Threading;
using System.Threading.Tasks;
using Ticketing.Protocol;

namespace Ticketing
{
    /// <summary>
    /// Takes a request's outcome instead of a <see cref="TaskCompletionSource{TResult}"/> of the
    /// answer frame: the calls made most (acquire, release) turn the answer into their own result
    /// here, on the thread <see cref="Completions"/> runs it on and off every lock, where an async
    /// method awaiting the frame cost a task, a state machine box and a continuation delegate per call.
    /// </summary>
    internal interface IAnswerHandler
    {
        /// <summary>The server answered (any status). Runs once per request, never under a lock.</summary>
        void OnAnswer(Request r, ResponseFrame f);

        /// <summary>The request ended without an answer (timeout, close, lost connection...). Runs once per request, never under a lock.</summary>
        void OnError(Request r, Exception e);
    }

    /// <summary>
    /// One request and its life in the engine. Every mutable field is guarded by the engine's lock
    /// (<c>Engine._mu</c>); <see cref="Answer"/> (or the <see cref="IAnswerHandler"/> given instead)
    /// and <see cref="Settled"/> are completed outside it. <see cref="Answer"/> is completed only through <see cref="PostAnswer"/> and
    /// <see cref="PostError"/>, where <see cref="Completions"/> says (the reader thread after its
    /// frame, or the pool: its continuations run there), never under a lock;
    /// <see cref="Settled"/>'s continuations run on the pool.
    /// </summary>
    internal sealed class Request : ICompletion
    {
        internal readonly Op Op;
        internal readonly byte[] Key;
        internal readonly ulong Token;
        internal readonly uint LeaseMs;
        internal readonly uint WaitMs;

        /// <summary>Sent by the client for itself (clean-up, heartbeat, ACK): allowed while closing.</summary>
        internal readonly bool Internal;

        /// <summary>Completes once: with the answer, or with the error that ended the request.</summary>
        /// <remarks>
        /// Not <see cref="TaskCreationOptions.RunContinuationsAsynchronously"/>: it is completed where
        /// <see cref="Completions"/> says, off every lock, and the awaiting caller goes on there
        /// without another hand-off.
        /// </remarks>
        private readonly TaskCompletionSource<ResponseFrame> _answer; // null with a handler

        /// <summary>Takes the outcome instead of <see cref="Answer"/> (null: <see cref="Answer"/> does).</summary>
        private readonly IAnswerHandler _handler;

        /// <summary>The answer of a request made without an <see cref="IAnswerHandler"/> (see <see cref="_answer"/>).</summary>
        internal Task<ResponseFrame> Answer => _answer.Task;

        /// <summary>Stands for "settled" in <see cref="_settled"/>.</summary>
        private static readonly object SettledMark = new object();

        /// <summary>
        /// Null; the source of <see cref="Settled"/> (made when first asked for, which few requests
        /// are: a cancelled or abandoned acquire, a close); or <see cref="SettledMark"/> once settled.
        /// </summary>
        private object _settled;

        /// <summary>Completes when the server holds nothing more for this request (after any clean-up); its continuations run on the pool.</summary>
        internal Task Settled
        {
            get
            {
                object s = Volatile.Read(ref _settled);
                if (s == null)
                {
                    var made = new TaskCompletionSource<bool>(TaskCreationOptions.RunContinuationsAsynchronously);
                    s = Interlocked.CompareExchange(ref _settled, made, null) ?? made;
                }
                return s == SettledMark ? Task.CompletedTask : ((TaskCompletionSource<bool>)s).Task;
            }
        }

        /// <summary>Completes <see cref="Settled"/>; idempotent.</summary>
        internal void SetSettled()
        {
            (Interlocked.Exchange(ref _settled, SettledMark) as TaskCompletionSource<bool>)?.TrySetResult(true);
        }

        internal ulong Id; // 0 until the frame is queued for the wire
        internal long FirstSent; // the deadline clock (SuspendClock) at the first send; a re-send keeps it
        internal long Generation; // the engine's state generation when first sent
        internal TimerEntry Timer;
        internal bool Done; // Answer completed (or about to be)
        internal bool Abandoned; // an ACQUIRE whose caller gave up: withdraw it, release any grant
        internal bool CancelSent; // the CANCEL for an abandoned ACQUIRE is on its way
        internal bool NotRun; // answered NOT_LEADER: never run; send again after the reconnect

        internal Request(Op op, byte[] key, ulong token, uint leaseMs, uint waitMs, bool isInternal, IAnswerHandler handler = null)
        {
            _handler = handler;
            if (handler == null)
            {
                _answer = new TaskCompletionSource<ResponseFrame>();
            }
            Op = op;
            Key = key ?? Frames.Empty;
            Token = token;
            LeaseMs = leaseMs;
            WaitMs = waitMs;
            Internal = isInternal;
        }

        private ResponseFrame _result; // what PostAnswer posted
        private Exception _error; // what PostError posted

        /// <summary>Completes <see cref="Answer"/> with <paramref name="f"/>, where <see cref="Completions"/> says. Once per request.</summary>
        internal void PostAnswer(ResponseFrame f)
        {
            _result = f;
            Completions.Post(this);
        }

        /// <summary>Fails <see cref="Answer"/> with <paramref name="e"/>, where <see cref="Completions"/> says. Once per request.</summary>
        internal void PostError(Exception e)
        {
            _error = e;
            Completions.Post(this);
        }

        void ICompletion.Run()
        {
            if (_error != null)
            {
                FailNow(_error);
            }
            else if (_handler != null)
            {
                _handler.OnAnswer(this, _result);
            }
            else
            {
                _answer.TrySetResult(_result);
            }
        }

        /// <summary>
        /// Fails the request on the calling thread (no lock held): for a request refused before
        /// anyone can await it, or from <see cref="ICompletion.Run"/>. Once per request.
        /// </summary>
        internal void FailNow(Exception e)
        {
            if (_handler != null)
            {
                _handler.OnError(this, e);
            }
            else
            {
                _answer.TrySetException(e);
            }
        }

        /// <summary>The size of the request's frame on the wire.</summary>
        internal int FrameSize => Wire.Header + Key.Length;

        /// <summary>Writes the request's frame at <paramref name="at"/> of <paramref name="b"/> (room for <see cref="FrameSize"/> bytes).</summary>
        internal void EncodeTo(byte[] b, int at)
        {
            RequestFrame.EncodeTo(b, at, Op, 0, Id, Token, LeaseMs, WaitMs, Key); // the key was checked by Args.Key
        }

        // On the engine's TimeoutList (its request timeout): the neighbours and the due time.
        internal TimeoutList Timeouts;
        internal Request TimeoutPrev;
        internal Request TimeoutNext;
        internal long TimeoutDue; // Clock ticks

        /// <summary>Cancels the request's timeout, whichever way it was set.</summary>
        internal void CancelTimer()
        {
            if (Timer != null)
            {
                Timer.Dispose();
                Timer = null;
            }
            Timeouts?.Remove(this);
        }

        /// <summary>What the request is, for messages: "ACQUIRE of \"k\"".</summary>
        internal string Describe()
        {
            return Dialer.Upper(Op.ToString()) + (Key.Length > 0 ? " of " + Args.Printable(Key) : "");
        }
    }

    /// <summary>Monotonic time in <see cref="Stopwatch"/> ticks, and actions that run once after a delay.</summary>
    internal static class Clock
    {
        internal static long Now => Stopwatch.GetTimestamp();

        internal static long FromMs(double ms)
        {
            return (long)(ms * Stopwatch.Frequency / 1000.0);
        }

        internal static double ToMs(long ticks)
        {
            return ticks * 1000.0 / Stopwatch.Frequency;
        }

        internal static TimeSpan ToTimeSpan(long ticks)
        {
            return TimeSpan.FromTicks((long)(ticks * (double)TimeSpan.TicksPerSecond / Stopwatch.Frequency));
        }

        /// <summary>
        /// Runs <paramref name="action"/> once after <paramref name="delayMs"/> on the client's timer
        /// thread (<see cref="TimerQueue"/>); dispose the entry to cancel it.
        /// </summary>
        internal static TimerEntry Once(double delayMs, Action action)
        {
            return TimerQueue.Shared.Once(delayMs, action);
        }
    }

    /// <summary>
    /// The requests whose timeout is the request timeout from when they were added (most of
    /// them): added in due order (the engine reads the clock under its lock, and the timeout is
    /// the same for all), so a list with one timer entry for its head serves them all, where a
    /// timer entry per request cost an allocation and two operations on the shared timer heap,
    /// under its lock, for every request. Guarded by the engine's lock.
    /// </summary>
    internal sealed class TimeoutList
    {
        private readonly Action _onDue;
        private Request _head;
        private Request _tail;
        private TimerEntry _timer; // armed for the head's due time (or earlier) while the list is not empty

        /// <param name="onDue">runs on the timer thread when the head may be due: take the due ones with <see cref="TakeDue"/></param>
        internal TimeoutList(Action onDue)
        {
            _onDue = onDue;
        }

        /// <summary>Adds <paramref name="r"/>, due <paramref name="delayMs"/> from now (the same for every request of the list).</summary>
        internal void Add(Request r, double delayMs)
        {
            Add(r, delayMs, Clock.Now);
        }

        /// <summary>Adds <paramref name="r"/>, due <paramref name="delayMs"/> from <paramref name="now"/> (<see cref="Clock.Now"/>, just read).</summary>
        internal void Add(Request r, double delayMs, long now)
        {
            r.CancelTimer();
            r.TimeoutDue = now + Clock.FromMs(delayMs);
            r.Timeouts = this;
            r.TimeoutPrev = _tail;
            r.TimeoutNext = null;
            if (_tail != null)
            {
                _tail.TimeoutNext = r;
            }
            else
            {
                _head = r;
            }
            _tail = r;
            if (_timer == null)
            {
                _timer = Clock.Once(delayMs, _onDue);
            }
        }

        internal void Remove(Request r)
        {
            if (r.Timeouts != this)
            {
                return;
            }
            if (r.TimeoutPrev != null)
            {
                r.TimeoutPrev.TimeoutNext = r.TimeoutNext;
            }
            else
            {
                _head = r.TimeoutNext;
            }
            if (r.TimeoutNext != null)
            {
                r.TimeoutNext.TimeoutPrev = r.TimeoutPrev;
            }
            else
            {
                _tail = r.TimeoutPrev;
            }
            r.Timeouts = null;
            r.TimeoutPrev = r.TimeoutNext = null;
            // The timer stays: when it fires it finds the new head, and is armed again for it.
        }

        /// <summary>
        /// Called from <c>onDue</c>: takes out the requests due by now and arms the timer for the
        /// next head; null when none is due.
        /// </summary>
        internal List<Request> TakeDue()
        {
            _timer = null;
            long now = Clock.Now;
            List<Request> due = null;
            while (_head != null && _head.TimeoutDue <= now)
            {
                Request r = _head;
                Remove(r);
                (due = due ?? new List<Request>()).Add(r);
            }
            if (_head != null)
            {
                _timer = Clock.Once(Clock.ToMs(_head.TimeoutDue - now), _onDue);
            }
            return due;
        }

        /// <summary>Cancels the timer and forgets every request (closing).</summary>
        internal void Clear()
        {
            while (_head != null)
            {
                Remove(_head);
            }
            _timer?.Dispose();
            _timer = null;
        }
    }
}
