package io.ticketing;

import io.ticketing.protocol.BusyLimit;
import io.ticketing.protocol.Bytes;
import io.ticketing.protocol.InvalidField;
import io.ticketing.protocol.Op;
import io.ticketing.protocol.ResponseFrame;
import io.ticketing.protocol.Status;
import java.nio.ByteBuffer;
import java.nio.charset.StandardCharsets;
import java.time.Duration;
import java.util.Optional;
import java.util.concurrent.CancellationException;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.CompletionException;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.ExecutionException;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.TimeoutException;

/**
 * A Ticketing client: one session on one multiplexed connection, safe for concurrent use by any
 * number of threads. Create one per process and share it.
 *
 * <pre>{@code
 * try (TicketingClient client = TicketingClient.connect(ClientOptions.create())) {
 *     try (Lock lock = client.acquire("order-1234", Duration.ofSeconds(30))) {
 *         store.write(order, lock.token()); // the store rejects tokens below the highest it saw
 *     }
 * }
 * }</pre>
 *
 * <p>Every operation has a blocking form and an {@code ...Async} form returning a
 * {@link CompletableFuture}. Cancelling an acquire's future (or interrupting a thread blocked in
 * {@link #acquire}) withdraws the wait from the server's queue, and a grant that raced the
 * cancellation is released: a cancelled acquire never leaves a lock held. Futures complete on the
 * client's callback threads, never on its I/O threads, so dependent stages may block.
 *
 * <p>The connection is replaced by itself when it drops: requests wait for the reconnect (bounded
 * by their timeouts) and unanswered ones are re-sent under their original ids, so a retried acquire
 * keeps its queue place and is never granted twice. Closing the client does not release its locks
 * unless {@link ClientOptions.Builder#releaseOnClose(boolean)} is set: the server keeps them until
 * their leases end.
 */
public final class TicketingClient implements AutoCloseable {
    private final Engine engine;
    /** The holds taken through {@link DistributedLock}, by owning thread and key. */
    final ConcurrentHashMap<DistributedLock.Owner, Lock> javaLockHolds = new ConcurrentHashMap<>();

    static {
        // The Kotlin module's access (io.ticketing.internal.Bridge): futures completed where the
        // answer is handled, which it only ever resumes a coroutine's dispatcher from.
        io.ticketing.internal.Bridge.install(new io.ticketing.internal.Bridge.Ops() {
            @Override
            public CompletableFuture<Lock> acquire(TicketingClient client, String key, AcquireOptions options) {
                try {
                    return client.start(keyBytes(key), key, options, true, false).lock;
                } catch (TicketingException e) {
                    return CompletableFuture.failedFuture(e);
                }
            }

            @Override
            public CompletableFuture<Lock> acquire(TicketingClient client, byte[] key, AcquireOptions options) {
                try {
                    byte[] k = keyBytes(key);
                    return client.start(k, Bytes.printable(k), options, true, false).lock;
                } catch (TicketingException e) {
                    return CompletableFuture.failedFuture(e);
                }
            }

            @Override
            public CompletableFuture<Void> release(Lock lock) {
                return lock.releaseDirect();
            }

            @Override
            public java.util.concurrent.Executor callbacks(TicketingClient client) {
                return client.engine.callbackExecutor();
            }

            @Override
            public java.util.concurrent.Executor callbacks(Lock lock) {
                return lock.callbackExecutor();
            }
        });
    }

    private TicketingClient(Engine engine) {
        this.engine = engine;
    }

    /**
     * Connects with every default: {@code 127.0.0.1:7070}, no token, no TLS.
     *
     * @return the connected client
     * @throws UnavailableException when the server cannot be reached
     */
    public static TicketingClient connect() {
        return connect(ClientOptions.create());
    }

