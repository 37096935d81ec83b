package ticketing

import (
	"bufio"
	"bytes"
	"context"
	"encoding/hex"
	"errors"
	"io"
	"os"
	"testing"
	"time"

	"github.com/ticketing/ticketing/internal/testserver"
	"github.com/ticketing/ticketing/wire"
)

// The read and write roles (conn.go): a caller that finds nobody reading writes its own frame and
// reads its own answer; the background reader reads while callers wait behind another reader,
// and when the connection has been idle for idleRead. These tests put a caller in the role on
// purpose (withIdleRead(time.Hour): the background reader does not take the role back while the
// test sets up the next call) and check that everything a waiting call must notice still
// reaches it there: other calls' answers, pushes, a request timeout, its context's end, a
// dropped connection, Close.

// withIdleRead sets how long an unread connection waits for a caller before the background
// reader reads it (default idleRead).
func withIdleRead(d time.Duration) Option { return func(o *options) { o.idleRead = d } }

// readerOf is who holds the read role of c's connection (readByNone without a connection).
func readerOf(c *Client) readRole {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.live == nil {
		return readByNone
	}
	return c.live.reader
}

// waitReader waits until the read role of c's connection is held by want.
func waitReader(t *testing.T, c *Client, want readRole) {
	t.Helper()
	deadline := time.Now().Add(bound)
	for readerOf(c) != want {
		if time.Now().After(deadline) {
			t.Fatalf("read role: %d, want %d", readerOf(c), want)
		}
		time.Sleep(time.Millisecond)
	}
}

// dialIdle dials fs with the background reader kept off an idle connection, and makes one call
// (which the background reader, holding the role from the start, answers): afterwards nobody
// reads, and the next call's caller reads for itself.
func dialIdle(t *testing.T, fs *fakeServer, opts ...Option) (*Client, *fakeConn) {
	t.Helper()
	c, fc := dialFake(t, fs, append([]Option{withIdleRead(time.Hour)}, opts...)...)
	ping := async(func() error { return c.Ping(context.Background()) })
	fc.ok(fc.nextOp(wire.OpPing), 0)
	if err := waitErr(t, ping); err != nil {
		t.Fatal(err)
	}
	waitReader(t, c, readByNone)
	return c, fc
}

// TestCallerReadsForItself: a call made while nobody reads is read by its own caller, which
// also hands over the answers of calls made behind it and the pushes that arrive meanwhile; when
// its answer has come, the role goes to the background reader if a call still waits, else to
// nobody.
func TestCallerReadsForItself(t *testing.T) {
	fs := newFakeServer(t)
	c, fc := dialIdle(t, fs)
	ctx := context.Background()

	// Alone.
	p := async(func() error { return c.Ping(ctx) })
	r := fc.nextOp(wire.OpPing)
	waitReader(t, c, readByCaller)
	fc.ok(r, 0)
	if err := waitErr(t, p); err != nil {
		t.Fatal(err)
	}
	waitReader(t, c, readByNone)

	// A lock is granted to a caller reading for itself; a second caller waits behind it, is
	// answered first, and the EXPIRED push for the lock arrives while the first still reads.
	acq, lk, a := acquireAsync(t, c, fc, "k", time.Minute)
	fc.ok(a, 7)
	if err := waitErr(t, acq); err != nil {
		t.Fatal(err)
	}
	waitReader(t, c, readByNone)
	first := async(func() error { return c.Ping(ctx) })
	r1 := fc.nextOp(wire.OpPing)
	waitReader(t, c, readByCaller)
	second := async(func() error { return c.Ping(ctx) })
	r2 := fc.nextOp(wire.OpPing)
	fc.ok(r2, 0)
	if err := waitErr(t, second); err != nil {
		t.Fatal(err)
	}
	fc.reply(wire.Response{Op: wire.OpExpired, Token: 7, Detail: wire.ExpiredLease, Data: a.Key})
	waitLost(t, *lk, ReasonExpired)
	if readerOf(c) != readByCaller {
		t.Fatal("the first caller gave up the read role before its answer came")
	}
	fc.ok(r1, 0)
	if err := waitErr(t, first); err != nil {
		t.Fatal(err)
	}
	waitReader(t, c, readByNone)

	// The first caller's answer comes while the second's is awaited: the background reader
	// takes over for the second.
	first = async(func() error { return c.Ping(ctx) })
	r1 = fc.nextOp(wire.OpPing)
	waitReader(t, c, readByCaller)
	second = async(func() error { return c.Ping(ctx) })
	r2 = fc.nextOp(wire.OpPing)
	fc.ok(r1, 0)
	if err := waitErr(t, first); err != nil {
		t.Fatal(err)
	}
	waitReader(t, c, readByBG)
	fc.ok(r2, 0)
	if err := waitErr(t, second); err != nil {
		t.Fatal(err)
	}
	waitReader(t, c, readByNone) // the background reader hands the role back
}

