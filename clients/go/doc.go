// Package ticketing is the Go client of Ticketing, a distributed lock server: FIFO queues per
// key, fencing tokens, leases, and a lost signal.
//
//	c, err := ticketing.Dial(ctx, ticketing.WithEndpoints("127.0.0.1:7070"), ticketing.WithToken(token))
//	if err != nil { ... }
//	defer c.Close()
//
//	lock, err := c.Acquire(ctx, "order-1234", 30*time.Second, ticketing.WithKeepAlive())
//	if err != nil { ... }
//	defer lock.Release(context.Background())
//	// Do the work; pass lock.Token() to the resource (fencing); stop when <-lock.Lost() fires.
//
// # Connections
//
// A Client holds one connection and multiplexes every call over it: requests are pipelined,
// answers are matched by request id, and requests from many goroutines are coalesced into single
// writes. If the connection fails, calls in flight return an error matching ErrConnectionLost
// (see IsRetryable) and the next call reconnects, trying the endpoints in order with backoff. A
// NOT_LEADER or SHUTTING_DOWN answer moves the client to the hinted leader or the next endpoint
// and the request is retried there.
//
// # Leases and the lost signal
//
// Every lock has a lease; the server takes the lock back when it runs out and hands it to the
// next waiter. The client keeps a local deadline for each lock, computed from when the request
// was sent, so it is never later than the server's. Lock.Lost is closed at the first of: the
// server's EXPIRED notice, the local deadline, or an Extend answered NOT_HELD. With
// WithKeepAlive the client extends the lease in the background until Release.
//
// # Cancellation
//
// Acquire waits in the server's queue until granted or until its context is done. A cancelled
// Acquire withdraws its request and, if the lock was granted meanwhile, releases it, so it never
// leaves a lock held.
package ticketing
