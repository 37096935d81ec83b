package io.ticketing;

import io.ticketing.protocol.Bytes;
import io.ticketing.protocol.InspectFlag;
import io.ticketing.protocol.Op;
import io.ticketing.protocol.Protocol;
import io.ticketing.protocol.Status;
import java.nio.ByteBuffer;
import java.time.Duration;
import java.util.Optional;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.CompletionStage;
import java.util.concurrent.ScheduledFuture;
import java.util.concurrent.TimeUnit;
import java.util.function.Consumer;

/**
 * A held lock: its key, its fencing token, its lease, a local deadline and a lost signal.
 *
 * <p>Pass {@link #token()} to the resource you protect and have it reject any token lower than the
 * highest it has seen (fencing). Release with {@link #release()} or, best, try-with-resources:
 *
 * <pre>{@code
 * try (Lock lock = client.acquire("order-1234", Duration.ofSeconds(30))) {
 *     db.update(order, lock.token());
 * } // released here; raises LockLostException if the lock was lost meanwhile
 * }</pre>
 *
 * <p><b>Lost.</b> The lock is lost at the first of: its local deadline (the time queued plus the
 * lease, measured from when the acquire was first sent and slowed by the clock-rate bound, minus a
 * few milliseconds: never later than the server's; it counts time the host spends suspended), the
 * server's {@code EXPIRED} notice, a {@code NOT_HELD} answer to an extend or release, or a
 * reconnect to a restarted server. Then {@link #lost()} completes and every
 * {@link #onLost listener} runs, once, with the {@link LostReason}; never after a successful
 * release. Stop the work that needed the lock.
 *
 * <p>The owner is the token, not a thread: any thread may release or extend. Methods are safe for
 * concurrent use. Listeners and the {@link #lost()} stage run on the client's callback threads.
 */
public final class Lock implements AutoCloseable {
    private static final long RATE_NUM = 1_000_000L - 2L * Protocol.CLOCK_RATE_BOUND_PPM; // (1 - 2ρ) in ppm

    private final Engine engine;
    private final byte[] key;
    private final String keyText;
    private final long token;
    private final AcquireOptions options;
    private final long grantedAt;
    private final CompletableFuture<LostReason> lostFuture = new CompletableFuture<>();

    // guarded by this
    private long leaseMs;
    private long deadline; // on engine.clock
    private long extendId; // request id of the latest EXTEND whose OK set the deadline (0: none)
    private LostReason lostReason;
    private boolean released;
    private boolean detached;
    private CompletableFuture<Void> releasing;
    private boolean releasingDirect; // releasing completes on the reader thread (a blocking release)
    private ScheduledFuture<?> deadlineTimer;
    private ScheduledFuture<?> keepAliveTimer;

    /** {@code sentAt}: when the ACQUIRE was first sent, on the engine's clock. */
    Lock(Engine engine, byte[] key, String keyText, long token, long leaseMs, long queuedMs, long sentAt,
            AcquireOptions options) {
        this.engine = engine;
        this.key = key;
        this.keyText = keyText;
        this.token = token;
        this.leaseMs = leaseMs;
        this.options = options;
        this.grantedAt = System.nanoTime();
        this.deadline = sentAt + localNanos(queuedMs + leaseMs);
    }

    /** (ms) · (1 − 2ρ), in nanoseconds. */
    private static long localNanos(long ms) {
        return ms * RATE_NUM;
    }

    private static long marginNanos(long leaseMs) {
        return Math.min(TimeUnit.MILLISECONDS.toNanos(Protocol.LOST_MARGIN_MS), leaseMs * 100_000L);
    }

    /** Arms the deadline timer and the keep-alive; called once the lock is registered. */
    void start() {
        synchronized (this) {
            armDeadlineLocked();
            if (options.keepAlive()) {
                scheduleKeepAliveLocked();
            }
        }
    }

    /**
     * How close the deadline must be for its timer to be set. A farther one is left to the engine's
     * lost check ({@link Engine#register}: every {@link Protocol#LOST_CHECK_MS} while any lock is
     * held, on the same timer thread), which sets it once it comes this close: most locks are
     * released long before their deadline and never cost a timer entry (a schedule and a cancel on
     * the timer's queue). Four times the check's period: three checks come while the deadline is that
     * close, so even with one of them late (a loaded machine) the timer is set in time and fires
     * at the same moment as one set at once.
     */
    static final long ARM_AHEAD_NANOS = TimeUnit.MILLISECONDS.toNanos(4L * Protocol.LOST_CHECK_MS);

