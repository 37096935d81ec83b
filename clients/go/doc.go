// Package ticketing is the Go client of Ticketing, a distributed lock server: a FIFO queue per
// key, fencing tokens, leases, and a lost signal.
//
//	c, err := ticketing.Dial(ctx, ticketing.WithEndpoints("127.0.0.1:7070"), ticketing.WithToken(token))
//	if err != nil { ... }
//	defer c.Close()
//
//	lock, err := c.Acquire(ctx, "order-1234", 30*time.Second, ticketing.WithKeepAlive())
//	if err != nil { ... }
//	defer lock.Release(ctx) // bounded by the request timeout
//	// Do the work; pass lock.Token() to the resource (fencing); stop when <-lock.Lost() fires.
//
// # Sessions and connections
//
// A Client is one session (a random 16-byte id) on one multiplexed connection: requests from
// any number of goroutines are pipelined and answered by request id. If the connection drops,
// the client reconnects in the background (the endpoints in order, a leader hint first, with
// backoff) and resumes the session: requests in flight are sent again with their original ids and
// answered without running twice, and a queued Acquire keeps its place. If the session cannot be
// resumed (the server ended it, or its grace passed), the calls in flight fail with
// ErrConnectionLost; if the server restarted (its state id changed), with ErrServerRestarted,
// and every held lock is lost.
//
// # Timeouts
//
// Every call is bounded: by its context, and by the request timeout (WithRequestTimeout, 10s by
// default), which counts the time waiting for a reconnect too but not the time an Acquire spends
// queued (bounded by its wait timeout, WithWaitTimeout, and the heartbeat instead). A heartbeat
// PING after 2s of silence detects a frozen server; Close is prompt.
//
// # Leases and the lost signal
//
// Every lock has a lease; the server takes the lock back when it runs out and hands it to the
// next waiter. The client keeps a local deadline for each lock, counted from when the request
// was first sent, plus the time the server says it queued, shortened by the clock-rate
// allowance, so it is never later than the server's; it runs on a clock that counts the time
// the machine is suspended (CLOCK_BOOTTIME on Linux).
// Lock.Lost is closed, once, at the first of: that deadline (a few ms early), the server's
// EXPIRED notice, a NOT_HELD answer to Extend or Release, or a reconnect to a restarted server;
// Lock.Err says why (a *LockLostError with a LostReason). WithKeepAlive extends the lease in the
// background until Release (WithMaxHold caps it).
//
// # Cancellation
//
// Acquire waits in the server's queue until granted, until its wait timeout, or until its
// context is done. A cancelled Acquire withdraws its request (CANCEL) and, if the lock was
// granted meanwhile, releases it, so it never leaves a lock held.
//
// # Closing
//
// Close does not release the locks the client holds (the server keeps them until their lease
// ends, as after a crash) unless WithReleaseOnClose was given.
package ticketing

// Version is the version of this client.
const Version = "0.1.0"