    /**
     * Connects to the first endpoint that answers (following a cluster's leader hint), within the
     * connect timeout per endpoint. A round in which no endpoint could be connected to fails at
     * once, unless a node answered "not the leader" (a cluster electing a leader): then the connect
     * tries again, at the shortest reconnect backoff, until the request timeout has passed since it
     * began (then it throws the last round's {@link UnavailableException}) or the thread is
     * interrupted ({@link CancelledException}).
     *
     * @param options the settings
     * @return the connected client
     * @throws UnavailableException when no endpoint can be reached
     * @throws AuthFailedException when the token is refused, missing, or not needed
     * @throws TlsException when the TLS handshake fails
     * @throws UnsupportedVersionException when the server speaks another protocol version
     * @throws CancelledException when the thread is interrupted while the cluster elects a leader
     */
    public static TicketingClient connect(ClientOptions options) {
        return connect(options, SuspendClock.SYSTEM);
    }

    /** Connects with the given deadline clock (a test's). */
    static TicketingClient connect(ClientOptions options, SuspendClock clock) {
        Engine engine = new Engine(options == null ? ClientOptions.create() : options, clock);
        try {
            engine.start();
        } catch (RuntimeException e) {
            engine.close();
            throw e;
        }
        return new TicketingClient(engine);
    }

    /**
     * Connects on a background thread; see {@link #connect(ClientOptions)}. Cancelling the future
     * interrupts that thread: a connect still waiting for a cluster to elect a leader stops, and a
     * client that connected anyway is closed.
     *
     * @param options the settings
     * @return a future with the connected client
     */
    public static CompletableFuture<TicketingClient> connectAsync(ClientOptions options) {
        CompletableFuture<TicketingClient> f = new CompletableFuture<>();
        Thread t = new Thread(() -> {
            try {
                TicketingClient c = connect(options);
                if (!f.complete(c)) {
                    c.close(); // cancelled meanwhile
                }
            } catch (RuntimeException e) {
                f.completeExceptionally(e);
            }
        }, "ticketing-connect");
        t.setDaemon(true);
        f.whenComplete((c, e) -> {
            if (f.isCancelled()) {
                t.interrupt();
            }
        });
        t.start();
        return f;
    }

    /**
     * Returns this library's version, as published ({@code 0.3.0}); "unknown" when the classes were
     * not built by its Maven build.
     *
     * @return the version
     */
    public static String version() {
        try (java.io.InputStream in = TicketingClient.class.getResourceAsStream("version.properties")) {
            if (in == null) {
                return "unknown";
            }
            java.util.Properties p = new java.util.Properties();
            p.load(in);
            return p.getProperty("version", "unknown");
        } catch (java.io.IOException e) {
            return "unknown";
        }
    }

    /** {@return this client's settings} */
    public ClientOptions options() {
        return engine.opts;
    }

    /** The engine (tests look at its connection). */
    Engine engine() {
        return engine;
    }

    /** {@return the session id (32 hex digits): new per client, the same on every reconnect} */
    public String sessionId() {
        return engine.sessionIdHex();
    }

    // ---- java.util.concurrent.locks.Lock ----

    /**
     * Returns the key as a {@link java.util.concurrent.locks.Lock} whose grants have this lease and
     * keep-alive on (extended every lease/3 while held, like Redisson's watchdog): see
     * {@link DistributedLock} (thread-owned, not reentrant, fencing token). Nothing is sent until it
     * is locked.
     *
     * @param key a non-empty key of at most 65,535 UTF-8 bytes
     * @param lease the lease of each grant, renewed while held; a crashed holder loses the lock
     *     within it
     * @return the lock view of {@code key}
     * @throws InvalidArgumentException for a bad key or lease
     */
    public DistributedLock distributedLock(String key, Duration lease) {
        return new DistributedLock(this, key, AcquireOptions.builder(lease).keepAlive(true).build());
    }

    /**
     * Returns the key as a {@link java.util.concurrent.locks.Lock} whose grants use these options
     * (lease, keep-alive, max hold, refuse-held, throw-on-lost; their wait timeout is not used): see
     * {@link DistributedLock}.
     *
     * @param key a non-empty key of at most 65,535 UTF-8 bytes
     * @param options the options of each grant
     * @return the lock view of {@code key}
     * @throws InvalidArgumentException for a bad key
     */
    public DistributedLock distributedLock(String key, AcquireOptions options) {
        return new DistributedLock(this, key, options);
    }

