using System;
using System.Diagnostics;
using System.Threading;
using System.Threading.Tasks;

namespace Ticketing
{
    /// <summary>One pending action of a <see cref="TimerQueue"/>; <see cref="Dispose"/> cancels it.</summary>
    internal sealed class TimerEntry : IDisposable
    {
        internal readonly TimerQueue Queue;
        internal readonly Action Action;
        internal long Due; // Stopwatch ticks
        internal long Seq; // ties: the earlier scheduled runs first
        internal int Index = -1; // the place in the heap; -1 when not queued (fired or cancelled)

        internal TimerEntry(TimerQueue queue, long due, Action action)
        {
            Queue = queue;
            Due = due;
            Action = action;
        }

        /// <summary>Cancels the action unless it has started; idempotent.</summary>
        public void Dispose()
        {
            Queue.Remove(this);
        }
    }

    /// <summary>
    /// The client's only timer: a deadline heap served by one background thread, shared by every
    /// client of the process (request timeouts, the heartbeat, the session grace, reconnect
    /// backoff, connect deadlines, lock deadlines, keep-alive and the lost watch). The client
    /// creates no <see cref="System.Threading.Timer"/>, and no <see cref="Task.Delay(int)"/> or
    /// timed <see cref="CancellationTokenSource"/> (which use one): Mono's timer scheduler sorts
    /// its timers under a lock, and at process exit the thread abort that ends it could land
    /// inside that sort, which Mono reports as a fatal unhandled exception ("Failed to compare two
    /// elements in the array"). A timer per request also made that sort long.
    /// </summary>
    /// <remarks>
    /// Actions run on the queue's thread, in due order, outside its lock; they must not block
    /// (they take a client's lock briefly, complete tasks whose continuations run asynchronously,
    /// or queue work to the pool). The thread ends after a few idle seconds and starts again with
    /// the next entry, so an idle process keeps no thread of the client's.
    /// </remarks>
    internal sealed class TimerQueue
    {
        /// <summary>The process-wide queue.</summary>
        internal static readonly TimerQueue Shared = new TimerQueue();

        /// <summary>The longest delay taken (about 49.7 days, as <see cref="System.Threading.Timer"/>); later ones fire then.</summary>
        private const double MaxDelayMs = 4294967294.0;

        private const int IdleExitMs = 5000;

        private readonly object _mu = new object();
        private TimerEntry[] _heap = new TimerEntry[64]; // guarded by _mu
        private int _count; // guarded by _mu
        private long _seq; // guarded by _mu
        private Thread _thread; // guarded by _mu: null while none runs

        /// <summary>Entries waiting (for tests).</summary>
        internal int Count
        {
            get
            {
                lock (_mu)
                {
                    return _count;
                }
            }
        }

        /// <summary>Tells whether the queue's thread runs (for tests).</summary>
        internal bool ThreadRunning
        {
            get
            {
                lock (_mu)
                {
                    return _thread != null;
                }
            }
        }

        /// <summary>Runs <paramref name="action"/> once, after <paramref name="delayMs"/> (negative: at once, still on the queue's thread).</summary>
        internal TimerEntry Once(double delayMs, Action action)
        {
            if (action == null)
            {
                throw new ArgumentNullException(nameof(action));
            }
            double ms = Math.Min(MaxDelayMs, Math.Max(0, delayMs));
            var e = new TimerEntry(this, Clock.Now + Clock.FromMs(ms), action);
            lock (_mu)
            {
                e.Seq = _seq++;
                if (_count == _heap.Length)
                {
                    Array.Resize(ref _heap, _heap.Length * 2);
                }
                e.Index = _count;
                _heap[_count++] = e;
                Up(e.Index);
                if (_thread == null)
                {
                    _thread = new Thread(Loop) { IsBackground = true, Name = "Ticketing timers" };
                    _thread.Start();
                }
                else if (e.Index == 0)
                {
                    Monitor.Pulse(_mu); // a new earliest deadline
                }
            }
            return e;
        }

        /// <summary>A task that completes after <paramref name="delay"/>, or is cancelled with <paramref name="ct"/> (like <see cref="Task.Delay(TimeSpan, CancellationToken)"/>).</summary>
        internal Task Delay(TimeSpan delay, CancellationToken ct = default(CancellationToken))
        {
            if (ct.IsCancellationRequested)
            {
                return Task.FromCanceled(ct);
            }
            var done = new TaskCompletionSource<bool>(TaskCreationOptions.RunContinuationsAsynchronously);
            TimerEntry entry = Once(delay.TotalMilliseconds, () => done.TrySetResult(true));
            if (ct.CanBeCanceled)
            {
                CancellationTokenRegistration reg = ct.Register(() =>
                {
                    entry.Dispose();
                    done.TrySetCanceled(ct);
                });
                done.Task.ContinueWith(_ => reg.Dispose(), TaskContinuationOptions.ExecuteSynchronously);
            }
            return done.Task;
        }

