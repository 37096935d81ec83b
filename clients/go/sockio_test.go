package ticketing

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"
)

// TestWriteToAServerThatStopsReading: requests behind a socket that takes no more bytes wait
// for it until the write deadline (one and a half request timeouts at most), then the client
// gives the connection up and reconnects; meanwhile each call ends at its request timeout. On
// Linux this is the raw write's wait for writability (conn.writeRaw): a short write must neither
// be taken for a whole one nor spin.
func TestWriteToAServerThatStopsReading(t *testing.T) {
	fs := newFakeServer(t)
	fs.set(func(fs *fakeServer) { fs.noRead = true })
	c, _ := dialFake(t, fs, WithRequestTimeout(300*time.Millisecond))
	fs.set(func(fs *fakeServer) { fs.noRead = false })
	key := strings.Repeat("k", MaxKeyLen)
	const calls = 400 // 26 MB of requests: more than both sockets' buffers hold
	start := time.Now()
	errs := make(chan error, calls)
	for range calls {
		go func() {
			_, err := c.Inspect(context.Background(), key)
			errs <- err
		}()
	}
	for range calls {
		select {
		case err := <-errs:
			if !errors.Is(err, ErrTimeout) {
				t.Fatalf("Inspect behind a full socket: %v", err)
			}
		case <-time.After(bound):
			t.Fatal("Inspect behind a full socket did not end")
		}
	}
	fs.next() // the reconnection, once the write timed out
	if d := time.Since(start); d < 300*time.Millisecond {
		t.Fatalf("the connection was given up after %v, before the write deadline", d)
	}
}