    // ---- acquire ----

    /**
     * Acquires the lock on {@code key}, waiting in the key's FIFO queue without limit.
     *
     * @param key a non-empty key of at most 65,535 UTF-8 bytes
     * @param lease how long the lock is held unless released or extended; starts at the grant
     * @return the held lock
     * @throws InvalidArgumentException for a bad key or lease (nothing is sent)
     * @throws CancelledException when the thread is interrupted (the wait is withdrawn)
     */
    public Lock acquire(String key, Duration lease) {
        return acquire(key, AcquireOptions.builder(lease).build());
    }

    /**
     * Acquires the lock on {@code key}, waiting at most {@code waitTimeout}.
     *
     * @param key the key
     * @param lease the lease
     * @param waitTimeout {@link Duration#ZERO} to try once, {@link AcquireOptions#WAIT_FOREVER} for no limit
     * @return the held lock
     * @throws NotAcquiredException when the wait timeout passed (nothing is held)
     */
    public Lock acquire(String key, Duration lease, Duration waitTimeout) {
        return acquire(key, AcquireOptions.of(lease, waitTimeout));
    }

    /**
     * Acquires the lock on {@code key} with these options.
     *
     * @param key the key
     * @param options lease, wait timeout, keep-alive...
     * @return the held lock
     * @throws NotAcquiredException when the wait timeout passed (nothing is held)
     * @throws AlreadyHeldException with refuse-held, when this client holds the key
     */
    public Lock acquire(String key, AcquireOptions options) {
        return acquire(keyBytes(key), key, options);
    }

    /**
     * Acquires the lock on a binary key with these options.
     *
     * @param key the key's bytes, 1 to 65,535 of them
     * @param options lease, wait timeout, keep-alive...
     * @return the held lock
     */
    public Lock acquire(byte[] key, AcquireOptions options) {
        byte[] k = keyBytes(key);
        return acquire(k, Bytes.printable(k), options);
    }

    private Lock acquire(byte[] key, String text, AcquireOptions options) {
        // The future is this thread's alone (nothing else can chain on it): it is completed where
        // the answer is handled, with no hop through the callback threads.
        Pending p = start(key, text, options, true, true);
        try {
            return engine.await(p.lock);
        } catch (InterruptedException e) {
            // Wait (bounded) for the withdrawal, so the caller may retry at once; then keep the flag.
            // The grant may have completed the future after the wait saw the interrupt (a
            // CompletableFuture's get throws InterruptedException even when the result came right
            // after it looked): cancel then fails, and nobody will use that lock, so it is given
            // back here (a cancelled acquire never leaves a lock held).
            CompletableFuture<?> cleanup = p.req.settled;
            if (!p.lock.cancel(false) && !p.lock.isCompletedExceptionally()) {
                cleanup = p.lock.join().releaseAsync();
            }
            try {
                cleanup.get(engine.opts.cleanupTimeout().toNanos(), TimeUnit.NANOSECONDS);
            } catch (InterruptedException | ExecutionException | TimeoutException ignored) {
                // the clean-up goes on in the background
            } finally {
                Thread.currentThread().interrupt();
            }
            throw new CancelledException("acquire of " + Bytes.forMessage(key) + " interrupted; the wait was withdrawn");
        } catch (ExecutionException e) {
            throw rethrow(e.getCause());
        } catch (CancellationException e) {
            throw new CancelledException("acquire of " + Bytes.forMessage(key) + " was cancelled");
        }
    }

    /**
     * Acquires asynchronously, waiting in the queue without limit. Cancelling the future withdraws
     * the wait.
     *
     * @param key the key
     * @param lease the lease
     * @return a future with the held lock
     */
    public CompletableFuture<Lock> acquireAsync(String key, Duration lease) {
        return acquireAsync(key, AcquireOptions.builder(lease).build());
    }

