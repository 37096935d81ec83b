package server

import (
	"encoding/binary"
	"fmt"
	"testing"

	"github.com/ticketing/ticketing/internal/wire"
)

// pathFixture drives the request path without sockets: decode -> lock table -> encode, exactly as
// the read loop does for one batch (conn.batch), with a connection whose socket is never touched.
type pathFixture struct {
	s      *Server
	c      *conn
	frames []byte
	keys   [][]byte
	relOff int
	i      int
}

func newPathFixture(tb testing.TB, nkeys int) *pathFixture {
	cfg := Default()
	cfg.DataDir = tb.TempDir()
	s, err := New(cfg, quietLogger())
	if err != nil {
		tb.Fatal(err)
	}
	c := newConn(s, nil)
	c.id = 1
	s.conns[c.id] = c
	f := &pathFixture{s: s, c: c}
	for i := 0; i < nkeys; i++ {
		f.keys = append(f.keys, []byte(fmt.Sprintf("order-%06d", i)))
	}
	f.frames = wire.AppendRequest(nil, &wire.Request{Op: wire.OpAcquire, ID: 1, Key: f.keys[0], Lease: 30000})
	f.relOff = len(f.frames)
	f.frames = wire.AppendRequest(f.frames, &wire.Request{Op: wire.OpRelease, ID: 2, Key: f.keys[0], Token: 1})
	return f
}

// step runs one acquire+release pair on the next key.
func (f *pathFixture) step(tb testing.TB) {
	key := f.keys[f.i%len(f.keys)]
	f.i++
	copy(f.frames[wire.HeaderSize:], key)
	copy(f.frames[f.relOff+wire.HeaderSize:], key)
	binary.BigEndian.PutUint64(f.frames[f.relOff+16:], f.s.tokens.Last()+1)
	if off, fatal := f.c.batch(f.frames); fatal || off != len(f.frames) {
		tb.Fatalf("batch: off=%d fatal=%v", off, fatal)
	}
	if len(f.c.out) != 2*wire.HeaderSize || f.c.out[5] != 0 || f.c.out[wire.HeaderSize+5] != 0 {
		tb.Fatalf("unexpected answers % x", f.c.out)
	}
	f.c.out = f.c.out[:0]
}

// TestRequestPathAllocs pins the request path at zero allocations per operation.
func TestRequestPathAllocs(t *testing.T) {
	f := newPathFixture(t, 1000)
	for i := 0; i < 2000; i++ { // warm the table's slabs and hash buckets
		f.step(t)
	}
	if a := testing.AllocsPerRun(5000, func() { f.step(t) }); a != 0 {
		t.Fatalf("request path allocates %v times per acquire+release", a)
	}
}

// BenchmarkRequestPath: one op = one acquire+release pair (two requests, two answers).
func BenchmarkRequestPath(b *testing.B) {
	f := newPathFixture(b, 10000)
	for i := 0; i < 20000; i++ {
		f.step(b)
	}
	b.ReportAllocs()
	b.ResetTimer()
	for b.Loop() {
		f.step(b)
	}
}