    /**
     * Sets the deadline timer again (cancelling any): at the deadline less the margin when that is
     * within {@link #ARM_AHEAD_NANOS}, else none until a lost check comes that close.
     */
    private void armDeadlineLocked() {
        if (deadlineTimer != null) {
            deadlineTimer.cancel(false);
            deadlineTimer = null;
        }
        long fireIn = deadline - marginNanos(leaseMs) - engine.clock.now();
        if (fireIn > ARM_AHEAD_NANOS) {
            return;
        }
        try {
            // On the monotonic clock, which stops during a suspend: Engine's lost check covers that.
            deadlineTimer = engine.timer.schedule(() -> checkDeadline(engine.clock.now(), true),
                    Math.max(0, fireIn), TimeUnit.NANOSECONDS);
        } catch (java.util.concurrent.RejectedExecutionException e) {
            deadlineTimer = null; // the client is closing
        }
    }

    // ---- accessors ----

    /** {@return the key as text (the string given to acquire, or the bytes decoded leniently)} */
    public String key() {
        return keyText;
    }

    /** {@return a copy of the key's bytes} */
    public byte[] keyBytes() {
        return key.clone();
    }

    byte[] keyBytesUnsafe() {
        return key;
    }

    /**
     * {@return the fencing token: larger than every token granted before it, on any key} It is an
     * unsigned 64-bit value; compare tokens with {@link Long#compareUnsigned(long, long)} (in
     * practice they stay below 2^63, where plain comparison agrees).
     */
    public long token() {
        return token;
    }

    /** {@return the lease last granted (by the acquire or the last successful extend)} */
    public synchronized Duration lease() {
        return Duration.ofMillis(leaseMs);
    }

    /** {@return the time left until the local deadline (zero or negative once it passed)} */
    public Duration timeLeft() {
        long now = checkDeadline();
        synchronized (this) {
            return Duration.ofNanos(deadline - now);
        }
    }

    /** {@return whether the lock is lost} */
    public boolean isLost() {
        checkDeadline();
        synchronized (this) {
            return lostReason != null;
        }
    }

    /** {@return whether the lock was released by this handle (or found gone by a release)} */
    public synchronized boolean isReleased() {
        return released;
    }

    /** {@return why the lock was lost, or empty while it is not} */
    public Optional<LostReason> lostReason() {
        checkDeadline();
        synchronized (this) {
            return Optional.ofNullable(lostReason);
        }
    }

    /**
     * {@return a stage that completes with the reason when the lock is lost; it never completes for
     * a lock released first}
     */
    public CompletionStage<LostReason> lost() {
        return lostFuture.minimalCompletionStage();
    }

    /**
     * Runs the listener once when the lock is lost (at once, on a callback thread, if it already
     * is). Never after a successful release.
     *
     * @param listener receives the reason
     * @return this lock
     */
    public Lock onLost(Consumer<LostReason> listener) {
        lostFuture.thenAcceptAsync(listener, engine.callbackExecutor());
        return this;
    }

    // ---- operations ----

    /**
     * Releases the lock and waits for the answer; the next waiter gets it at once. Releasing again
     * does nothing.
     *
     * <p>A lock already known to be lost (its lost signal fired, or its deadline has passed) is not
     * waited for: this throws {@link LockLostException} with the reason at once, whether or not the
     * server can be reached, and tells the server in the background (it may not have reclaimed the
     * lock yet, so the next waiter need not wait for the lease), unless the lock was lost to a
     * restarted server or a {@code NOT_HELD} answer: then nothing is left to release.
     *
     * @throws LockLostException when the lock was lost (earlier, or the server answers NOT_HELD)
     * @throws TicketingException for a timeout, a closed client, a lost connection...
     */
    public void release() {
        // This thread only waits on the future: completed with no hop through the callback threads.
        TicketingClient.await(engine, releaseAsync(false, true, true), "release of ", key);
    }

