package clock

import (
	"sync/atomic"
	"time"
)

// syncEvery is how often Since.Now looks at CLOCK_BOOTTIME itself. Reading BOOTTIME is a real
// system call on many kernels (Go reads only the monotonic clock through the vDSO), and the
// request path reads the clock once per batch; between two looks the clock advances on Go's
// monotonic clock, which runs at the same rate but stops while the machine is suspended.
const syncEvery = int64(20 * time.Millisecond)

// Since is BOOTTIME elapsed since it was made, cheap to read: Go's monotonic clock plus the
// suspend time seen so far. Suspend time is noticed at the first read at least syncEvery after
// the previous look, so after a resume the clock catches up within one read; it never goes
// backwards. Safe for concurrent use.
type Since struct {
	start    time.Time
	boot0    int64        // Boottime() when made
	suspend  atomic.Int64 // largest (BOOTTIME elapsed - monotonic elapsed) seen
	lastSync atomic.Int64 // monotonic elapsed at the last look
}

// NewSince starts a clock at zero now; Boot0 is the BOOTTIME reading it counts from.
func NewSince() *Since {
	return &Since{start: time.Now(), boot0: Boottime()}
}

// Boot0 is CLOCK_BOOTTIME (nanoseconds) at the clock's zero.
func (s *Since) Boot0() int64 { return s.boot0 }

// Now returns nanoseconds of BOOTTIME since the clock was made.
func (s *Since) Now() int64 {
	m := int64(time.Since(s.start))
	if m-s.lastSync.Load() >= syncEvery {
		s.lastSync.Store(m)
		s.look()
		m = int64(time.Since(s.start))
	}
	return m + s.suspend.Load()
}

// look raises the suspend offset to what BOOTTIME says now. The monotonic reading is taken
// after BOOTTIME, so the difference never overstates the suspend time.
func (s *Since) look() {
	b := Boottime() - s.boot0
	d := b - int64(time.Since(s.start))
	for {
		cur := s.suspend.Load()
		if d <= cur || s.suspend.CompareAndSwap(cur, d) {
			return
		}
	}
}
