package ticketing_test

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log"
	"os"
	"sync"
	"time"

	ticketing "github.com/ticketing/ticketing/clients/go"
	"github.com/ticketing/ticketing/internal/testserver"
)

// The examples run against the test server that TestMain starts (addr), or against servers of
// their own started by the helpers at the end of this file. README.md shows them; readme_test.go
// checks that it shows them as they are here.

func Example() {
	ctx := context.Background()
	c, err := ticketing.Dial(ctx, ticketing.WithEndpoints(addr))
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()

	lock, err := c.Acquire(ctx, "example/order-1234", 30*time.Second)
	if err != nil {
		log.Fatal(err)
	}
	defer lock.Release(ctx) // bounded by the request timeout (10s): it cannot hang

	fmt.Println("acquired", lock.Key(), "with a fencing token:", lock.Token() > 0)
	// ... the work, passing lock.Token() to the resource ...
	if err := lock.Release(ctx); err != nil {
		log.Fatal(err)
	}
	fmt.Println("released")
	// Output:
	// acquired example/order-1234 with a fencing token: true
	// released
}

// A server with a token: the client proves it holds the token, and checks that the server
// holds it too. A wrong or missing token is ErrAuthFailed.
func Example_auth() {
	addr, stop := startServer(testserver.Config{Token: "s3cret"})
	defer stop()
	ctx := context.Background()

	c, err := ticketing.Dial(ctx, ticketing.WithEndpoints(addr), ticketing.WithToken("s3cret"))
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()
	fmt.Println("ping:", c.Ping(ctx))

	_, err = ticketing.Dial(ctx, ticketing.WithEndpoints(addr), ticketing.WithToken("wrong"))
	fmt.Println(errors.Is(err, ticketing.ErrAuthFailed)) // "ticketing: connect 127.0.0.1:7070: authentication failed: the server rejected the token"
	// Output:
	// ping: <nil>
	// true
}

// TLS: verify the server with your CA; add a client certificate for a server that requires one
// (mutual TLS, TICKETING_TLS_CLIENT_CA).
func Example_tls() {
	files, addr, stop := startTLSServer()
	defer stop()
	ctx := context.Background()

	caPEM, err := os.ReadFile(files.CA)
	if err != nil {
		log.Fatal(err)
	}
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(caPEM)
	cert, err := tls.LoadX509KeyPair(files.ClientCert, files.ClientKey)
	if err != nil {
		log.Fatal(err)
	}
	c, err := ticketing.Dial(ctx, ticketing.WithEndpoints(addr),
		ticketing.WithTLS(&tls.Config{RootCAs: roots, Certificates: []tls.Certificate{cert}}))
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()
	fmt.Println("ping over mutual TLS:", c.Ping(ctx))

	// Without the client certificate the server refuses the connection.
	_, err = ticketing.Dial(ctx, ticketing.WithEndpoints(addr), ticketing.WithTLS(&tls.Config{RootCAs: roots}))
	fmt.Println("without a client certificate:", errors.Is(err, ticketing.ErrTLS))
	// Output:
	// ping over mutual TLS: <nil>
	// without a client certificate: true
}

// Keep a lease alive while the work runs, and stop the work if the lock is lost.
func ExampleWithKeepAlive() {
	ctx := context.Background()
	c, err := ticketing.Dial(ctx, ticketing.WithEndpoints(addr))
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()

	lock, err := c.Acquire(ctx, "example/daily-batch", time.Second, ticketing.WithKeepAlive())
	if err != nil {
		log.Fatal(err)
	}
	defer lock.Release(ctx)

	work := time.After(1500 * time.Millisecond) // a job longer than the lease
	select {
	case <-work:
		fmt.Println("done, the lock was held throughout")
	case <-lock.Lost():
		fmt.Println("lock lost, stopping:", lock.Err())
	}
	// Output: done, the lock was held throughout
}

// TryAcquire does not wait: a taken key is a nil *Lock, not an error.
func ExampleClient_TryAcquire() {
	ctx := context.Background()
	c, err := ticketing.Dial(ctx, ticketing.WithEndpoints(addr))
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()

	first, err := c.TryAcquire(ctx, "example/try", time.Minute)
	if err != nil {
		log.Fatal(err)
	}
	second, err := c.TryAcquire(ctx, "example/try", time.Minute)
	fmt.Println("second try acquired:", second != nil, "error:", err)
	first.Release(ctx)
	// Output: second try acquired: false error: <nil>
}