    /**
     * Releases the lock asynchronously; see {@link #release()}.
     *
     * @return a future that completes when the server answered
     */
    public CompletableFuture<Void> releaseAsync() {
        return releaseAsync(false);
    }

    /** Releases; {@code internal} lets the client's own clean-up run while it closes. */
    CompletableFuture<Void> releaseAsync(boolean internal) {
        return releaseAsync(internal, false, false);
    }

    /**
     * As {@link #releaseAsync()}, the future completed in the thread that handles the answer (for
     * the Kotlin module, which only resumes a coroutine's dispatcher from there).
     */
    CompletableFuture<Void> releaseDirect() {
        return releaseAsync(false, true, false);
    }

    /** The callback threads of the client that granted this lock. */
    java.util.concurrent.Executor callbackExecutor() {
        return engine.callbackExecutor();
    }

    /**
     * {@code direct}: the result is completed in the thread that handles the answer, for a caller
     * that only waits on it (never for a future the application gets: its stages must not run on
     * the client's I/O threads). {@code awaited}: a thread blocks on it in {@link Engine#await}
     * (and reads for it).
     */
    private CompletableFuture<Void> releaseAsync(boolean internal, boolean direct, boolean awaited) {
        LostReason lostBefore;
        CompletableFuture<Void> result = new CompletableFuture<>();
        checkDeadline();
        synchronized (this) {
            if (released) {
                return CompletableFuture.completedFuture(null);
            }
            if (releasing != null) {
                if (releasingDirect && !direct) {
                    // The release in progress completes on the reader: the application's stages
                    // get their own future, completed on a callback thread.
                    CompletableFuture<Void> shared = releasing;
                    CompletableFuture<Void> out = new CompletableFuture<>();
                    shared.whenComplete((v, x) -> engine.callbackExecutor().execute(() -> {
                        if (x == null) {
                            out.complete(null);
                        } else {
                            out.completeExceptionally(TicketingClient.unwrap(x));
                        }
                    }));
                    return out;
                }
                return releasing;
            }
            lostBefore = lostReason;
            stopKeepAliveLocked();
            if (lostBefore != null) {
                // Known lost: answer at once (never wait for a server that may be unreachable);
                // the server is told in the background.
                released = true;
                cancelTimersLocked();
            } else {
                releasing = result;
                releasingDirect = direct;
            }
        }
        if (lostBefore != null) {
            engine.unregister(this);
            if (lostBefore != LostReason.SERVER_RESTARTED && lostBefore != LostReason.NOT_HELD) {
                engine.releaseInBackground(key, token);
            }
            return CompletableFuture.failedFuture(lost(lostBefore));
        }
        Req req = Req.ofLock(Op.RELEASE, key, token, 0, internal);
        req.awaited = awaited;
        engine.submit(req).whenComplete((f, ex) -> {
            TicketingException error = null;
            if (ex != null && TicketingClient.unwrap(ex) instanceof ServerRestartedException) {
                // The server that granted the lock is gone with it: nothing is left to release.
                markLost(LostReason.SERVER_RESTARTED);
                finishRelease();
                error = lost(lostReasonOr(LostReason.SERVER_RESTARTED));
            } else if (ex != null) {
                error = TicketingClient.unwrap(ex);
                synchronized (this) {
                    releasing = null; // may be retried
                }
            } else if (f.status() == Status.OK.code()) {
                finishRelease();
            } else if (f.status() == Status.NOT_HELD.code()) {
                markLost(LostReason.NOT_HELD);
                finishRelease();
                // (a restart found while the release was on its way is the better reason)
                error = lost(lostReasonOr(LostReason.NOT_HELD));
            } else {
                synchronized (this) {
                    releasing = null;
                }
                error = TicketingClient.statusError(f, "release of " + describe(), key);
            }
            TicketingException e = error;
            Runnable complete = () -> {
                if (e == null) {
                    result.complete(null);
                } else {
                    result.completeExceptionally(e);
                }
            };
            if (direct) {
                complete.run();
            } else {
                engine.callbackExecutor().execute(complete);
            }
        });
        return result;
    }