// TestIdleConnectionIsRead: with the default idleRead, a connection that no call waits on is
// read again soon: a push (EXPIRED) and a dropped connection are noticed.
func TestIdleConnectionIsRead(t *testing.T) {
	fs := newFakeServer(t)
	c, fc := dialFake(t, fs)
	acq, lk, a := acquireAsync(t, c, fc, "k", time.Minute)
	fc.ok(a, 3)
	if err := waitErr(t, acq); err != nil {
		t.Fatal(err)
	}
	waitReader(t, c, readByBG) // after idleRead
	fc.reply(wire.Response{Op: wire.OpExpired, Token: 3, Detail: wire.ExpiredStopping, Data: a.Key})
	waitLost(t, *lk, ReasonServerStopping)
	fc.drop()
	waitDisconnected(t, c)
}

// TestOwnReadRequestTimeout: the request timeout ends the wait of a caller that reads for itself
// (its read is interrupted); the late answer is dropped, and the connection goes on.
func TestOwnReadRequestTimeout(t *testing.T) {
	fs := newFakeServer(t)
	c, fc := dialIdle(t, fs, WithRequestTimeout(200*time.Millisecond))
	ctx := context.Background()
	start := time.Now()
	p := async(func() error { return c.Ping(ctx) })
	r := fc.nextOp(wire.OpPing)
	err := waitErr(t, p)
	if d := time.Since(start); !errors.Is(err, ErrTimeout) || d < 200*time.Millisecond || d > 200*time.Millisecond+2*time.Second {
		t.Fatalf("Ping: %v after %v", err, d)
	}
	waitReader(t, c, readByBG) // the timed-out PING is still awaited
	fc.ok(r, 0)
	waitReader(t, c, readByNone)
	pingServed(t, c, fc)
}

// TestOwnReadCancel: a caller reading for itself whose context ends withdraws its ACQUIRE
// (CANCEL), and releases the grant that raced the CANCEL before it returns; the client goes on.
func TestOwnReadCancel(t *testing.T) {
	fs := newFakeServer(t)
	c, fc := dialIdle(t, fs)
	ctx, cancel := context.WithCancel(context.Background())
	acq := async(func() error { _, err := c.Acquire(ctx, "k", time.Minute); return err })
	a := fc.nextOp(wire.OpAcquire)
	waitReader(t, c, readByCaller)
	cancel()
	cr := fc.nextOp(wire.OpCancel)
	if cr.Token != a.ID {
		t.Fatalf("CANCEL of id %d, want %d", cr.Token, a.ID)
	}
	fc.ok(a, 9) // granted before the CANCEL arrived
	fc.ok(cr, 0)
	rel := fc.nextOp(wire.OpRelease)
	if rel.Token != 9 || string(rel.Key) != "k" {
		t.Fatalf("RELEASE %q token %d, want the raced grant's", rel.Key, rel.Token)
	}
	fc.ok(rel, 0)
	if err := waitErr(t, acq); !errors.Is(err, ErrCancelled) {
		t.Fatalf("Acquire: %v, want ErrCancelled", err)
	}
	pingServed(t, c, fc)
}