// A context bounds the wait; a cancelled Acquire leaves nothing held and nobody queued.
func ExampleClient_Acquire_cancel() {
	ctx := context.Background()
	c, err := ticketing.Dial(ctx, ticketing.WithEndpoints(addr))
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()
	holder, _ := c.Acquire(ctx, "example/busy", time.Minute)

	wctx, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
	defer cancel()
	_, err = c.Acquire(wctx, "example/busy", time.Minute)
	fmt.Println(errors.Is(err, context.DeadlineExceeded), err)

	holder.Release(ctx)
	lock, err := c.TryAcquire(ctx, "example/busy", time.Minute) // free at once: nobody queued
	fmt.Println("free after release:", lock != nil, err)
	lock.Release(ctx)
	// Output:
	// true ticketing: acquire "example/busy": cancelled while waiting for the answer: context deadline exceeded
	// free after release: true <nil>
}

// Expiry: without keep-alive the lease runs out and Lost closes, a little before the server can
// hand the lock on. Release then reports the loss.
func ExampleLock_Lost() {
	ctx := context.Background()
	c, err := ticketing.Dial(ctx, ticketing.WithEndpoints(addr))
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()

	lock, err := c.Acquire(ctx, "example/short", 100*time.Millisecond)
	if err != nil {
		log.Fatal(err)
	}
	<-lock.Lost()
	var lost *ticketing.LockLostError
	if errors.As(lock.Err(), &lost) {
		fmt.Println("lost:", lost.Reason)
	}
	fmt.Println("release:", errors.Is(lock.Release(ctx), ticketing.ErrLockLost))
	// Output:
	// lost: expired
	// release: true
}

// Fencing: the protected resource remembers the highest token it has seen and refuses older
// ones, so a holder that lost its lock without noticing cannot overwrite newer work.
func ExampleLock_Token() {
	ctx := context.Background()
	c, err := ticketing.Dial(ctx, ticketing.WithEndpoints(addr))
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()

	var store fencedStore
	old, _ := c.Acquire(ctx, "example/account-77", 50*time.Millisecond)
	<-old.Lost() // the old holder stalls past its lease

	current, _ := c.Acquire(ctx, "example/account-77", time.Minute)
	fmt.Println(store.Write(current.Token(), "balance=100"))
	fmt.Println(store.Write(old.Token(), "balance=0")) // the late holder wakes up
	current.Release(ctx)
	// Output:
	// accepted
	// rejected: stale token
}

// fencedStore stands for the resource. In SQL:
//
//	UPDATE account SET balance = $2, fence = $3 WHERE id = $1 AND fence <= $3
//
// and zero rows updated means a newer holder has written: stop.
type fencedStore struct {
	mu      sync.Mutex
	highest uint64
	value   string
}

func (s *fencedStore) Write(token uint64, v string) string {
	s.mu.Lock()
	defer s.mu.Unlock()
	if token < s.highest {
		return "rejected: stale token"
	}
	s.highest, s.value = token, v
	return "accepted"
}

