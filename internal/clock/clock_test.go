package clock

import (
	"testing"
	"time"
)

func TestBoottimeAdvancesWithRealTime(t *testing.T) {
	a := Boottime()
	start := time.Now()
	time.Sleep(20 * time.Millisecond)
	b := Boottime()
	el := time.Since(start)
	if d := time.Duration(b - a); d < 20*time.Millisecond || d > el+5*time.Millisecond {
		t.Fatalf("boottime advanced %v over %v of real time", d, el)
	}
	if a <= 0 {
		t.Fatalf("boottime %d", a)
	}
}

func TestBootIDStable(t *testing.T) {
	if BootID() != BootID() {
		t.Fatal("boot id changed within one boot")
	}
}

func TestSinceTracksBoottime(t *testing.T) {
	s := NewSince()
	prev := s.Now()
	for i := 0; i < 50; i++ {
		time.Sleep(time.Millisecond)
		n := s.Now()
		if n < prev {
			t.Fatalf("went backwards: %d after %d", n, prev)
		}
		prev = n
	}
	// Within a look's period of BOOTTIME's own count (no suspend here, so the two agree).
	time.Sleep(2 * time.Duration(syncEvery))
	n, b := s.Now(), Boottime()-s.Boot0()
	if d := b - n; d < -int64(time.Millisecond) || d > int64(5*time.Millisecond) {
		t.Fatalf("Since %d, BOOTTIME elapsed %d", n, b)
	}
}

func TestSinceAddsSuspendTime(t *testing.T) {
	s := NewSince()
	// A suspend shows as BOOTTIME running ahead of the monotonic clock; fake 2 s of it.
	s.boot0 -= int64(2 * time.Second)
	time.Sleep(time.Duration(syncEvery) + time.Millisecond)
	if n := s.Now(); n < int64(2*time.Second) {
		t.Fatalf("suspend time not counted: %v", time.Duration(n))
	}
}

func BenchmarkSinceNow(b *testing.B) {
	s := NewSince()
	for i := 0; i < b.N; i++ {
		s.Now()
	}
}

func BenchmarkBoottime(b *testing.B) {
	for i := 0; i < b.N; i++ {
		Boottime()
	}
}