// TestOwnReadResumes: a caller reading for itself when the connection drops waits for the
// next one: its request is re-sent there with its id, and its answer comes from there.
func TestOwnReadResumes(t *testing.T) {
	fs := newFakeServer(t)
	c, fc := dialIdle(t, fs)
	p := async(func() error { return c.Ping(context.Background()) })
	r := fc.nextOp(wire.OpPing)
	waitReader(t, c, readByCaller)
	fc.drop()
	fc2 := fs.next()
	if !fc2.Resumed {
		t.Fatal("the session was not resumed")
	}
	r2 := fc2.nextOp(wire.OpPing)
	if r2.ID != r.ID {
		t.Fatalf("re-sent id %d, want %d", r2.ID, r.ID)
	}
	fc2.ok(r2, 0)
	if err := waitErr(t, p); err != nil {
		t.Fatal(err)
	}
}

// TestOwnReadClose: Close ends the wait of a caller reading for itself at once (ErrClosed),
// even while the server never answers the CANCEL that withdraws it.
func TestOwnReadClose(t *testing.T) {
	fs := newFakeServer(t)
	c, fc := dialIdle(t, fs, WithCleanupTimeout(300*time.Millisecond))
	acq := async(func() error { _, err := c.Acquire(context.Background(), "k", time.Minute); return err })
	fc.nextOp(wire.OpAcquire)
	waitReader(t, c, readByCaller)
	start := time.Now()
	closed := async(c.Close)
	if err := waitErr(t, acq); !errors.Is(err, ErrClosed) {
		t.Fatalf("Acquire: %v, want ErrClosed", err)
	}
	if d := time.Since(start); d > 250*time.Millisecond {
		t.Fatalf("Acquire returned %v after Close began (the CANCEL's clean-up is bounded by 300ms)", d)
	}
	fc.nextOp(wire.OpCancel)
	if err := waitErr(t, closed); err != nil {
		t.Fatal(err)
	}
}

