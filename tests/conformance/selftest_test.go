package conformance

import (
	"strings"
	"testing"
)

// TestRunnerCatchesBrokenDriver shows that the scenarios can fail: the stub driver broken on
// purpose (TICKETING_CONFORMANCE_STUB_BREAK) fails the scenario that checks what was broken,
// and the same scenario passes with the stub intact.
func TestRunnerCatchesBrokenDriver(t *testing.T) {
	bin := serverBinary(t)
	env := &runEnv{bin: bin, kind: "single"}
	env.newTarget = newSingleNodeFactory(bin, nil)
	byName := map[string]scenario{}
	for _, sc := range scenarios {
		byName[sc.name] = sc
	}
	for _, tc := range []struct{ brk, scenario string }{
		{"", "cancel_waiting"}, {"cancel", "cancel_waiting"},
		{"", "lost_on_expiry"}, {"lost", "lost_on_expiry"},
		{"", "ack_outcomes"}, {"ack", "ack_outcomes"},
	} {
		d, err := startDriver("stub", []string{testBinary()}, driverEnv(bin, stubDriverEnv+"=1", "TICKETING_CONFORMANCE_STUB_BREAK="+tc.brk))
		if err != nil {
			t.Fatal(err)
		}
		s := newS(tc.scenario, env, d)
		s.execute(byName[tc.scenario].run)
		d.stop()
		if broken := tc.brk != ""; s.failed() != broken {
			t.Errorf("stub with break %q: scenario %s failed=%v; want %v\n%s", tc.brk, tc.scenario, s.failed(), broken, s.report([]*driver{d}))
		} else if broken {
			t.Logf("stub with break %q fails %s as it should: %s", tc.brk, tc.scenario, s.failures[0])
		}
	}
}

// TestDriverThatFailsHello: a driver that does not answer hello is an error, not a skip.
func TestDriverThatFailsHello(t *testing.T) {
	for _, argv := range [][]string{
		{"sh", "-c", "echo 'not json'; exit 3"},
		{"sh", "-c", `read line; echo '{"id": 1, "ok": false, "error": {"kind": "other", "message": "no"}}'`},
		{"/nonexistent/conformance-driver"},
	} {
		d, err := startDriver("bad", argv, driverEnv("/bin/false"))
		if err == nil {
			d.stop()
			t.Errorf("driver %v started; want an error", argv)
			continue
		}
		t.Logf("%v: %v", argv, strings.SplitN(err.Error(), "\n", 2)[0])
	}
}