    /**
     * Acquires asynchronously, waiting at most {@code waitTimeout}.
     *
     * @param key the key
     * @param lease the lease
     * @param waitTimeout the wait timeout
     * @return a future with the held lock, failing with {@link NotAcquiredException} on timeout
     */
    public CompletableFuture<Lock> acquireAsync(String key, Duration lease, Duration waitTimeout) {
        return acquireAsync(key, AcquireOptions.of(lease, waitTimeout));
    }

    /**
     * Acquires asynchronously with these options. Cancelling the future withdraws the wait (a
     * {@code CANCEL} to the server) and releases a grant that raced the cancellation.
     *
     * @param key the key
     * @param options the options
     * @return a future with the held lock
     */
    public CompletableFuture<Lock> acquireAsync(String key, AcquireOptions options) {
        try {
            return start(keyBytes(key), key, options, false, false).lock;
        } catch (TicketingException e) {
            return CompletableFuture.failedFuture(e);
        }
    }

    /**
     * Acquires a binary key asynchronously; see {@link #acquireAsync(String, AcquireOptions)}.
     *
     * @param key the key's bytes
     * @param options the options
     * @return a future with the held lock
     */
    public CompletableFuture<Lock> acquireAsync(byte[] key, AcquireOptions options) {
        try {
            byte[] k = keyBytes(key);
            return start(k, Bytes.printable(k), options, false, false).lock;
        } catch (TicketingException e) {
            return CompletableFuture.failedFuture(e);
        }
    }

    /**
     * Tries once to acquire the lock (wait 0): an empty result when the key is taken.
     *
     * @param key the key
     * @param lease the lease
     * @return the lock, or empty when not acquired
     */
    public Optional<Lock> tryAcquire(String key, Duration lease) {
        return tryAcquire(key, AcquireOptions.of(lease, Duration.ZERO));
    }

    /**
     * Tries to acquire the lock within {@code waitTimeout} (Redisson's {@code tryLock(wait, lease)}):
     * an empty result when the wait timeout passes.
     *
     * @param key the key
     * @param lease the lease
     * @param waitTimeout the wait timeout
     * @return the lock, or empty when not acquired
     */
    public Optional<Lock> tryAcquire(String key, Duration lease, Duration waitTimeout) {
        return tryAcquire(key, AcquireOptions.of(lease, waitTimeout));
    }

    /**
     * Tries to acquire the lock with these options: an empty result instead of
     * {@link NotAcquiredException}.
     *
     * @param key the key
     * @param options the options (their wait timeout applies)
     * @return the lock, or empty when not acquired
     */
    public Optional<Lock> tryAcquire(String key, AcquireOptions options) {
        try {
            return Optional.of(acquire(key, options));
        } catch (NotAcquiredException e) {
            return Optional.empty();
        }
    }

    /**
     * Tries to acquire a binary key; see {@link #tryAcquire(String, AcquireOptions)}.
     *
     * @param key the key's bytes
     * @param options the options
     * @return the lock, or empty when not acquired
     */
    public Optional<Lock> tryAcquire(byte[] key, AcquireOptions options) {
        try {
            return Optional.of(acquire(key, options));
        } catch (NotAcquiredException e) {
            return Optional.empty();
        }
    }

    /**
     * Tries once asynchronously; the future holds an empty result when the key is taken.
     *
     * @param key the key
     * @param lease the lease
     * @return a future with the lock, or empty
     */
    public CompletableFuture<Optional<Lock>> tryAcquireAsync(String key, Duration lease) {
        return tryAcquireAsync(key, AcquireOptions.of(lease, Duration.ZERO));
    }

    /**
     * Tries asynchronously with these options; the future holds an empty result when not acquired.
     *
     * @param key the key
     * @param options the options
     * @return a future with the lock, or empty
     */
    public CompletableFuture<Optional<Lock>> tryAcquireAsync(String key, AcquireOptions options) {
        return optional(acquireAsync(key, options));
    }