// TestOwnReadInterrupted, against the real server, in plain TCP and in TLS: an Acquire queued
// behind another client's lock, read by its own caller, ends with its context; the stream
// survives the interrupted read (TLS included), the withdrawn Acquire holds nothing, and the key
// goes to the next one who asks once released.
func TestOwnReadInterrupted(t *testing.T) {
	files, err := testserver.GenerateTLS(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	tlsSrv := startServer(t, testserver.Config{TLSCert: files.ServerCert, TLSKey: files.ServerKey})
	for _, tc := range []struct {
		name string
		addr string
		opts []Option
	}{
		{"tcp", sharedAddr, nil},
		{"tls", tlsSrv.Addr, []Option{WithTLS(tlsConfig(t, files.CA, "", ""))}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dial := func(opts ...Option) *Client {
				c, err := Dial(ctxT(t), append([]Option{WithEndpoints(tc.addr)}, append(tc.opts, opts...)...)...)
				if err != nil {
					t.Fatalf("Dial: %v", err)
				}
				t.Cleanup(func() { c.Close() })
				return c
			}
			// (No heartbeat: its PING's answer would wake the waiter's read too.)
			holder, waiter := dial(), dial(withIdleRead(time.Hour), WithHeartbeat(0))
			k := key(t)
			held := mustAcquire(t, holder, k, time.Minute)
			if err := waiter.Ping(ctxT(t)); err != nil {
				t.Fatal(err)
			}
			for i := 0; i < 3; i++ {
				// Nobody reads before the Acquire is sent, so that its caller reads for itself:
				// the background reader, which read the answers of the CANCEL and of the
				// TryAcquire before, gives the role up only after it handed the last one over,
				// and it keeps the role if a call waits by then (the Acquire, read by it then).
				waitReader(t, waiter, readByNone)
				// Cancelled once its caller reads (a timeout could end it before waitReader
				// saw the caller read, on a loaded machine).
				ctx, cancel := context.WithCancel(context.Background())
				acq := async(func() error { _, err := waiter.Acquire(ctx, k, time.Minute); return err })
				waitReader(t, waiter, readByCaller)
				cancel()
				err := waitErr(t, acq)
				if !errors.Is(err, ErrCancelled) {
					t.Fatalf("Acquire behind a held lock: %v, want ErrCancelled", err)
				}
				if lk, err := waiter.TryAcquire(ctxT(t), k, time.Minute); lk != nil || err != nil {
					t.Fatalf("TryAcquire of the held key: %v, %v", lk, err)
				}
			}
			if err := held.Release(ctxT(t)); err != nil {
				t.Fatal(err)
			}
			lk, err := waiter.TryAcquire(ctxT(t), k, time.Minute)
			if err != nil || lk == nil {
				t.Fatalf("TryAcquire after the release: %v, %v (a withdrawn Acquire kept the key?)", lk, err)
			}
			if err := lk.Release(ctxT(t)); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// timeoutEvery is a reader that fails every other Read with a deadline error (the read role's
// interruption) and otherwise returns at most n bytes.
type timeoutEvery struct {
	r    io.Reader
	n    int
	fail bool
}

func (t *timeoutEvery) Read(p []byte) (int, error) {
	t.fail = !t.fail
	if t.fail {
		return 0, os.ErrDeadlineExceeded
	}
	return t.r.Read(p[:min(len(p), t.n)])
}

// TestFrameReaderResumes: every response vector, in one stream, read through a buffer smaller
// than most frames (the path of a frame longer than the buffer) and larger than all, with a read
// interrupted before every chunk: each frame decodes whole, after as many interruptions as it
// took, and the stream ends with io.EOF.
func TestFrameReaderResumes(t *testing.T) {
	v := loadVectors(t)
	var stream []byte
	for _, vec := range v.Responses {
		stream = append(stream, unhex(t, vec.Hex)...)
	}
	for _, size := range []int{16, 4096} {
		for _, chunk := range []int{1, 7, 1 << 20} {
			fr := frameReader{br: bufio.NewReaderSize(&timeoutEvery{r: bytes.NewReader(stream), n: chunk}, size)}
			next := func(r *wire.Response) error {
				for {
					err := fr.next(wire.MaxDataLen, r)
					if !errors.Is(err, os.ErrDeadlineExceeded) {
						return err
					}
				}
			}
			for i, vec := range v.Responses {
				var r wire.Response
				if err := next(&r); err != nil {
					t.Fatalf("buffer %d, chunks of %d: %s: %v", size, chunk, vec.Name, err)
				}
				f := vec.Fields
				if r.Op.String() != f.Op || r.Status.String() != f.Status || r.ID != u64(t, f.ID) || r.Token != u64(t, f.Token) ||
					r.Lease != f.LeaseMs || r.Detail != f.Detail || hex.EncodeToString(r.Data) != f.DataHex {
					t.Fatalf("buffer %d, chunks of %d: frame %d (%s) decoded %+v, want %+v", size, chunk, i, vec.Name, r, f)
				}
			}
			if err := next(new(wire.Response)); err != io.EOF {
				t.Fatalf("buffer %d, chunks of %d: after the last frame: %v, want io.EOF", size, chunk, err)
			}
		}
	}
}

// pingServed checks that the client goes on: a PING is sent on fc and its answer returned.
func pingServed(t *testing.T, c *Client, fc *fakeConn) {
	t.Helper()
	p := async(func() error { return c.Ping(context.Background()) })
	fc.ok(fc.nextOp(wire.OpPing), 0)
	if err := waitErr(t, p); err != nil {
		t.Fatal(err)
	}
}
