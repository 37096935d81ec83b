//! The lease clock, which the locks' deadlines run on. It keeps counting while the host is
//! suspended, as the server's leases do (PROTOCOL.md, "The lost signal"): tokio's clock, the
//! monotonic clock, stops during a suspend on Linux, and a client that wakes up must not believe
//! it still holds a lock whose lease ran out while it slept.
//!
//! A reading is the monotonic time since the clock was made plus the suspend time seen so far:
//! CLOCK_BOOTTIME's advance beyond the monotonic clock's where the system has it (Linux), else,
//! interval by interval, the wall clock's advance beyond it. Timers stop during a suspend too:
//! the client's timer task therefore looks at this clock at least every
//! [`LOST_CHECK_MS`](crate::wire::LOST_CHECK_MS) while a lock is held.

use std::ops::Add;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use tokio::time::Instant;

/// How often [`SuspendClock::at`] looks for suspend time: the request path reads the clock once
/// per request, and a look is two clock reads.
const LOOK_EVERY: Duration = Duration::from_millis(20);

/// A reading of a [`SuspendClock`]: the time since the clock was made, suspends included.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct Tick(Duration);

impl Tick {
    pub fn checked_sub(self, d: Duration) -> Option<Tick> {
        self.0.checked_sub(d).map(Tick)
    }
}

impl Add<Duration> for Tick {
    type Output = Tick;

    fn add(self, d: Duration) -> Tick {
        Tick(self.0 + d)
    }
}

/// A wall clock, for the fallback (tests give their own).
pub(crate) type WallClock = Arc<dyn Fn() -> SystemTime + Send + Sync>;

/// The monotonic clock plus the suspend time seen so far; it never goes back. Suspend time is
/// noticed at a look: [`now`](SuspendClock::now) always looks, [`at`](SuspendClock::at) at most
/// every [`LOOK_EVERY`].
pub(crate) struct SuspendClock {
    origin: Instant,
    /// The suspend time seen so far.
    suspend: Duration,
    /// Monotonic time since `origin` at the last look.
    looked: Duration,
    source: Source,
}

/// Where suspend time is seen.
enum Source {
    /// CLOCK_BOOTTIME's advance beyond the monotonic clock's; `boot0`: its reading at the origin.
    #[cfg(any(target_os = "linux", target_os = "android"))]
    Boot { boot0: Duration },
    /// Each interval between two looks counts as the larger of the monotonic and the wall clock's
    /// advance: a suspend shows as the wall clock running ahead; a wall clock stepped back is
    /// ignored, one stepped forward only makes deadlines earlier.
    Wall { read: WallClock, last_wall: SystemTime, last_mono: Duration },
}

impl SuspendClock {
    /// A clock reading zero now: on CLOCK_BOOTTIME where the system has it, else on the wall
    /// clock's fallback (`wall`, or the system's, which `wall` replaces).
    pub fn new(wall: Option<WallClock>) -> SuspendClock {
        let origin = Instant::now();
        // Read after the origin (see `look`).
        #[cfg(any(target_os = "linux", target_os = "android"))]
        let boot = if wall.is_none() { boottime().map(|boot0| Source::Boot { boot0 }) } else { None };
        #[cfg(not(any(target_os = "linux", target_os = "android")))]
        let boot = None;
        let source = boot.unwrap_or_else(|| {
            let read = wall.unwrap_or_else(|| Arc::new(SystemTime::now));
            Source::Wall { last_wall: read(), read, last_mono: Duration::ZERO }
        });
        SuspendClock { origin, suspend: Duration::ZERO, looked: Duration::ZERO, source }
    }

    /// The reading at `mono`, a monotonic reading taken before now; looks for suspend time first
    /// when [`LOOK_EVERY`] passed since the last look. A request stamped with it is sent later,
    /// so the stamp is never later than its send, whatever suspend time the look adds.
    #[inline]
    pub fn at(&mut self, mono: Instant) -> Tick {
        let m = mono.saturating_duration_since(self.origin);
        if m >= self.looked + LOOK_EVERY {
            self.look();
        }
        Tick(m + self.suspend)
    }

    /// The reading now, after a look for suspend time.
    pub fn now(&mut self) -> Tick {
        self.look();
        Tick(self.looked + self.suspend)
    }

    /// The monotonic instant at which the clock reads `t` if the host is not suspended
    /// meanwhile (for tokio's timers, and [`Lock::deadline`](crate::Lock::deadline)).
    pub fn to_instant(&self, t: Tick) -> Instant {
        match t.0.checked_sub(self.suspend) {
            Some(d) => self.origin + d,
            // Passed before a suspend.
            None => self.origin.checked_sub(self.suspend - t.0).unwrap_or(self.origin),
        }
    }

    /// Raises the suspend time to what the source says now. The monotonic clock is read after
    /// the source's own, so that the difference never overstates the suspend time: a request's
    /// stamp is never later than its send. (A reading of now may miss the nanoseconds between two
    /// clock reads, far inside the lost signal's margin.)
    fn look(&mut self) {
        let origin = self.origin;
        match &mut self.source {
            #[cfg(any(target_os = "linux", target_os = "android"))]
            Source::Boot { boot0 } => {
                let boot = boottime();
                let m = origin.elapsed();
                if let Some(boot) = boot {
                    let suspend = boot.saturating_sub(*boot0).saturating_sub(m);
                    self.suspend = self.suspend.max(suspend);
                }
                self.looked = m;
            }
            Source::Wall { read, last_wall, last_mono } => {
                let wall = read();
                let m = origin.elapsed();
                let wall_ahead = wall.duration_since(*last_wall).unwrap_or(Duration::ZERO);
                self.suspend += wall_ahead.saturating_sub(m - *last_mono);
                (*last_wall, *last_mono) = (wall, m);
                self.looked = m;
            }
        }
    }
}

/// CLOCK_BOOTTIME: the monotonic clock plus the time the host spent suspended. `None` where the
/// kernel refuses it. Public for the crate's tests only.
#[doc(hidden)]
#[cfg(any(target_os = "linux", target_os = "android"))]
pub fn boottime() -> Option<Duration> {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: `ts` is a valid, writable timespec for the duration of the call.
    #[allow(unsafe_code)]
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_BOOTTIME, &mut ts) };
    if rc != 0 {
        return None;
    }
    Some(Duration::new(u64::try_from(ts.tv_sec).ok()?, u32::try_from(ts.tv_nsec).ok()?))
}