    /**
     * Tries a binary key asynchronously; see {@link #tryAcquireAsync(String, AcquireOptions)}.
     *
     * @param key the key's bytes
     * @param options the options
     * @return a future with the lock, or empty
     */
    public CompletableFuture<Optional<Lock>> tryAcquireAsync(byte[] key, AcquireOptions options) {
        return optional(acquireAsync(key, options));
    }

    private static CompletableFuture<Optional<Lock>> optional(CompletableFuture<Lock> f) {
        CompletableFuture<Optional<Lock>> out = f.handle((l, e) -> {
            if (e == null) {
                return Optional.of(l);
            }
            Throwable t = e instanceof CompletionException && e.getCause() != null ? e.getCause() : e;
            if (t instanceof NotAcquiredException) {
                return Optional.empty();
            }
            throw t instanceof RuntimeException re ? re : new CompletionException(t);
        });
        out.whenComplete((v, e) -> {
            if (e instanceof CancellationException) {
                f.cancel(false);
            }
        });
        return out;
    }

    /** An acquire in flight: its request and the caller's future. */
    private record Pending(Req req, CompletableFuture<Lock> lock) {
    }

    /**
     * Sends an ACQUIRE. {@code direct}: the returned future is completed in the thread that handles
     * the answer (the reader), for a caller that only waits on it; otherwise on a callback thread,
     * so that the application's dependent stages never run on the client's I/O threads.
     * {@code awaited}: a thread blocks on it in {@link Engine#await} (and reads for it).
     */
    private Pending start(byte[] key, String text, AcquireOptions options, boolean direct, boolean awaited) {
        if (options == null) {
            throw new InvalidArgumentException("acquire options are required (AcquireOptions.builder(lease))");
        }
        // (The key as messages show it is built only for a message: not on the path of every call.)
        if (options.refuseHeld() && engine.holds(key)) {
            throw new AlreadyHeldException("this client already holds " + Bytes.forMessage(key) + " (refuseHeld)");
        }
        Req r = new Req(Op.ACQUIRE, key, 0, options.leaseMs(), options.waitMs(), false);
        r.awaited = awaited;
        java.util.concurrent.Executor deliver = direct ? Runnable::run : engine.callbackExecutor();
        CompletableFuture<Lock> user = new CompletableFuture<>();
        user.whenComplete((v, e) -> {
            if (e instanceof CancellationException) {
                engine.abandon(r, new CancelledException("acquire of " + Bytes.forMessage(key) + " was cancelled"));
            }
        });
        engine.submit(r).whenComplete((f, ex) -> {
            if (ex != null) {
                TicketingException t = unwrap(ex);
                deliver.execute(() -> user.completeExceptionally(t));
                return;
            }
            if (f.status() != Status.OK.code()) {
                String shown = Bytes.forMessage(key);
                TicketingException t = f.status() == Status.TIMED_OUT.code()
                        ? notAcquired(f, shown, options.waitMs())
                        : f.status() == Status.NOT_HELD.code()
                                ? new ConnectionLostException("acquire of " + shown + " was interrupted by a lost "
                                        + "connection and the server holds nothing for it; acquire again")
                                : statusError(f, "acquire of " + shown, key);
                deliver.execute(() -> user.completeExceptionally(t));
                return;
            }
            Lock lock;
            try {
                lock = adopt(key, text, r, f, options);
            } catch (TicketingException t) {
                deliver.execute(() -> user.completeExceptionally(t));
                return;
            }
            deliver.execute(() -> {
                if (!user.complete(lock)) {
                    lock.releaseAsync(); // cancelled meanwhile: give the grant back
                }
            });
        });
        return new Pending(r, user);
    }

