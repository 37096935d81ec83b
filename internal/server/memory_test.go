package server

import (
	"fmt"
	"testing"
	"unsafe"

	"github.com/ticketing/ticketing/wire"
)

// TestBusyConnectionMemory pins what a busy connection keeps besides its session (whose stored
// outcomes internal/locktable's TestMemoryBusySessionOutcomes pins) and its reader goroutine's
// stack: the batch being built, the answer buffers (the batch's, the queued, the one being
// written) and the grant marks, after 600 rounds of a pipelining load like `make bench` (a): 32
// acquires in one write, then their 32 releases, an ACK every 256 answers. docs/operations.md
// ("Sizing") quotes the figure. Run with -v to see it.
func TestBusyConnectionMemory(t *testing.T) {
	ts := startServer(t, nil)
	c := connect(t, ts.addr, "")
	const depth = 32
	keys := make([]string, depth)
	for i := range keys {
		keys[i] = fmt.Sprintf("tenant-%d/order-%d", i%17, i)
	}
	var id uint64
	answers := 0
	tokens := make([]uint64, depth)
	var batch []byte
	for round := 0; round < 600; round++ {
		// 32 acquires in one write, then their 32 releases in one write.
		batch = batch[:0]
		for _, k := range keys {
			id++
			batch = wire.AppendRequest(batch, &wire.Request{Op: wire.OpAcquire, ID: id, Key: []byte(k), Lease: 30000})
		}
		c.write(batch)
		for i := range keys {
			r := c.recv()
			if r.Status != wire.StatusOK {
				t.Fatalf("round %d: acquire answered %v", round, r.Status)
			}
			tokens[i] = r.Token
		}
		batch = batch[:0]
		for i, k := range keys {
			id++
			batch = wire.AppendRequest(batch, &wire.Request{Op: wire.OpRelease, ID: id, Key: []byte(k), Token: tokens[i]})
		}
		c.write(batch)
		for range keys {
			if r := c.recv(); r.Status != wire.StatusOK {
				t.Fatalf("round %d: release answered %v", round, r.Status)
			}
		}
		answers += 2 * depth
		if answers >= 256 {
			answers = 0
			id++
			c.roundTrip(wire.Request{Op: wire.OpAck, ID: id, Token: id})
		}
	}
	got := connBufferBytes(ts.Server)
	t.Logf("a busy connection's buffers: %d bytes (+ a %d-byte read buffer while it reads)", got, readBufSize)
	// 3,552 bytes measured (go1.26, amd64): the batch of 36 decoded requests (2,016) and three
	// grant-mark slices of 32 (1,536). The answer buffers (1,408 bytes each: the batch's, the
	// queued, the one being written) are borrowed from answerBufs and given back once written;
	// before that they were kept, 7,776 bytes in all. The bound leaves room for a size class,
	// not for a kept answer buffer.
	if max := 4 << 10; got > max {
		t.Errorf("a busy connection's buffers hold %d bytes, over the pinned %d (docs/operations.md quotes it: measure again and update both, or find what grew)", got, max)
	}
}

// connBufferBytes returns the capacity, in bytes, of the buffers the server's one attached
// connection keeps between batches. Server.mu orders this after the reader's last batch (its
// answers are committed under it); the output side's fields are read under the output's mutex.
func connBufferBytes(s *Server) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.conns) != 1 {
		panic(fmt.Sprintf("%d connections attached, want 1", len(s.conns)))
	}
	for _, c := range s.conns {
		n := cap(c.reqs)*int(unsafe.Sizeof(wire.Request{})) + cap(c.resp) +
			cap(c.grants)*int(unsafe.Sizeof(grantMark{})) + cap(c.flushScratch)*int(unsafe.Sizeof(c))
		c.mu.Lock()
		n += cap(c.out) + cap(c.spare) + (cap(c.marks)+cap(c.spareMk))*int(unsafe.Sizeof(grantMark{}))
		c.mu.Unlock()
		return n
	}
	return 0
}
