package ticketing_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"sync"
	"time"

	ticketing "github.com/ticketing/ticketing/clients/go"
)

// The examples run against the test server that TestMain starts; addr is its address.

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
	fmt.Println("acquired", lock.Key(), "with a fencing token:", lock.Token() > 0)
	// ... work, passing lock.Token() to the resource ...
	if err := lock.Release(ctx); err != nil {
		log.Fatal(err)
	}
	fmt.Println("released")
	// Output:
	// acquired example/order-1234 with a fencing token: true
	// released
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

// TryAcquire does not wait: a taken key answers ErrNotAcquired.
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
	_, err = c.TryAcquire(ctx, "example/try", time.Minute)
	fmt.Println("second try:", errors.Is(err, ticketing.ErrNotAcquired))
	first.Release(ctx)
	// Output: second try: true
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
	fmt.Println(err)

	holder.Release(ctx)
	lock, err := c.TryAcquire(ctx, "example/busy", time.Minute) // free at once
	fmt.Println("free after release:", err == nil)
	lock.Release(ctx)
	// Output:
	// context deadline exceeded
	// free after release: true
}

// The lost signal: without keep-alive the lease runs out and Lost closes.
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
	fmt.Println("lost:", errors.Is(lock.Err(), ticketing.ErrLockLost))
	fmt.Println("release:", errors.Is(lock.Release(ctx), ticketing.ErrLockLost))
	// Output:
	// lost: true
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

// fencedStore stands for the resource: in SQL, UPDATE ... WHERE fence_token < $token.
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