    /**
     * Turns an acquire's grant into a held lock, unless the client closed or the server restarted
     * between the answer and this completion (it runs after the answer, so either may come first).
     */
    Lock adopt(byte[] key, String text, Req r, ResponseFrame f, AcquireOptions options) {
        Lock lock = new Lock(engine, key, text, f.token(), f.leaseMs(), f.detail(), r.firstSent, options);
        switch (engine.register(lock, r.generation)) {
            case CLOSED -> {
                // close() took its list of held locks before this grant was adopted: the lock runs
                // out its lease on the server, or is released here when the client was to release
                // on close and its connection is still open (best effort).
                if (engine.opts.releaseOnClose()) {
                    lock.releaseAsync(true);
                }
                throw new ClosedException("the client was closed while acquire of " + Bytes.forMessage(key) + " was answered; the lock "
                        + (engine.opts.releaseOnClose() ? "is released if the connection is still open, else it " : "")
                        + "runs out its lease on the server");
            }
            case RESTARTED -> {
                lock.markLost(LostReason.SERVER_RESTARTED);
                throw new ServerRestartedException("the server restarted while acquire of " + Bytes.forMessage(key)
                        + " was answered");
            }
            case NONE -> lock.start();
        }
        return lock;
    }

    /**
     * The error of an ACQUIRE answered TIMED_OUT: the key was taken for the whole wait, or the
     * server says why (its start-up wait: nothing is granted before it ends).
     */
    static NotAcquiredException notAcquired(ResponseFrame f, String shown, long waitMs) {
        String why = Bytes.oneLine(Bytes.utf8(f.data()));
        String within = waitMs == 0 ? "in a single try (wait 0)" : "within " + waitMs + " ms";
        if (!why.isEmpty()) {
            return new NotAcquiredException(shown + " not acquired " + within + ": " + why);
        }
        return new NotAcquiredException(shown + " not acquired " + within + "; it is held by another token");
    }

    // ---- by key and token ----

    /**
     * Releases the lock on {@code key} held by {@code token}, from any session (the owner is the
     * token).
     *
     * @param key the key
     * @param token the holder's fencing token (non-zero)
     * @throws NotHeldException when the token does not hold the key (nothing changes)
     */
    public void release(String key, long token) {
        await(releaseAsync(key, token), "release of " + shown(key));
    }

    /**
     * Releases by key and token asynchronously; see {@link #release(String, long)}.
     *
     * @param key the key
     * @param token the token
     * @return a future completing when released
     */
    public CompletableFuture<Void> releaseAsync(String key, long token) {
        return byToken(Op.RELEASE, key, token, 0).thenApply(f -> null);
    }

    /**
     * Sets the lease of the lock on {@code key} held by {@code token} to {@code lease} from now.
     *
     * @param key the key
     * @param token the holder's token
     * @param lease the new lease
     * @return the lease granted
     * @throws NotHeldException when the token does not hold the key
     */
    public Duration extend(String key, long token, Duration lease) {
        return await(extendAsync(key, token, lease), "extend of " + shown(key));
    }

    /**
     * Extends by key and token asynchronously; see {@link #extend(String, long, Duration)}.
     *
     * @param key the key
     * @param token the token
     * @param lease the new lease
     * @return a future with the lease granted
     */
    public CompletableFuture<Duration> extendAsync(String key, long token, Duration lease) {
        long ms;
        try {
            ms = AcquireOptions.leaseMillis(lease);
        } catch (TicketingException e) {
            return CompletableFuture.failedFuture(e);
        }
        return byToken(Op.EXTEND, key, token, ms).thenApply(f -> Duration.ofMillis(f.leaseMs()));
    }

    private CompletableFuture<ResponseFrame> byToken(Op op, String key, long token, long leaseMs) {
        byte[] k;
        try {
            k = keyBytes(key);
            if (token == 0) {
                throw new InvalidArgumentException("token must be a positive 64-bit value, got 0");
            }
        } catch (TicketingException e) {
            return CompletableFuture.failedFuture(e);
        }
        String what = op.name().toLowerCase(java.util.Locale.ROOT) + " of " + Bytes.forMessage(k) + " (token "
                + Long.toUnsignedString(token) + ")";
        return deliver(engine.submit(new Req(op, k, token, leaseMs, 0, false)).thenApply(f -> {
            if (f.status() != Status.OK.code()) {
                throw statusError(f, what, k);
            }
            return f;
        }));
    }