    private void finishRelease() {
        synchronized (this) {
            released = true;
            cancelTimersLocked();
        }
        engine.unregister(this);
    }

    /**
     * Sets the lease to {@code lease} from now (it may shorten it) and moves the local deadline,
     * unless the answer to a later extend of this lock came first (the server applies extends in the
     * order they were sent).
     *
     * @param lease the new lease, at least 1 ms
     * @return the lease the server granted
     * @throws LockLostException when the lock is lost, or the server answers NOT_HELD
     * @throws InvalidArgumentException for a lease out of range
     */
    public Duration extend(Duration lease) {
        return TicketingClient.await(extendAsync(lease), "extend of " + Bytes.forMessage(key));
    }

    /**
     * Extends the lease asynchronously; see {@link #extend(Duration)}.
     *
     * @param lease the new lease
     * @return a future with the lease the server granted
     */
    public CompletableFuture<Duration> extendAsync(Duration lease) {
        long ms;
        try {
            ms = AcquireOptions.leaseMillis(lease);
        } catch (InvalidArgumentException e) {
            return CompletableFuture.failedFuture(e);
        }
        CompletableFuture<Duration> result = new CompletableFuture<>();
        extendInternal(ms).whenComplete((d, ex) -> engine.callbackExecutor().execute(() -> {
            if (ex != null) {
                result.completeExceptionally(TicketingClient.unwrap(ex));
            } else {
                result.complete(d);
            }
        }));
        return result;
    }

    private CompletableFuture<Duration> extendInternal(long ms) {
        checkDeadline();
        synchronized (this) {
            if (lostReason != null) {
                return CompletableFuture.failedFuture(lost(lostReason));
            }
            if (released || releasing != null) {
                return CompletableFuture.failedFuture(new NotHeldException(describe() + " was released"));
            }
        }
        Req r = Req.ofLock(Op.EXTEND, key, token, ms, false);
        return engine.submit(r).thenApply(f -> {
            if (f.status() == Status.OK.code()) {
                synchronized (this) {
                    if (lostReason != null) {
                        throw lost(lostReason);
                    }
                    // The server applies extends in id order: an older one's answer, read after a
                    // newer one's, must not move the deadline (even when its lease is longer).
                    if (Long.compareUnsigned(r.id, extendId) > 0) {
                        extendId = r.id;
                        leaseMs = f.leaseMs();
                        deadline = r.firstSent + localNanos(f.leaseMs());
                        armDeadlineLocked();
                    }
                }
                return Duration.ofMillis(f.leaseMs());
            }
            if (f.status() == Status.NOT_HELD.code()) {
                markLost(LostReason.NOT_HELD);
                throw lost(lostReasonOr(LostReason.NOT_HELD));
            }
            throw TicketingClient.statusError(f, "extend of " + describe(), key);
        });
    }

    private synchronized LostReason lostReasonOr(LostReason r) {
        return lostReason != null ? lostReason : r;
    }

    /**
     * Asks the server whether this token still holds the key ({@code INSPECT} with the token).
     *
     * @return true when the server says this lock holds the key
     */
    public boolean verify() {
        return TicketingClient.await(verifyAsync(), "verify of " + Bytes.forMessage(key));
    }

    /**
     * Asks the server asynchronously; see {@link #verify()}.
     *
     * @return a future with the answer
     */
    public CompletableFuture<Boolean> verifyAsync() {
        CompletableFuture<Boolean> result = new CompletableFuture<>();
        engine.submit(Req.ofLock(Op.INSPECT, key, token, 0, false)).whenComplete((f, ex) ->
                engine.callbackExecutor().execute(() -> {
                    if (ex != null) {
                        result.completeExceptionally(TicketingClient.unwrap(ex));
                    } else if (f.status() != Status.OK.code()) {
                        result.completeExceptionally(TicketingClient.statusError(f, "verify of " + describe(), key));
                    } else {
                        long flags = f.data().length >= 12 ? ByteBuffer.wrap(f.data()).getInt(8) & 0xFFFF_FFFFL : 0;
                        result.complete(InspectFlag.TOKEN_MATCH.isSet(flags) && f.token() == token);
                    }
                }));
        return result;
    }

