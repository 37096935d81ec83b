package ticketing

import (
	"sync"
	"sync/atomic"
	"time"
)

// Lock deadlines run on a clock that keeps counting while the host is suspended, as the
// server's leases do (PROTOCOL.md, "The lost signal"): a suspended client must not wake up
// believing it still holds a lock whose lease ran out while it slept. Go's monotonic clock
// stops during a suspend on Linux, so suspendClock adds the suspend time it has seen to it:
// CLOCK_BOOTTIME where the system has it (clock_linux.go), else the wall clock's advance
// beyond the monotonic clock's, interval by interval (clock_other.go). Runtime timers stop
// during a suspend too: the lost alarm therefore looks at this clock at least every
// wire.LostCheckMs while a lock is held (Client.fireLost).

// lookEvery is how often suspendClock.now looks for suspend time: reading BOOTTIME is a real
// system call (Go reads only the monotonic clock through the vDSO), and lock calls read the
// clock once each.
const lookEvery = int64(20 * time.Millisecond)

// suspendClock is nanoseconds since it was made on Go's monotonic clock plus the suspend time
// seen so far. Suspend time is noticed at the first read at least lookEvery after the previous
// look; the clock never goes backwards. Safe for concurrent use.
type suspendClock struct {
	start    time.Time
	suspend  atomic.Int64 // suspend time seen so far, ns
	lastLook atomic.Int64 // monotonic elapsed at the last look
	mu       sync.Mutex   // serialises look
	src      suspendSource
}

// suspendSource measures the suspend time since the clock was made, given the monotonic time
// elapsed since then (read after the source's own clock, so that it never overstates it).
type suspendSource interface {
	suspended(monoElapsed func() int64) int64
}

func newSuspendClock() *suspendClock {
	k := &suspendClock{start: time.Now()}
	k.src = newSuspendSource(k.start)
	return k
}

// now is the clock's reading, ns; never 0 (a call's zero first send means "not sent yet").
func (k *suspendClock) now() int64 {
	m := int64(time.Since(k.start))
	if m-k.lastLook.Load() >= lookEvery {
		k.lastLook.Store(m)
		k.look()
		m = int64(time.Since(k.start))
	}
	return m + k.suspend.Load() + 1
}

// look raises the suspend offset to what the source says now (it never goes down).
func (k *suspendClock) look() {
	k.mu.Lock()
	d := k.src.suspended(func() int64 { return int64(time.Since(k.start)) })
	k.mu.Unlock()
	for {
		cur := k.suspend.Load()
		if d <= cur || k.suspend.CompareAndSwap(cur, d) {
			return
		}
	}
}

// wallSource is the fallback: each interval between two looks counts as the larger of the
// monotonic and the wall clock's advance (a suspend shows as the wall clock running ahead; a
// wall clock stepped back is ignored; one stepped forward only makes deadlines earlier). The
// wall clock is read between two monotonic readings: the interval's monotonic advance is
// measured from the first of them to the last, so a preemption around the reads is never taken
// for a suspend.
type wallSource struct {
	lastWall, lastMono int64 // at the last look
	total              int64 // suspend time counted so far
	wall               func() int64
}

func (w *wallSource) suspended(monoElapsed func() int64) int64 {
	before := monoElapsed()
	wall := w.wall()
	after := monoElapsed()
	w.total += fallbackSuspend(w.lastWall, w.lastMono, wall, after)
	w.lastWall, w.lastMono = wall, before
	return w.total
}

// wallResolution: an excess of the wall clock's advance below this is reading noise, not a
// suspend.
const wallResolution = int64(time.Millisecond)

// fallbackSuspend is the time an interval counts beyond the monotonic clock's advance: the wall
// clock's advance beyond it, if that is at least wallResolution. lastMono is the monotonic
// reading taken just before the last wall reading, mono the one just after this one, so the
// monotonic advance is never short of the wall clock's by a preemption.
func fallbackSuspend(lastWall, lastMono, wall, mono int64) int64 {
	if d := (wall - lastWall) - (mono - lastMono); d >= wallResolution {
		return d
	}
	return 0
}

// toTime converts a reading of the clock to a time.Time (for Lock.Deadline): the instant it will
// be reached if the host is not suspended meanwhile. It is the same for the same reading until
// more suspend time is seen (a caller may compare two results with Equal).
func (k *suspendClock) toTime(at int64) time.Time {
	return k.start.Add(time.Duration(at - 1 - k.suspend.Load()))
}

func newWallSource(start time.Time) *wallSource {
	w := &wallSource{wall: func() int64 { return time.Now().Round(0).UnixNano() }}
	w.lastWall, w.lastMono = w.wall(), int64(time.Since(start))
	return w
}