    /**
     * Asks the server about a key: held or not, lease left, waiters. The holder's token is shown
     * only when this session holds the key.
     *
     * @param key the key
     * @return what the server knows
     */
    public LockInfo inspect(String key) {
        return await(inspectAsync(key, 0), "inspect of " + shown(key));
    }

    /**
     * Asks the server about a key and whether {@code token} holds it.
     *
     * @param key the key
     * @param token a token to check, or 0
     * @return what the server knows
     */
    public LockInfo inspect(String key, long token) {
        return await(inspectAsync(key, token), "inspect of " + shown(key));
    }

    /**
     * Inspects asynchronously; see {@link #inspect(String, long)}.
     *
     * @param key the key
     * @param token a token to check, or 0
     * @return a future with what the server knows
     */
    public CompletableFuture<LockInfo> inspectAsync(String key, long token) {
        byte[] k;
        try {
            k = keyBytes(key);
        } catch (TicketingException e) {
            return CompletableFuture.failedFuture(e);
        }
        return deliver(engine.submit(new Req(Op.INSPECT, k, token, 0, 0, false)).thenApply(f -> {
            if (f.status() != Status.OK.code()) {
                throw statusError(f, "inspect of " + Bytes.forMessage(k), k);
            }
            ByteBuffer d = ByteBuffer.wrap(f.data().length >= 12 ? f.data() : new byte[12]);
            long heldFor = d.getInt(0) & 0xFFFF_FFFFL;
            long delay = d.getInt(4) & 0xFFFF_FFFFL;
            long flags = d.getInt(8) & 0xFFFF_FFFFL;
            return new LockInfo((flags & 1) != 0, f.token(), Duration.ofMillis(f.leaseMs()), f.detail(),
                    Duration.ofMillis(heldFor), Duration.ofMillis(delay), flags);
        }));
    }

    /**
     * Sends {@code PING} and waits for the answer.
     *
     * @return the round-trip time
     */
    public Duration ping() {
        return await(pingAsync(), "ping");
    }

    /**
     * Pings asynchronously.
     *
     * @return a future with the round-trip time
     */
    public CompletableFuture<Duration> pingAsync() {
        long t0 = System.nanoTime();
        return deliver(engine.submit(new Req(Op.PING, null, 0, 0, 0, false)).thenApply(f -> {
            if (f.status() != Status.OK.code()) {
                throw statusError(f, "ping", new byte[0]);
            }
            return Duration.ofNanos(System.nanoTime() - t0);
        }));
    }

    // ---- closing ----

    /**
     * Closes the client: queued acquires are withdrawn (bounded by the cleanup and request
     * timeouts), pending calls fail with {@link ClosedException}, and the connection closes. Held
     * locks are <b>not</b> released unless {@link ClientOptions#releaseOnClose()} is set: the
     * server keeps them until their leases end; their lost signals no longer fire. Idempotent.
     */
    @Override
    public void close() {
        engine.close();
    }

    /**
     * Closes on a background thread; see {@link #close()}.
     *
     * @return a future completing when closed
     */
    public CompletableFuture<Void> closeAsync() {
        return CompletableFuture.runAsync(engine::close, r -> {
            Thread t = new Thread(r, "ticketing-close");
            t.setDaemon(true);
            t.start();
        });
    }

    /** {@return whether {@link #close()} was called} */
    public boolean isClosed() {
        return engine.isClosed();
    }

    @Override
    public String toString() {
        return "TicketingClient{session=" + sessionId() + ", endpoints=" + engine.opts.endpoints() + "}";
    }

    // ---- helpers ----

    private <T> CompletableFuture<T> deliver(CompletableFuture<T> f) {
        CompletableFuture<T> out = new CompletableFuture<>();
        f.whenComplete((v, e) -> engine.callbackExecutor().execute(() -> {
            if (e != null) {
                out.completeExceptionally(unwrap(e));
            } else {
                out.complete(v);
            }
        }));
        return out;
    }

