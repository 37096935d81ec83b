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
