//go:build linux

package ticketing

import (
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"
)

// The deadlines' clock reads CLOCK_BOOTTIME on Linux: inside a time namespace whose boottime is
// 100,000 s ahead of its monotonic clock (what a long suspend looks like), the raw reading
// agrees with /proc/uptime (BOOTTIME), not with the monotonic clock.
func TestClockIsBoottime(t *testing.T) {
	if os.Getenv("TICKETING_CLOCK_CHILD") == "1" {
		b, ok := boottime()
		data, err := os.ReadFile("/proc/uptime")
		if !ok || err != nil {
			t.Fatalf("boottime ok %v, /proc/uptime: %v", ok, err)
		}
		up, err := strconv.ParseFloat(strings.Fields(string(data))[0], 64)
		if err != nil {
			t.Fatal(err)
		}
		if d := time.Duration(b) - time.Duration(up*float64(time.Second)); d < -time.Second || d > time.Second {
			t.Fatalf("boottime %v, /proc/uptime %vs", time.Duration(b), up)
		}
		if src, ok := newSuspendSource(time.Now()).(bootSource); !ok || src.boot0 < int64(100_000*time.Second) {
			t.Fatalf("the clock's source is %T %+v, want CLOCK_BOOTTIME's", src, src)
		}
		return
	}
	if os.Geteuid() != 0 {
		t.Skip("needs root for a time namespace (unshare --time); the source is clock_linux.go")
	}
	cmd := exec.Command("unshare", "--time", "--fork", "--boottime", "100000", os.Args[0], "-test.run=^TestClockIsBoottime$", "-test.count=1")
	cmd.Env = append(os.Environ(), "TICKETING_CLOCK_CHILD=1")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("in a time namespace with boottime +100000s: %v\n%s", err, out)
	}
}
