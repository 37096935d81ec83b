package server

import (
	"encoding/binary"
	"fmt"
	"testing"

	"github.com/ticketing/ticketing/wire"
)

// pathFixture drives the request path without sockets: validate -> batch -> apply (the lock
// table) -> route -> encode, exactly as the read loop does for one read (conn.serve), with a
// connection whose socket is never touched.
type pathFixture struct {
	s      *Server
	c      *conn
	frames []byte
	ack    []byte
	keys   [][]byte
	relOff int
	i      int
	id     uint64
}

func newPathFixture(tb testing.TB, nkeys int) *pathFixture {
	cfg := Default()
	cfg.DataDir = tb.TempDir()
	s, err := New(cfg, quietLogger())
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { s.store.Close() })
	c := newConn(s, nil, nil)
	c.id = 1
	s.table.Attach(s.now(), [wire.SessionIDSize]byte{1}, c.id, 0)
	c.owner = s.table.Outs()[0].Owner
	s.table.ClearOuts()
	s.table.Ceiling(s.now(), 1<<62, 1<<62) // as if the persister had run
	s.conns[c.id] = c
	f := &pathFixture{s: s, c: c}
	for i := 0; i < nkeys; i++ {
		f.keys = append(f.keys, []byte(fmt.Sprintf("order-%06d", i)))
	}
	f.frames = wire.AppendRequest(nil, &wire.Request{Op: wire.OpAcquire, ID: 1, Key: f.keys[0], Lease: 30000})
	f.relOff = len(f.frames)
	f.frames = wire.AppendRequest(f.frames, &wire.Request{Op: wire.OpRelease, ID: 2, Key: f.keys[0], Token: 1})
	f.ack = wire.AppendRequest(nil, &wire.Request{Op: wire.OpAck, ID: 1})
	return f
}

// step runs one acquire+release pair on the next key (and, every 256 pairs, an ACK, as a
// client does).
func (f *pathFixture) step(tb testing.TB) {
	key := f.keys[f.i%len(f.keys)]
	f.i++
	copy(f.frames[wire.HeaderSize:], key)
	copy(f.frames[f.relOff+wire.HeaderSize:], key)
	binary.BigEndian.PutUint64(f.frames[8:], f.id+1)
	binary.BigEndian.PutUint64(f.frames[f.relOff+8:], f.id+2)
	binary.BigEndian.PutUint64(f.frames[f.relOff+16:], f.s.table.LastToken()+1)
	f.id += 2
	if off, fatal := f.c.serve(f.frames); fatal || off != len(f.frames) {
		tb.Fatalf("serve: off=%d fatal=%v", off, fatal)
	}
	if len(f.c.out) != 2*wire.HeaderSize || f.c.out[5] != 0 || f.c.out[wire.HeaderSize+5] != 0 {
		tb.Fatalf("unexpected answers % x", f.c.out)
	}
	f.c.out, f.c.marks = f.c.out[:0], f.c.marks[:0] // as a completed write leaves them
	if f.i%256 == 0 {
		f.id++
		binary.BigEndian.PutUint64(f.ack[8:], f.id)
		binary.BigEndian.PutUint64(f.ack[16:], f.id)
		f.c.serve(f.ack)
		f.c.out, f.c.marks = f.c.out[:0], f.c.marks[:0] // as a completed write leaves them
	}
}

// TestRequestPathAllocs pins the request path at zero allocations per operation.
func TestRequestPathAllocs(t *testing.T) {
	f := newPathFixture(t, 1000)
	for i := 0; i < 3000; i++ { // warm the table's slabs, hash buckets and stored outcomes
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
