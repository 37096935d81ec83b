using System;
using System.Diagnostics;
using System.Runtime.InteropServices;
using System.Threading;

namespace Ticketing
{
    /// <summary>
    /// The clock of lock deadlines, in <see cref="Stopwatch"/> ticks: it keeps counting while the
    /// host is suspended, as the server's leases do (PROTOCOL.md, "The lost signal"), so that a
    /// client that wakes up does not believe it still holds a lock whose lease ran out while it
    /// slept. <see cref="Stopwatch"/> stops during a suspend; this clock adds the suspend time its
    /// source has seen (<see cref="BootTimeSource"/> on Linux, else <see cref="WallSource"/>). It
    /// never goes backwards. Safe for concurrent use.
    /// </summary>
    internal sealed class SuspendClock
    {
        /// <summary>The clock of every client (tests give a client one of their own).</summary>
        internal static readonly SuspendClock Host = new SuspendClock(BootTimeSource.TryCreate() ?? (ISuspendSource)new WallSource());

        // Asking the source is a system call (or the wall clock under a lock); the request path
        // reads Now, which asks at most this often.
        private static readonly long LookEvery = Clock.FromMs(20);

        private readonly ISuspendSource _source; // guarded by _look
        private readonly object _look = new object();
        private long _suspend; // the suspend time seen so far; it only grows
        private long _lastLook; // the Stopwatch timestamp of the last look

        internal SuspendClock(ISuspendSource source)
        {
            _source = source;
            _lastLook = Stopwatch.GetTimestamp();
        }

        /// <summary>
        /// The clock now, cheaply: it may lack a suspend that ended less than 20 ms of monotonic
        /// time ago, so it is never later than <see cref="ExactNow"/>. For the time a request is
        /// first sent: a deadline counted from it is only earlier.
        /// </summary>
        internal long Now => At(Stopwatch.GetTimestamp());

        /// <summary><see cref="Now"/> for the <see cref="Stopwatch"/> timestamp <paramref name="m"/>, read just before (one clock read serves two uses).</summary>
        internal long At(long m)
        {
            return m - Volatile.Read(ref _lastLook) < LookEvery ? m + Volatile.Read(ref _suspend) : ExactNow;
        }

        /// <summary>The clock now, with every suspend the source knows of: for deciding whether a deadline has passed.</summary>
        internal long ExactNow
        {
            get
            {
                lock (_look)
                {
                    long s = _source.Suspended();
                    if (s > _suspend)
                    {
                        Volatile.Write(ref _suspend, s);
                    }
                    long m = Stopwatch.GetTimestamp();
                    Volatile.Write(ref _lastLook, m);
                    return m + _suspend;
                }
            }
        }
    }

    /// <summary>Tells how long the host has been suspended.</summary>
    internal interface ISuspendSource
    {
        /// <summary>
        /// The suspend time since the source was made, in <see cref="Stopwatch"/> ticks, never
        /// more than the truth. Called under the clock's lock, one call at a time.
        /// </summary>
        long Suspended();
    }

    /// <summary>Suspend time on Linux: CLOCK_BOOTTIME's advance beyond the monotonic clock's.</summary>
    internal sealed class BootTimeSource : ISuspendSource
    {
        private const int ClockBoottime = 7; // linux/time.h

        private readonly long _mono0;
        private readonly long _boot0;

        private BootTimeSource(long mono0, long boot0)
        {
            _mono0 = mono0;
            _boot0 = boot0;
        }

        /// <summary>The source, or null where CLOCK_BOOTTIME cannot be read (not Linux, no libc).</summary>
        internal static BootTimeSource TryCreate()
        {
            if (!RuntimeInformation.IsOSPlatform(OSPlatform.Linux))
            {
                return null; // clock id 7 is another clock, or none, elsewhere
            }
            // The monotonic clock first, BOOTTIME then, and the other way round in Suspended: each
            // difference errs towards less suspend time.
            long mono0 = Stopwatch.GetTimestamp();
            try
            {
                long boot0;
                return Boottime(out boot0) ? new BootTimeSource(mono0, boot0) : null;
            }
            catch (Exception e) when (e is DllNotFoundException || e is EntryPointNotFoundException)
            {
                return null;
            }
        }

        /// <summary>Reads CLOCK_BOOTTIME, in nanoseconds; false when the kernel refuses it.</summary>
        internal static bool Boottime(out long ns)
        {
            Timespec ts;
            if (clock_gettime(ClockBoottime, out ts) != 0)
            {
                ns = 0;
                return false;
            }
            ns = ts.Sec.ToInt64() * 1000000000L + ts.Nsec.ToInt64();
            return true;
        }

        public long Suspended()
        {
            long boot;
            if (!Boottime(out boot))
            {
                return 0; // read once already: it does not start failing (and 0 never raises the clock)
            }
            long mono = Stopwatch.GetTimestamp();
            return Clock.FromMs((boot - _boot0) / 1e6) - (mono - _mono0);
        }

        /// <summary>struct timespec: time_t and long, both a native word on Linux.</summary>
        [StructLayout(LayoutKind.Sequential)]
        private struct Timespec
        {
            internal IntPtr Sec;
            internal IntPtr Nsec;
        }

        [DllImport("libc", SetLastError = false)]
        private static extern int clock_gettime(int clockId, out Timespec ts);
    }

    /// <summary>
    /// Suspend time where CLOCK_BOOTTIME cannot be read: each interval between two calls counts as
    /// the larger of the monotonic clock's and the wall clock's advance. A suspend shows as the
    /// wall clock running ahead; a wall clock stepped back is ignored, and one stepped forward only
    /// makes deadlines earlier.
    /// </summary>
    internal sealed class WallSource : ISuspendSource
    {
        private readonly Func<long> _mono; // Stopwatch ticks
        private readonly Func<long> _wall; // DateTime ticks
        private long _lastMono;
        private long _lastWall;
        private long _total;

        internal WallSource()
            : this(Stopwatch.GetTimestamp, () => DateTime.UtcNow.Ticks)
        {
        }

        internal WallSource(Func<long> mono, Func<long> wall)
        {
            _mono = mono;
            _wall = wall;
            _lastWall = wall();
            _lastMono = mono();
        }

        public long Suspended()
        {
            // The wall clock first: its advance, less the monotonic clock's, errs towards less.
            long wall = _wall();
            long mono = _mono();
            long wallAdvance = Clock.FromMs((wall - _lastWall) / (double)TimeSpan.TicksPerMillisecond);
            _total += Math.Max(0, wallAdvance - (mono - _lastMono));
            _lastWall = wall;
            _lastMono = mono;
            return _total;
        }
    }
}