        /// <summary>
        /// Waits for <paramref name="task"/> at most <paramref name="bound"/>: true when it completed
        /// (in any state), false when the bound passed first. Its own entry is gone either way.
        /// </summary>
        internal async Task<bool> WaitAsync(Task task, TimeSpan bound)
        {
            if (task.IsCompleted)
            {
                return true;
            }
            var done = new TaskCompletionSource<bool>(TaskCreationOptions.RunContinuationsAsynchronously);
            TimerEntry entry = Once(bound.TotalMilliseconds, () => done.TrySetResult(false));
            Task observer = task.ContinueWith(t => done.TrySetResult(true), TaskContinuationOptions.ExecuteSynchronously);
            bool completed = await done.Task.ConfigureAwait(false);
            entry.Dispose();
            GC.KeepAlive(observer);
            return completed;
        }

        /// <summary>Cancels <paramref name="cts"/> after <paramref name="delay"/>; dispose the entry to stop it.</summary>
        internal TimerEntry CancelAfter(CancellationTokenSource cts, TimeSpan delay)
        {
            // Cancel runs the token's callbacks, and continuations may run inline: on the pool,
            // not on the queue's thread.
            return Once(delay.TotalMilliseconds, () => ThreadPool.UnsafeQueueUserWorkItem(_ =>
            {
                try
                {
                    cts.Cancel();
                }
                catch (ObjectDisposedException)
                {
                    // its user is done with it
                }
            }, null));
        }

        internal void Remove(TimerEntry e)
        {
            lock (_mu)
            {
                int i = e.Index;
                if (i < 0)
                {
                    return;
                }
                e.Index = -1;
                _count--;
                if (i != _count)
                {
                    TimerEntry last = _heap[_count];
                    _heap[i] = last;
                    last.Index = i;
                    _heap[_count] = null;
                    Up(i);
                    Down(last.Index);
                }
                else
                {
                    _heap[_count] = null;
                }
            }
        }

        /// <summary>Tells whether this thread is a timer queue's (whose actions must not block: <see cref="Connection.Flush"/> leaves its writes to the pool).</summary>
        internal static bool OnTimerThread => _isTimerThread;

        [ThreadStatic]
        private static bool _isTimerThread;

        private void Loop()
        {
            _isTimerThread = true;
            while (true)
            {
                TimerEntry due = null;
                lock (_mu)
                {
                    while (due == null)
                    {
                        if (_count == 0)
                        {
                            if (!Monitor.Wait(_mu, IdleExitMs) && _count == 0)
                            {
                                _thread = null;
                                return;
                            }
                            continue;
                        }
                        TimerEntry first = _heap[0];
                        long wait = first.Due - Clock.Now;
                        if (wait > 0)
                        {
                            Monitor.Wait(_mu, (int)Math.Min(int.MaxValue, Math.Ceiling(Clock.ToMs(wait))));
                            continue;
                        }
                        due = first;
                    }
                    Remove(due);
                }
                try
                {
                    due.Action();
                }
                catch (Exception e)
                {
                    Engine.Log.TraceEvent(TraceEventType.Error, 0, "a timer action failed: {0}", e);
                }
            }
        }

        private static bool Less(TimerEntry a, TimerEntry b)
        {
            return a.Due < b.Due || (a.Due == b.Due && a.Seq < b.Seq);
        }

        private void Up(int i)
        {
            TimerEntry e = _heap[i];
            while (i > 0)
            {
                int p = (i - 1) / 2;
                if (!Less(e, _heap[p]))
                {
                    break;
                }
                _heap[i] = _heap[p];
                _heap[i].Index = i;
                i = p;
            }
            _heap[i] = e;
            e.Index = i;
        }

        private void Down(int i)
        {
            TimerEntry e = _heap[i];
            while (true)
            {
                int c = 2 * i + 1;
                if (c >= _count)
                {
                    break;
                }
                if (c + 1 < _count && Less(_heap[c + 1], _heap[c]))
                {
                    c++;
                }
                if (!Less(_heap[c], e))
                {
                    break;
                }
                _heap[i] = _heap[c];
                _heap[i].Index = i;
                i = c;
            }
            _heap[i] = e;
            e.Index = i;
        }
    }
}
