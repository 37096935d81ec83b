package server

import (
	"fmt"
	"math/rand/v2"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/ticketing/ticketing/wire"
)

// TestStressRandomClients runs many clients doing random acquires (try-once, short waits,
// cancelled waits), releases, extends and abrupt disconnects on a few keys, for a bounded time.
// Afterwards every lease ends, and the server must be back to an empty table, with no goroutine
// left behind, and no token granted twice.
func TestStressRandomClients(t *testing.T) {
	ts := startServer(t, nil)
	// The baseline: the server fully up (accept loop and clock running), no connection.
	probe := connect(t, ts.addr, "")
	probe.roundTrip(wire.Request{Op: wire.OpPing, ID: 1})
	probe.nc.Close()
	waitFor(t, 5*time.Second, "probe gone", func() bool { _, _, _, n := ts.Stats(); return n == 0 })
	base := runtime.NumGoroutine()
	const workers = 12

	var mu sync.Mutex
	seen := map[uint64]string{} // every token granted, with its key: tokens never repeat
	// At least 1.5 s and 300 grants (a loaded machine takes longer to get there), at most 20 s.
	deadline, hardDeadline := time.Now().Add(1500*time.Millisecond), time.Now().Add(20*time.Second)
	const minGrants = 300
	more := func() bool {
		now := time.Now()
		if now.After(hardDeadline) {
			return false
		}
		if now.Before(deadline) {
			return true
		}
		mu.Lock()
		defer mu.Unlock()
		return len(seen) < minGrants
	}
	grant := func(key string, tok uint64) error {
		mu.Lock()
		defer mu.Unlock()
		if tok == 0 {
			return fmt.Errorf("key %s: zero token", key)
		}
		if k, dup := seen[tok]; dup {
			return fmt.Errorf("token %d granted twice (%s and %s)", tok, k, key)
		}
		seen[tok] = key
		return nil
	}

	var wg sync.WaitGroup
	errs := make(chan error, workers)
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func(seed uint64) {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(seed, 7))
			c := connect(t, ts.addr, "")
			var id uint64
			held := map[string]uint64{}
			// next reads answers until the one for want arrives (EXPIRED notices and answers to
			// earlier requests may come first).
			next := func(want uint64) (wire.Response, error) {
				for {
					r, err := c.recvWithin(5 * time.Second)
					if err != nil {
						return r, err
					}
					if r.Op == wire.OpExpired {
						delete(held, string(r.Data))
						continue
					}
					if r.ID != want {
						return r, fmt.Errorf("answer to %d while waiting for %d", r.ID, want)
					}
					return r, nil
				}
			}
			for more() {
				key := fmt.Sprintf("k%d", rng.IntN(4))
				id++
				switch op := rng.IntN(10); {
				case op < 4: // acquire with a short wait
					c.send(acquire(id, key, uint32(20+rng.IntN(60)), uint32(rng.IntN(30))))
					r, err := next(id)
					if err != nil {
						errs <- err
						return
					}
					if r.Status == wire.StatusOK {
						if err := grant(key, r.Token); err != nil {
							errs <- err
							return
						}
						held[key] = r.Token
					} else if r.Status != wire.StatusTimedOut {
						errs <- fmt.Errorf("acquire: %v", r.Status)
						return
					}
				case op < 6: // release something held (possibly expired meanwhile)
					for k, tok := range held {
						c.send(release(id, k, tok))
						r, err := next(id)
						if err != nil {
							errs <- err
							return
						}
						if r.Status != wire.StatusOK && r.Status != wire.StatusNotHeld {
							errs <- fmt.Errorf("release: %v", r.Status)
							return
						}
						delete(held, k)
						break
					}
				case op < 7: // extend
					for k, tok := range held {
						c.send(wire.Request{Op: wire.OpExtend, ID: id, Key: []byte(k), Token: tok, Lease: 50})
						if _, err := next(id); err != nil {
							errs <- err
							return
						}
						break
					}
				case op < 9: // wait without limit, then cancel
					c.send(acquire(id, key, 50, wire.WaitForever))
					acq := id
					id++
					c.send(wire.Request{Op: wire.OpCancel, ID: id, Token: acq})
					r, err := next(acq)
					if err != nil {
						errs <- err
						return
					}
					if r.Status == wire.StatusOK {
						if err := grant(key, r.Token); err != nil {
							errs <- err
							return
						}
						held[key] = r.Token
					} else if r.Status != wire.StatusCancelled {
						errs <- fmt.Errorf("cancelled acquire: %v", r.Status)
						return
					}
					if _, err := next(id); err != nil {
						errs <- err
						return
					}
				default: // queue, then vanish without a word
					c.send(acquire(id, key, 50, wire.WaitForever))
					c.nc.Close()
					c = connect(t, ts.addr, "")
					held = map[string]uint64{}
				}
			}
			c.nc.Close()
		}(uint64(w))
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	// Every lease was at most 80 ms: soon nothing is held, queued or in the table.
	waitFor(t, 5*time.Second, "empty table", func() bool {
		keys, held, waiters, conns := ts.Stats()
		return keys == 0 && held == 0 && waiters == 0 && conns == 0
	})
	end := time.Now().Add(5 * time.Second)
	for runtime.NumGoroutine() > base {
		if time.Now().After(end) {
			var buf [1 << 16]byte
			n := runtime.Stack(buf[:], true)
			t.Fatalf("%d goroutines, %d before:\n%s", runtime.NumGoroutine(), base, buf[:n])
		}
		time.Sleep(5 * time.Millisecond)
	}
	if len(seen) < minGrants {
		t.Fatalf("only %d grants: the workload did not run", len(seen))
	}
}