// WithLock is the scoped form: it releases after the body and reports a lock lost while the body
// ran (the body's context is cancelled at the loss).
func ExampleClient_WithLock() {
	ctx := context.Background()
	c, err := ticketing.Dial(ctx, ticketing.WithEndpoints(addr))
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()

	err = c.WithLock(ctx, "example/report", 200*time.Millisecond, func(ctx context.Context, lock *ticketing.Lock) error {
		select {
		case <-time.After(time.Second): // longer than the lease, without keep-alive
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	})
	var lost *ticketing.LockLostError
	if errors.As(err, &lost) { // errors.Is(err, ticketing.ErrLockLost) is true too
		fmt.Println("lost while the body ran:", lost.Reason)
	}
	// Output: lost while the body ran: expired
}

// Two goroutines sharing one Client exclude each other like two processes: the owner is the
// token. A goroutine that might already hold the key asks to be refused instead of queueing
// behind itself.
func ExampleWithRefuseHeld() {
	ctx := context.Background()
	c, err := ticketing.Dial(ctx, ticketing.WithEndpoints(addr))
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()

	lock, _ := c.Acquire(ctx, "example/self", time.Minute)
	_, err = c.Acquire(ctx, "example/self", time.Minute, ticketing.WithRefuseHeld())
	fmt.Println(errors.Is(err, ticketing.ErrAlreadyHeld))
	lock.Release(ctx)
	// Output: true
}

// Close does not release: a closed (or crashed) client's locks run their lease, and the next
// waiter gets them then. WithReleaseOnClose releases them at Close.
func ExampleClient_Close() {
	ctx := context.Background()
	observer, err := ticketing.Dial(ctx, ticketing.WithEndpoints(addr))
	if err != nil {
		log.Fatal(err)
	}
	defer observer.Close()

	c, _ := ticketing.Dial(ctx, ticketing.WithEndpoints(addr))
	lock, _ := c.Acquire(ctx, "example/close", time.Minute)
	c.Close()
	info, _ := observer.Inspect(ctx, "example/close")
	fmt.Println("held after Close:", info.Held)
	observer.Release(ctx, "example/close", lock.Token()) // the token is the owner

	c, _ = ticketing.Dial(ctx, ticketing.WithEndpoints(addr), ticketing.WithReleaseOnClose())
	c.Acquire(ctx, "example/close", time.Minute)
	c.Close()
	info, _ = observer.Inspect(ctx, "example/close")
	fmt.Println("held after Close with WithReleaseOnClose:", info.Held)
	// Output:
	// held after Close: true
	// held after Close with WithReleaseOnClose: false
}

// A server restart loses its locks (a single node keeps them in memory): on reconnect the client
// sees a new state id, fires Lost with reason "server restarted" for every lock, and fails every
// request in flight. (The server here runs with TICKETING_STARTUP_GRACE=0; by default a
// restarted node grants nothing until the old leases have ended.)
func Example_serverRestart() {
	srv, stop := startRestartableServer()
	defer stop()
	ctx := context.Background()
	c, err := ticketing.Dial(ctx, ticketing.WithEndpoints(srv.Addr))
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()
	lock, _ := c.Acquire(ctx, "example/restart", time.Minute, ticketing.WithKeepAlive())

	srv.Kill() // a crash...
	srv.Respawn()

	<-lock.Lost()
	var lost *ticketing.LockLostError
	errors.As(lock.Err(), &lost)
	fmt.Println("lost:", lost.Reason)
	fmt.Println("extend:", errors.Is(lock.Extend(ctx, time.Minute), ticketing.ErrLockLost))
	// Output:
	// lost: server restarted
	// extend: true
}

// A dropped connection is not a lost lock: the client reconnects and resumes its session, and a
// queued Acquire keeps its place (the server keeps the session for its grace, 5s by default).
func Example_resume() {
	proxy, stop := startProxy() // a connection the example can cut
	defer stop()
	ctx := context.Background()
	holder, _ := ticketing.Dial(ctx, ticketing.WithEndpoints(addr))
	defer holder.Close()
	c, err := ticketing.Dial(ctx, ticketing.WithEndpoints(proxy.Addr))
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()

	held, _ := holder.Acquire(ctx, "example/resume", time.Minute)
	granted := make(chan *ticketing.Lock)
	go func() {
		lock, err := c.Acquire(ctx, "example/resume", time.Minute)
		if err != nil {
			log.Fatal(err)
		}
		granted <- lock
	}()
	for info, _ := holder.Inspect(ctx, "example/resume"); info.Waiters == 0; info, _ = holder.Inspect(ctx, "example/resume") {
		time.Sleep(time.Millisecond) // until the Acquire is queued
	}
	proxy.DropConns() // the connection drops while the Acquire waits

	held.Release(ctx)
	lock := <-granted
	fmt.Println("granted after the reconnect, token above the holder's:", lock.Token() > held.Token())
	lock.Release(ctx)
	// Output: granted after the reconnect, token above the holder's: true
}

// Helpers that start servers of the examples' own (TICKETING_BIN names the binary).

func startServer(cfg testserver.Config) (string, func()) {
	cfg.Bin = os.Getenv("TICKETING_BIN")
	srv, err := testserver.StartProcess(cfg)
	if err != nil {
		log.Fatal(err)
	}
	return srv.Addr, func() { srv.Stop(); os.RemoveAll(srv.DataDir) }
}

func startTLSServer() (*testserver.TLSFiles, string, func()) {
	dir, err := os.MkdirTemp("", "ticketing-example-tls-")
	if err != nil {
		log.Fatal(err)
	}
	files, err := testserver.GenerateTLS(dir)
	if err != nil {
		log.Fatal(err)
	}
	addr, stop := startServer(testserver.Config{TLSCert: files.ServerCert, TLSKey: files.ServerKey, TLSClientCA: files.ClientCA})
	return files, addr, func() { stop(); os.RemoveAll(dir) }
}

func startRestartableServer() (*testserver.Server, func()) {
	srv, err := testserver.StartProcess(testserver.Config{Bin: os.Getenv("TICKETING_BIN"), Env: []string{"TICKETING_STARTUP_GRACE=0"}})
	if err != nil {
		log.Fatal(err)
	}
	return srv, func() { srv.Stop(); os.RemoveAll(srv.DataDir) }
}

func startProxy() (*testserver.Proxy, func()) {
	p, err := testserver.StartProxy(addr)
	if err != nil {
		log.Fatal(err)
	}
	return p, p.Close
}