    /** A key as messages show it: at most 64 bytes of it ({@link Bytes#forMessage}). */
    static String shown(String key) {
        return key == null ? "null" : Bytes.forMessage(key.getBytes(StandardCharsets.UTF_8));
    }

    static byte[] keyBytes(String key) {
        if (key == null) {
            throw new InvalidArgumentException("key must be a non-empty string, got null");
        }
        return keyBytes(key.getBytes(StandardCharsets.UTF_8));
    }

    static byte[] keyBytes(byte[] key) {
        if (key == null || key.length == 0) {
            throw new InvalidArgumentException("key must be non-empty");
        }
        if (key.length > 65535) {
            throw new InvalidArgumentException("key must be at most 65535 bytes, got " + key.length);
        }
        return key.clone();
    }

    static <T> T await(CompletableFuture<T> f, String what) {
        return await(null, f, what);
    }

    /**
     * As {@link #await(CompletableFuture, String)}; with an engine, for a future only this thread
     * waits on, completed where the answer is handled: the thread may read its answer itself.
     */
    static <T> T await(Engine engine, CompletableFuture<T> f, String what) {
        return await(engine, f, what, null);
    }

    /**
     * As {@link #await(Engine, CompletableFuture, String)}, the call named {@code what} followed by
     * the key as messages show it ({@code key} not null): built only for a message.
     */
    static <T> T await(Engine engine, CompletableFuture<T> f, String what, byte[] key) {
        try {
            return engine == null ? f.get() : engine.await(f);
        } catch (InterruptedException e) {
            f.cancel(false);
            Thread.currentThread().interrupt();
            throw new CancelledException(named(what, key) + " interrupted");
        } catch (ExecutionException e) {
            throw rethrow(e.getCause());
        } catch (CancellationException e) {
            throw new CancelledException(named(what, key) + " was cancelled");
        }
    }

    private static String named(String what, byte[] key) {
        return key == null ? what : what + Bytes.forMessage(key);
    }

    static TicketingException unwrap(Throwable t) {
        while ((t instanceof CompletionException || t instanceof ExecutionException) && t.getCause() != null) {
            t = t.getCause();
        }
        if (t instanceof TicketingException te) {
            return te;
        }
        if (t instanceof CancellationException) {
            return new CancelledException("cancelled");
        }
        return new TicketingException("unexpected failure: " + t, t);
    }

    private static RuntimeException rethrow(Throwable t) {
        return unwrap(t);
    }

    /** The error for a non-OK answer. */
    static TicketingException statusError(ResponseFrame f, String what, byte[] key) {
        String msg = Bytes.oneLine(Bytes.utf8(f.data()));
        String suffix = msg.isEmpty() ? "" : ": " + msg;
        Status s = Status.fromCode(f.status());
        if (s == null) {
            return new ProtocolException(what + " failed with unknown status " + f.status() + suffix);
        }
        return switch (s) {
            case TIMED_OUT -> new NotAcquiredException(what + " timed out in the queue" + suffix);
            case NOT_HELD -> new NotHeldException(what + ": the token does not hold the key");
            case INVALID -> {
                InvalidField field = InvalidField.fromCode(f.detail());
                yield new InvalidArgumentException(what + " rejected by the server ("
                        + (field == null ? "field " + f.detail() : field.name()) + ")" + suffix, field);
            }
            case BUSY -> new BusyException(what + ": server limit reached (" + Dialer.limitName(f.detail()) + ")"
                    + suffix, BusyLimit.fromCode(f.detail()));
            case SHUTTING_DOWN -> new ShuttingDownException(what + ": the server is shutting down");
            case CANCELLED -> new CancelledException(what + " was cancelled");
            case AUTH_FAILED -> new AuthFailedException(what + ": authentication failed" + suffix);
            case UNSUPPORTED_VERSION -> new UnsupportedVersionException(what + ": unsupported version" + suffix);
            default -> new ProtocolException(what + " got status " + s + suffix);
        };
    }
}
