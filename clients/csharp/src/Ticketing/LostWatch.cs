using System.Collections.Generic;
using System.Linq;
using Ticketing.Protocol;

namespace Ticketing
{
    /// <summary>
    /// Compares the deadlines of a client's locks with the deadline clock every
    /// <see cref="Wire.LostCheckMs"/> while it watches any: a lock's own timer, like every runtime
    /// timer, stops while the host is suspended, and the deadline clock does not (PROTOCOL.md, "The
    /// lost signal"), so after a resume the lost signal fires within that time. A lock is watched
    /// from its start until it is lost or released, also after its client was closed. Nothing else
    /// is locked under its monitor.
    /// </summary>
    internal sealed class LostWatch
    {
        private readonly SuspendClock _clock;
        private readonly HashSet<TicketingLock> _locks = new HashSet<TicketingLock>(); // guarded by itself
        private TimerEntry _timer; // guarded by _locks; pending while _locks is not empty (and up to one check after)

        internal LostWatch(SuspendClock clock)
        {
            _clock = clock;
        }

        internal void Add(TicketingLock l)
        {
            lock (_locks)
            {
                if (_locks.Add(l) && _timer == null)
                {
                    ScheduleLocked();
                }
            }
        }

        internal void Remove(TicketingLock l)
        {
            lock (_locks)
            {
                // The pending check stays: it ends the chain if no lock is left by then. Stopping it
                // here and starting another with the next lock (a client that takes and releases
                // locks one after another) woke the timer thread for each lock.
                _locks.Remove(l);
            }
        }

        /// <summary>_locks must be held. The next check (one chain of them at a time).</summary>
        private void ScheduleLocked()
        {
            TimerEntry next = null;
            next = Clock.Once(Wire.LostCheckMs, () => Check(next));
            _timer = next;
        }

        private void Check(TimerEntry self)
        {
            TicketingLock[] locks;
            lock (_locks)
            {
                if (_timer != self)
                {
                    return; // replaced since it was scheduled
                }
                if (_locks.Count == 0)
                {
                    _timer = null; // the next Add starts the chain again
                    return;
                }
                locks = _locks.ToArray();
                ScheduleLocked();
            }
            long now = _clock.ExactNow;
            foreach (TicketingLock l in locks)
            {
                l.CheckDeadline(now);
            }
        }
    }
}
