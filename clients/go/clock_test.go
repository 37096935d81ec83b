package ticketing

import (
	"testing"
	"time"
)

// The fallback clock (no CLOCK_BOOTTIME): an interval counts as the larger of the monotonic and
// the wall clock's advance; a wall clock stepped back, and an excess below the wall clock's
// resolution, are ignored.
func TestFallbackSuspend(t *testing.T) {
	s := int64(time.Second)
	for _, tc := range []struct {
		name                        string
		lastWall, lastMono, wall, m int64
		want                        int64
	}{
		{"both advance alike", 100 * s, 10 * s, 101 * s, 11 * s, 0},
		{"a suspend: the wall clock ran ahead", 100 * s, 10 * s, 130 * s, 11 * s, 29 * s},
		{"the wall clock stepped back", 100 * s, 10 * s, 90 * s, 11 * s, 0},
		{"reading noise below the wall clock's resolution", 100 * s, 10 * s, 101*s + s/2000, 11 * s, 0},
	} {
		if got := fallbackSuspend(tc.lastWall, tc.lastMono, tc.wall, tc.m); got != tc.want {
			t.Errorf("%s: %v, want %v", tc.name, time.Duration(got), time.Duration(tc.want))
		}
	}
	// Through the clock: a 30 s jump of the wall clock between two looks shows as suspend time.
	wall := int64(1000 * s)
	k := &suspendClock{start: time.Now()}
	w := &wallSource{wall: func() int64 { return wall }, lastWall: wall}
	k.src = w
	k.lastLook.Store(-lookEvery)
	before := k.now() // (a look: the source's last readings are now)
	wall += 30 * s
	k.lastLook.Store(-lookEvery) // look at the next read
	if d := time.Duration(k.now() - before); d < 30*time.Second-time.Millisecond || d > 31*time.Second {
		t.Fatalf("the clock advanced %v over a 30 s wall clock jump", d)
	}
	wall -= 60 * s // stepped back: ignored, and the clock never goes back
	mid := k.now()
	k.lastLook.Store(-lookEvery)
	if k.now() < mid {
		t.Fatal("the clock went back")
	}
}