    /**
     * Releases the lock (try-with-resources). When the lock was lost while held it raises
     * {@link LockLostException} naming the reason at once (the server is told in the background), unless the acquire set
     * {@link AcquireOptions.Builder#throwOnLost(boolean) throwOnLost(false)}. Closing a released
     * lock does nothing.
     */
    @Override
    public void close() {
        try {
            release();
        } catch (LockLostException e) {
            if (options.throwOnLost()) {
                throw e;
            }
        }
    }

    // ---- lost ----

    /** Fires lost now if the deadline has passed on the clock; returns the clock's reading. */
    private long checkDeadline() {
        long now = engine.clock.nowChecked();
        checkDeadline(now, false);
        return now;
    }

    /**
     * Fires lost if the deadline (less the margin) is at or before {@code now}; else, with
     * {@code rearm} (the clock has counted suspend time the timer did not), sets the timer again,
     * and without it sets the timer if none is set and the deadline has come close (the engine's
     * lost check: {@link #ARM_AHEAD_NANOS}).
     */
    void checkDeadline(long now, boolean rearm) {
        synchronized (this) {
            if (lostReason != null || released || detached) {
                return;
            }
            long due = deadline - marginNanos(leaseMs);
            if (now < due) {
                if (rearm || (deadlineTimer == null && due - now <= ARM_AHEAD_NANOS)) {
                    armDeadlineLocked();
                }
                return;
            }
            lostReason = LostReason.EXPIRED;
            cancelTimersLocked();
        }
        signalLost(LostReason.EXPIRED);
    }

    /** Marks the lock lost (once; never after a release) and fires the signal. */
    void markLost(LostReason reason) {
        synchronized (this) {
            if (lostReason != null || released || detached) {
                return;
            }
            lostReason = reason;
            cancelTimersLocked();
        }
        signalLost(reason);
    }

    private void signalLost(LostReason reason) {
        engine.unregister(this);
        engine.callbackExecutor().execute(() -> lostFuture.complete(reason));
    }

    /** The client closed: no timer fires any more. */
    void detach() {
        synchronized (this) {
            detached = true;
            cancelTimersLocked();
        }
    }

    private void cancelTimersLocked() {
        if (deadlineTimer != null) {
            deadlineTimer.cancel(false);
            deadlineTimer = null;
        }
        stopKeepAliveLocked();
    }

    private void stopKeepAliveLocked() {
        if (keepAliveTimer != null) {
            keepAliveTimer.cancel(false);
            keepAliveTimer = null;
        }
    }

    private LockLostException lost(LostReason reason) {
        return new LockLostException(describe() + " was lost: " + reason, reason);
    }

    String describe() {
        return "lock on " + Bytes.forMessage(key) + " (token " + Long.toUnsignedString(token) + ")";
    }

    // ---- keep-alive ----

    private void scheduleKeepAliveLocked() {
        long every = Math.max(1, leaseMs / 3);
        try {
            keepAliveTimer = engine.timer.schedule(this::keepAliveTick, every, TimeUnit.MILLISECONDS);
        } catch (java.util.concurrent.RejectedExecutionException e) {
            keepAliveTimer = null;
        }
    }

    private void keepAliveTick() {
        long ms;
        synchronized (this) {
            keepAliveTimer = null;
            if (lostReason != null || released || releasing != null || detached) {
                return;
            }
            Duration maxHold = options.maxHold();
            if (maxHold != null && System.nanoTime() - grantedAt >= maxHold.toNanos()) {
                return; // the cap: the lock now runs out its lease
            }
            ms = leaseMs;
        }
        extendInternal(ms).whenComplete((d, ex) -> {
            if (ex != null && TicketingClient.unwrap(ex) instanceof LockLostException) {
                return;
            }
            synchronized (this) {
                if (lostReason == null && !released && releasing == null && !detached && keepAliveTimer == null) {
                    scheduleKeepAliveLocked();
                }
            }
        });
    }

    @Override
    public String toString() {
        synchronized (this) {
            return "Lock{key=" + Bytes.forMessage(key) + ", token=" + Long.toUnsignedString(token) + ", lease="
                    + leaseMs + "ms" + (lostReason != null ? ", lost=" + lostReason : "")
                    + (released ? ", released" : "") + "}";
        }
    }
}
