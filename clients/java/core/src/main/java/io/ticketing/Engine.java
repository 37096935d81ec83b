package io.ticketing;

import io.ticketing.protocol.Bytes;
import io.ticketing.protocol.ExpiredReason;
import io.ticketing.protocol.Op;
import io.ticketing.protocol.Protocol;
import io.ticketing.protocol.ResponseFrame;
import io.ticketing.protocol.Status;
import java.net.Socket;
import java.security.SecureRandom;
import java.time.Duration;
import java.util.ArrayDeque;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.HashMap;
import java.util.HexFormat;
import java.util.List;
import java.util.Map;
import java.util.TreeMap;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.Executor;
import java.util.concurrent.RejectedExecutionException;
import java.util.concurrent.ScheduledFuture;
import java.util.concurrent.ScheduledThreadPoolExecutor;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicInteger;
import javax.net.ssl.SSLContext;

/**
 * The session engine behind {@link TicketingClient}: request ids, the in-flight table, the
 * connection and its replacement (reconnect, resume, leader hints), ACK, heartbeat, timeouts and
 * the registry of held locks.
 *
 * <p>Locking: one monitor, {@code mu}, guards the engine's state. No I/O and no user code runs under
 * it: socket writes are queued to the connection's writer, and completions (futures, lost
 * signals) are collected in an "after" list and run once {@code mu} is released. A {@link Lock}'s
 * own monitor is never held while taking {@code mu}, nor the reverse.
 */
final class Engine implements Connection.Listener {
    private static final System.Logger LOG = System.getLogger("io.ticketing");
    private static final AtomicInteger CLIENTS = new AtomicInteger();

    final ClientOptions opts;
    final SuspendClock clock;
    final ScheduledThreadPoolExecutor timer;
    private final CallbackExecutor callbacks;
    private final List<Endpoint> endpoints;
    private final SSLContext ssl;
    private final SecureRandom random = new SecureRandom();
    private final String name;
    private final Object mu = new Object();

    // Everything below is guarded by mu.
    private byte[] sessionId;
    private byte[] stateId; // null until the first WELCOME
    private long generation; // bumped when the state id changes
    private long graceMs;
    private long nextId = 1;
    private final TreeMap<Long, Req> inflight = new TreeMap<>(Long::compareUnsigned);
    private final ArrayDeque<Req> unsent = new ArrayDeque<>();
    private final Map<Long, Lock> held = new HashMap<>();
    private ScheduledFuture<?> lostCheck; // runs while held is not empty
    /**
     * The requests whose timeout is the request timeout from when it was set (nearly all of them),
     * in deadline order: set under mu, a constant added to System.nanoTime(), so the order they
     * were set in. One timer task, due at or before the head's deadline, replaces a timer entry
     * per request (a schedule and a cancel on the timer's queue, under its lock, for every request).
     */
    private Req timeoutsHead;
    private Req timeoutsTail;
    private ScheduledFuture<?> timeoutsTask; // set while the list is not empty
    private final long requestTimeoutNanos;
    private long suspendSeen; // clock.suspended() at the last lost check
    private Connection conn;
    private volatile Connection current; // conn, for callers waiting on their answers (read without mu)
    private Thread connector;
    private Socket dialing;
    private long droppedAt;
    private ScheduledFuture<?> graceTimer;
    private ScheduledFuture<?> heartbeatTask;
    private Req heartbeat;
    private String leaderHint;
    private Endpoint silentNode; // the node whose connection the heartbeat found silent last...
    private long silentUntil; // ...which is neither dialled nor followed as a hint until then (nanoTime)
    private int endpointIndex;
    private TicketingException lastConnectError; // of the last failed round since the connection dropped
    private boolean election; // a node answered NOT_LEADER in the last round
    private int answersSinceAck;
    private int sentSinceAnswer; // requests sent since the last answer came: callers active right now
    private boolean ackInFlight;
    private boolean closing;
    private boolean closed;

    Engine(ClientOptions opts, SuspendClock clock) {
        this.opts = opts;
        this.clock = clock;
        this.name = Integer.toString(CLIENTS.incrementAndGet());
        List<Endpoint> eps = new ArrayList<>();
        for (String e : opts.endpoints()) {
            eps.add(Endpoint.parse(e));
        }
        this.endpoints = List.copyOf(eps);
        this.ssl = opts.tls() == null ? null : Pem.context(opts.tls());
        this.requestTimeoutNanos = opts.requestTimeout().toNanos();
        this.timer = new ScheduledThreadPoolExecutor(1, io("ticketing-timer-" + name));
        this.timer.setRemoveOnCancelPolicy(true);
        this.callbacks = new CallbackExecutor(callbackThreads("ticketing-callback-" + name), timer);
        // A callback thread with nothing to run reads the connection (over plain TCP): the answers
        // that queue its next tasks then cost no hand-off from the reader thread.
        this.callbacks.idleRead = f -> {
            Connection c = current;
            return c != null && c.leaderFollower() && !c.isDead()
                    && c.tryLead(new Connection.Waiter(f), Connection.IDLE_NANOS);
        };
        // Frames corked by a run of callback tasks (CallbackExecutor.cork): written by the thread
        // that ends the run, or by the writer thread when the run stalls.
        this.callbacks.flushCorked = () -> {
            Connection c = current;
            if (c != null) {
                c.flush();
            }
        };
        this.callbacks.wakeWriter = () -> {
            Connection c = current;
            if (c != null) {
                c.wakeWriter();
            }
        };
        this.sessionId = newSessionId();
    }

    /**
     * The client's own threads that must never block on a socket write (reader, writer, timer,
     * connector): requests they send go through the writer thread. Any other thread that sends a
     * request (the application's, a callback's) writes it itself, without a thread hop.
     */
    static final class IoThread extends Thread {
        IoThread(Runnable r, String name) {
            super(r, name);
        }
    }

    private static java.util.concurrent.ThreadFactory io(String prefix) {
        AtomicInteger n = new AtomicInteger();
        return r -> {
            Thread t = new IoThread(r, prefix + "-" + n.incrementAndGet());
            t.setDaemon(true);
            return t;
        };
    }

    private java.util.concurrent.ThreadFactory callbackThreads(String prefix) {
        AtomicInteger n = new AtomicInteger();
        return r -> {
            Thread t = new CallbackExecutor.CallbackThread(r, prefix + "-" + n.incrementAndGet(), this);
            t.setDaemon(true);
            return t;
        };
    }

    private byte[] newSessionId() {
        byte[] id = new byte[Protocol.SESSION_ID];
        do {
            random.nextBytes(id);
        } while (Arrays.equals(id, new byte[Protocol.SESSION_ID]));
        return id;
    }

    /** Runs user-facing completions off the I/O threads. */
    Executor callbackExecutor() {
        return r -> {
            try {
                callbacks.execute(r);
            } catch (RejectedExecutionException e) {
                r.run();
            }
        };
    }

    /** The connection in use, or null while reconnecting (for tests). */
    Connection connection() {
        return current;
    }

    String sessionIdHex() {
        synchronized (mu) {
            return HexFormat.of().formatHex(sessionId);
        }
    }

    // ---- connecting ----

    /**
     * Connects for the first time, in the caller's thread; throws when a round fails, except a round
     * in which a node answered NOT_LEADER (a cluster electing a leader, as when the application and
     * the cluster start together): such rounds are retried at the shortest backoff until the
     * request timeout has passed since the connect began (then the last round's error is thrown),
     * or the thread is interrupted.
     */
    void start() {
        long giveUp = System.nanoTime() + opts.requestTimeout().toNanos();
        Dialer.Dialed d;
        while (true) {
            try {
                d = dialRound();
                break;
            } catch (UnavailableException e) {
                boolean again;
                synchronized (mu) {
                    again = election && !closed;
                }
                if (!again) {
                    throw e;
                }
                long min = opts.reconnectBackoffMin().toMillis();
                long pause = min / 2 + (long) (random.nextDouble() * (min / 2.0 + 1));
                if (giveUp - System.nanoTime() < TimeUnit.MILLISECONDS.toNanos(pause)) {
                    throw e;
                }
                LOG.log(System.Logger.Level.DEBUG, "no leader yet; connecting again in {0} ms: {1}", pause,
                        e.getMessage());
                try {
                    Thread.sleep(pause);
                } catch (InterruptedException ie) {
                    Thread.currentThread().interrupt();
                    throw new CancelledException("connect interrupted while the cluster elects a leader", e);
                }
            }
        }
        List<Runnable> after = new ArrayList<>();
        boolean again;
        synchronized (mu) {
            again = install(d, after);
        }
        after.forEach(Runnable::run);
        if (again) {
            // Cannot happen on a first connect (no state id yet); keep the invariant anyway.
            synchronized (mu) {
                ensureConnecting();
            }
        }
    }

    /**
     * How long a node whose connection went silent (a PING unanswered: frozen, or cut off) is left
     * out of the connect rounds, as an endpoint and as a leader hint, when there are other
     * endpoints: it still accepts TCP and would cost the handshake wait, and the other nodes keep
     * naming it as the leader until they elect another one (docs/clients.md, rule 1).
     */
    static final long SILENT_SKIP_NANOS = TimeUnit.SECONDS.toNanos(2);

    /** One round: the leader hint first, then every endpoint once (less a node just found silent). */
    private Dialer.Dialed dialRound() {
        List<String> order = new ArrayList<>();
        byte[] session;
        int start;
        Endpoint skip = null;
        synchronized (mu) {
            if (silentNode != null && endpoints.size() > 1 && System.nanoTime() - silentUntil < 0) {
                skip = silentNode;
            }
            if (leaderHint != null && !isNode(leaderHint, skip)) {
                order.add(leaderHint);
            }
            leaderHint = null;
            session = sessionId.clone();
            start = endpointIndex;
        }
        for (int i = 0; i < endpoints.size(); i++) {
            Endpoint ep = endpoints.get((start + i) % endpoints.size());
            if (!ep.equals(skip)) {
                order.add(ep.toString());
            }
        }
        List<TicketingException> failures = new ArrayList<>();
        TicketingException definitive = null;
        int redirects = 0;
        for (int i = 0; i < order.size(); i++) {
            Endpoint ep;
            try {
                ep = Endpoint.parse(order.get(i));
            } catch (InvalidArgumentException e) {
                failures.add(new UnavailableException("bad leader address \"" + order.get(i) + "\""));
                continue;
            }
            synchronized (mu) {
                if (closing && closed) {
                    throw new ClosedException("client closed while connecting");
                }
            }
            try {
                Dialer.Dialed d = Dialer.dial(ep, opts, ssl, session, random, opts.connectTimeout(), s -> {
                    synchronized (mu) {
                        dialing = s;
                        if (closed) {
                            closeQuietly(s);
                        }
                    }
                });
                synchronized (mu) {
                    dialing = null;
                    int idx = endpoints.indexOf(ep);
                    if (idx >= 0) {
                        endpointIndex = idx;
                    }
                }
                return d;
            } catch (Dialer.NotLeader e) {
                failures.add(e);
                if (e.leader != null && !isNode(e.leader, skip) && redirects++ < endpoints.size() + 2) {
                    order.add(i + 1, e.leader);
                }
            } catch (UnavailableException | ProtocolException | ShuttingDownException | BusyException e) {
                failures.add(e);
            } catch (TicketingException e) {
                // auth, version, TLS: the same on every endpoint of one deployment
                failures.add(e);
                if (definitive == null) {
                    definitive = e;
                }
            } finally {
                synchronized (mu) {
                    dialing = null;
                }
            }
        }
        synchronized (mu) {
            election = failures.stream().anyMatch(f -> f instanceof Dialer.NotLeader);
            if (closed) {
                throw new ClosedException("client closed while connecting");
            }
        }
        if (definitive != null) {
            throw definitive;
        }
        if (failures.size() == 1 && !(failures.get(0) instanceof Dialer.NotLeader)) {
            throw failures.get(0);
        }
        StringBuilder msg = new StringBuilder("no endpoint could be connected to");
        for (TicketingException f : failures) {
            msg.append("; ").append(f.getMessage());
        }
        UnavailableException u = new UnavailableException(msg.toString());
        failures.forEach(u::addSuppressed);
        throw u;
    }

    /** Tells whether the address names that node (false for a null node or a malformed address). */
    private static boolean isNode(String addr, Endpoint node) {
        if (node == null) {
            return false;
        }
        try {
            return Endpoint.parse(addr).equals(node);
        } catch (InvalidArgumentException e) {
            return false;
        }
    }

    private static void closeQuietly(Socket s) {
        try {
            s.close();
        } catch (java.io.IOException ignored) {
            // closing anyway
        }
    }

    /** mu must be held. Starts the reconnect loop unless it runs or the client is closed. */
    private void ensureConnecting() {
        if (connector != null || closed || conn != null) {
            return;
        }
        Thread t = new IoThread(this::reconnectLoop, "ticketing-connect-" + name);
        t.setDaemon(true);
        connector = t;
        t.start();
    }

    private void reconnectLoop() {
        int round = 0;
        while (true) {
            synchronized (mu) {
                if (closed || conn != null) {
                    connector = null;
                    return;
                }
                if (inflight.isEmpty() && unsent.isEmpty() && held.isEmpty()
                        && System.nanoTime() - droppedAt > TimeUnit.MILLISECONDS.toNanos(graceMs)) {
                    connector = null; // idle: the next request starts a new loop
                    return;
                }
            }
            List<Runnable> after = new ArrayList<>();
            boolean again = false;
            try {
                Dialer.Dialed d = dialRound();
                synchronized (mu) {
                    again = install(d, after);
                    if (!again) {
                        connector = null;
                    }
                }
                after.forEach(Runnable::run);
                if (!again) {
                    return;
                }
                round = 0;
                continue;
            } catch (ClosedException e) {
                synchronized (mu) {
                    connector = null;
                }
                return;
            } catch (AuthFailedException | UnsupportedVersionException e) {
                // No retry fixes these: fail what waits at once (and keep trying, for later calls).
                LOG.log(System.Logger.Level.DEBUG, "reconnect refused: {0}", e.getMessage());
                synchronized (mu) {
                    lastConnectError = e;
                    for (Req r : new ArrayList<>(unsent)) {
                        failLocked(r, e, after);
                    }
                    for (Req r : new ArrayList<>(inflight.values())) {
                        if (!r.abandoned) {
                            failLocked(r, e, after);
                        }
                    }
                }
                after.forEach(Runnable::run);
            } catch (TicketingException e) {
                // Unavailable, not the leader, TLS, busy...: calls keep waiting (each bounded by its
                // own timeout) while the loop retries with backoff.
                LOG.log(System.Logger.Level.DEBUG, "reconnect round failed: {0}", e.getMessage());
                synchronized (mu) {
                    lastConnectError = e;
                }
            } catch (RuntimeException e) {
                // A defect, not a state of the network: the loop must outlive it, or the client
                // would never connect again (connector stays set, so no new loop starts).
                LOG.log(System.Logger.Level.WARNING, "reconnect round failed unexpectedly", e);
                synchronized (mu) {
                    lastConnectError = new UnavailableException("reconnect round failed: " + e, e);
                }
            }
            synchronized (mu) {
                if (election) {
                    // A node answered NOT_LEADER: the cluster is electing a leader, which takes well
                    // under a second; the next round comes after the shortest pause.
                    round = 0;
                }
            }
            long min = opts.reconnectBackoffMin().toMillis();
            long max = opts.reconnectBackoffMax().toMillis();
            long base = Math.min(max, min << Math.min(round, 20));
            long pause = base / 2 + (long) (random.nextDouble() * (base / 2.0 + 1));
            round++;
            synchronized (mu) {
                long until = System.currentTimeMillis() + pause;
                while (!closed) {
                    long left = until - System.currentTimeMillis();
                    if (left <= 0) {
                        break;
                    }
                    try {
                        mu.wait(left);
                    } catch (InterruptedException e) {
                        connector = null;
                        return;
                    }
                }
            }
        }
    }

    /**
     * mu must be held. Adopts a new connection per the WELCOME: first state, resume, session ended,
     * or a different state id (then every lock is lost and it returns true: dial again at once,
     * with a new session id).
     */
    private boolean install(Dialer.Dialed d, List<Runnable> after) {
        if (closed) {
            d.close();
            return false;
        }
        var w = d.welcome();
        if (stateId != null && !Arrays.equals(stateId, w.stateId())) {
            LOG.log(System.Logger.Level.DEBUG, "server at {0} has a new state id: every lock is lost", d.endpoint());
            generation++;
            stateId = w.stateId();
            ServerRestartedException e = new ServerRestartedException("the server at " + d.endpoint()
                    + " restarted (its state id changed): every lock of this client is lost");
            // Requests in flight reached the old server (or may have): they fail. Those made since
            // the drop never did: they go to the new server as new requests, except those about a
            // lock of the old state (nothing of it is left to release, extend or verify).
            for (Req r : new ArrayList<>(unsent)) {
                if (!r.ofLock) {
                    continue;
                }
                if (r.internal) {
                    unsent.remove(r);
                    cancelTimerLocked(r);
                    r.done = true;
                    after.add(() -> r.settled.complete(null));
                } else {
                    failLocked(r, new ServerRestartedException("the server at " + d.endpoint()
                            + " restarted (its state id changed) before the " + r.op + " of the lock was sent:"
                            + " the lock is lost"), after);
                }
            }
            for (Req r : new ArrayList<>(inflight.values())) {
                failLocked(r, e, after);
            }
            inflight.clear();
            for (Lock l : held.values()) {
                after.add(() -> l.markLost(LostReason.SERVER_RESTARTED));
            }
            held.clear();
            sessionId = newSessionId();
            nextId = 1;
            ackInFlight = false;
            answersSinceAck = 0;
            d.close();
            return true;
        }
        Connection c;
        try {
            c = new Connection(d, this, name);
        } catch (java.io.IOException e) {
            d.close();
            throw new UnavailableException("cannot set up the connection to " + d.endpoint() + ": " + e.getMessage(), e);
        }
        stateId = w.stateId();
        graceMs = w.sessionGraceMs();
        lastConnectError = null;
        if (graceTimer != null) {
            graceTimer.cancel(false);
            graceTimer = null;
        }
        conn = c;
        current = c;
        conn.start();
        if (w.resumed()) {
            for (Req r : inflight.values()) {
                r.notRun = false;
                conn.enqueue(r.encode());
            }
            for (Req r : new ArrayList<>(inflight.values())) {
                if (r.abandoned && !r.cancelSent && r.op == Op.ACQUIRE) {
                    sendCancelLocked(r);
                }
            }
        } else {
            ConnectionLostException e = new ConnectionLostException("the connection to the server dropped and the session"
                    + " could not be resumed; the outcome of the request is unknown");
            for (Req r : new ArrayList<>(inflight.values())) {
                if (r.notRun) {
                    r.notRun = false;
                    conn.enqueue(r.encode());
                } else {
                    inflight.remove(r.id);
                    if (r.abandoned) {
                        after.add(() -> r.settled.complete(null));
                    } else {
                        failLocked(r, e, after);
                    }
                }
            }
            ackInFlight = false;
            answersSinceAck = 0;
        }
        while (!unsent.isEmpty()) {
            sendLocked(unsent.poll());
        }
        startHeartbeatLocked(conn);
        return false;
    }

    // ---- requests ----

    /** Sends (or queues until connected) a request; returns its answer. */
    CompletableFuture<ResponseFrame> submit(Req r) {
        List<Runnable> after = null;
        Connection flush = null;
        boolean nudge = false;
        boolean gather = false;
        synchronized (mu) {
            if (closed || (closing && !r.internal)) {
                r.done = true;
                after = new ArrayList<>(2);
                after.add(() -> r.answer.completeExceptionally(new ClosedException("the client is closed")));
                after.add(() -> r.settled.complete(null));
            } else {
                if (r.op != Op.ACQUIRE || conn == null) {
                    armRequestTimeoutLocked(r);
                }
                if (conn != null) {
                    // The caller writes the frame itself once out of mu, unless it is one of the
                    // client's own threads (those never block on the socket: the writer thread does).
                    // So does a thread that holds the read role (while it handles an answer).
                    Thread me = Thread.currentThread();
                    boolean here = !(me instanceof IoThread) && !conn.reading(me);
                    sendLocked(r, !here);
                    if (here) {
                        flush = conn;
                        gather = inflight.size() > GATHER && sentSinceAnswer > 1;
                        // No nudge where a callback thread reads when it runs out of tasks.
                        nudge = !r.awaited && !CallbackExecutor.isCallbackThread(me, this) && !callbacks.busy();
                    }
                } else {
                    unsent.add(r);
                    ensureConnecting();
                }
            }
        }
        if (after != null) {
            after.forEach(Runnable::run);
        }
        if (flush != null) {
            if (!r.awaited && CallbackExecutor.isCallbackThread(Thread.currentThread(), this) && callbacks.cork()) {
                // A callback task among others queued (a burst of answers): the frames of the run
                // go out in one write when it ends (no caller blocks on this one's answer).
                return r.answer;
            }
            flush.flush(gather);
            if (nudge) {
                flush.nudge(); // no caller reads for this answer: the reader thread does
            }
        }
        return r.answer;
    }

    /**
     * Waits for a future that only this thread waits on, whose request it sent: over plain TCP the
     * thread reads the connection itself while no other thread does ({@link Connection#await}).
     * Ends as {@link CompletableFuture#get()} does: the result, or the future's exception, or
     * {@link InterruptedException} (the flag cleared).
     */
    <T> T await(CompletableFuture<T> f) throws InterruptedException, java.util.concurrent.ExecutionException {
        Connection c = current;
        if (!f.isDone() && c != null && c.leaderFollower()) {
            Connection.Waiter w = new Connection.Waiter(f);
            while (!f.isDone()) {
                c = current;
                if (c == null || c.isDead() || !c.leaderFollower()) {
                    // Reconnecting: the next connection's reader answers (checked again every 5 ms).
                    try {
                        return f.get(5, TimeUnit.MILLISECONDS);
                    } catch (java.util.concurrent.TimeoutException e) {
                        continue;
                    }
                }
                c.await(w);
            }
        }
        return f.get();
    }

    /**
     * With more than this many requests in flight (besides the one sent), and another sent since
     * the last answer came, a caller that writes its own frame yields the CPU once first
     * ({@link Connection#flush(boolean)}): other callers queue theirs meanwhile, and one write
     * carries them all. (The second condition keeps a lone active caller from yielding while
     * acquires wait in the queues of held keys: those are in flight, but nobody is sending.)
     */
    static final int GATHER = 3;

    /** mu must be held and conn set. Takes the next id (unless it has one) and queues the frame. */
    private void sendLocked(Req r) {
        sendLocked(r, true);
    }

    /** As {@link #sendLocked(Req)}; with {@code wake} false the caller flushes the connection after mu. */
    private void sendLocked(Req r, boolean wake) {
        if (r.id == 0) {
            sentSinceAnswer++;
            r.id = nextId++;
            r.firstSent = clock.now();
            r.generation = generation;
            if (r.op == Op.ACQUIRE) {
                cancelTimerLocked(r);
                if (r.waitMs == 0) {
                    armRequestTimeoutLocked(r); // a single try: the request timeout, as any request
                } else if (r.waitMs != AcquireOptions.WAIT_FOREVER_MS) {
                    long ns = TimeUnit.MILLISECONDS.toNanos(r.waitMs) + opts.requestTimeout().toNanos();
                    r.timer = timer.schedule(() -> onTimeout(r), ns, TimeUnit.NANOSECONDS);
                }
            }
        }
        inflight.put(r.id, r);
        conn.enqueue(r.encode(), wake);
    }

    /**
     * mu must be held. Sets {@code r}'s timeout to the request timeout from now: appended to the
     * list in deadline order, and the list's timer task is scheduled only when there is none.
     */
    private void armRequestTimeoutLocked(Req r) {
        long now = System.nanoTime();
        r.timeoutAt = now + requestTimeoutNanos;
        r.inTimeouts = true;
        r.timeoutPrev = timeoutsTail;
        r.timeoutNext = null;
        if (timeoutsTail == null) {
            timeoutsHead = r;
        } else {
            timeoutsTail.timeoutNext = r;
        }
        timeoutsTail = r;
        if (timeoutsTask == null) {
            scheduleTimeoutsLocked(requestTimeoutNanos);
        }
    }

    /** mu must be held. Ends {@code r}'s timeout, its own timer or its place in the list. */
    private void cancelTimerLocked(Req r) {
        r.cancelTimer();
        if (!r.inTimeouts) {
            return;
        }
        r.inTimeouts = false;
        Req p = r.timeoutPrev;
        Req n = r.timeoutNext;
        if (p == null) {
            timeoutsHead = n;
        } else {
            p.timeoutNext = n;
        }
        if (n == null) {
            timeoutsTail = p;
        } else {
            n.timeoutPrev = p;
        }
        r.timeoutPrev = null;
        r.timeoutNext = null;
        // (the task stays scheduled: when it fires it finds nothing due and moves to the new head)
    }

    private void scheduleTimeoutsLocked(long delayNanos) {
        try {
            timeoutsTask = timer.schedule(this::requestTimeoutsDue, delayNanos, TimeUnit.NANOSECONDS);
        } catch (RejectedExecutionException e) {
            timeoutsTask = null; // the client is closed
        }
    }

    /** The list's timer task: times out every request due, then waits for the next head. */
    private void requestTimeoutsDue() {
        List<Req> due = null;
        synchronized (mu) {
            timeoutsTask = null;
            long now = System.nanoTime();
            Req r;
            while ((r = timeoutsHead) != null && r.timeoutAt - now <= 0) {
                cancelTimerLocked(r);
                if (due == null) {
                    due = new ArrayList<>();
                }
                due.add(r);
            }
            if (timeoutsHead != null && !closed) {
                scheduleTimeoutsLocked(timeoutsHead.timeoutAt - now);
            }
        }
        if (due != null) {
            for (Req r : due) {
                onTimeout(r); // (which does nothing for a request answered meanwhile)
            }
        }
    }

    private void onTimeout(Req r) {
        List<Runnable> after = new ArrayList<>();
        Connection failed = null;
        synchronized (mu) {
            if (r.done) {
                return;
            }
            String what = r.op == Op.PING && r == heartbeat ? "heartbeat PING" : r.op.name();
            long ms = r.op == Op.ACQUIRE && r.id != 0 && r.waitMs != AcquireOptions.WAIT_FOREVER_MS
                    ? r.waitMs + opts.requestTimeout().toMillis()
                    : opts.requestTimeout().toMillis();
            // While the client reconnects, the timeout names the last connect error (its cause).
            TicketingException why = conn == null ? lastConnectError : null;
            RequestTimeoutException e = new RequestTimeoutException(what
                    + (r.key.length > 0 ? " of " + Bytes.forMessage(r.key) : "") + " got no answer within " + ms
                    + " ms (request timeout " + opts.requestTimeout().toMillis() + " ms)"
                    + (conn == null ? "; not connected" : "")
                    + (why != null ? ", last connect error: " + why.getMessage() : ""), why);
            if (r == heartbeat) {
                heartbeat = null;
                failed = conn;
                inflight.remove(r.id);
                r.done = true;
            } else if (r.op == Op.ACQUIRE) {
                abandonLocked(r, e, after);
            } else {
                failLocked(r, e, after);
            }
        }
        after.forEach(Runnable::run);
        if (failed != null) {
            dropped(failed, new RequestTimeoutException("the server (" + failed.endpoint + ") did not answer a PING within "
                    + TimeUnit.NANOSECONDS.toMillis(pingWaitNanos()) + " ms"), true);
        }
    }

    /** mu must be held. Ends a request with an error (it is no longer awaited). */
    private void failLocked(Req r, TicketingException e, List<Runnable> after) {
        if (r.id != 0) {
            inflight.remove(r.id);
        }
        unsent.remove(r);
        cancelTimerLocked(r);
        if (r.op == Op.ACK) {
            ackInFlight = false;
        }
        if (r == heartbeat) {
            heartbeat = null;
        }
        if (!r.done) {
            r.done = true;
            after.add(() -> r.answer.completeExceptionally(e));
        }
        after.add(() -> r.settled.complete(null));
    }

    /**
     * Gives up on an ACQUIRE for its caller: it fails with {@code cause}, and the engine withdraws
     * it (CANCEL now, or on the session's next connection) and releases any grant that still comes.
     */
    void abandon(Req r, TicketingException cause) {
        List<Runnable> after = new ArrayList<>();
        synchronized (mu) {
            abandonLocked(r, cause, after);
        }
        after.forEach(Runnable::run);
    }

    private void abandonLocked(Req r, TicketingException cause, List<Runnable> after) {
        if (r.done) {
            return;
        }
        r.done = true;
        r.abandoned = true;
        cancelTimerLocked(r);
        after.add(() -> r.answer.completeExceptionally(cause));
        if (unsent.remove(r) || r.id == 0 || !inflight.containsKey(r.id)) {
            after.add(() -> r.settled.complete(null));
            return;
        }
        if (conn != null) {
            sendCancelLocked(r);
        }
    }

    private void sendCancelLocked(Req acquire) {
        acquire.cancelSent = true;
        Req c = new Req(Op.CANCEL, null, acquire.id, 0, 0, true);
        armRequestTimeoutLocked(c);
        sendLocked(c);
    }

    /** mu must be held. Releases a grant nobody will use (a cancelled acquire's). */
    private void releaseGrantLocked(byte[] key, long token, Req acquire) {
        Req rel = Req.ofLock(Op.RELEASE, key, token, 0, true);
        rel.answer.whenComplete((f, e) -> acquire.settled.complete(null));
        armRequestTimeoutLocked(rel);
        if (conn != null) {
            sendLocked(rel);
        } else {
            unsent.add(rel);
            ensureConnecting();
        }
    }

    /**
     * Tells the server that a lock already reported lost to its holder is released (best effort,
     * bounded by the request timeout; the answer changes nothing): the server may not have
     * reclaimed it yet, and the next waiter need not wait for its lease.
     */
    void releaseInBackground(byte[] key, long token) {
        Req rel = Req.ofLock(Op.RELEASE, key, token, 0, true);
        rel.answer.whenComplete((f, e) -> {
            if (e != null) {
                LOG.log(System.Logger.Level.DEBUG, "background release of a lost lock: {0}", e.getMessage());
            }
        });
        submit(rel);
    }

    // ---- reading ----

    @Override
    public void onFrame(Connection c, ResponseFrame f) {
        List<Runnable> after = new ArrayList<>();
        String failWhy = null;
        synchronized (mu) {
            if (c != conn) {
                return;
            }
            if (f.requestId() == 0) {
                failWhy = pushLocked(c, f, after);
            } else {
                Req r = inflight.get(f.requestId());
                if (r == null) {
                    LOG.log(System.Logger.Level.DEBUG, "answer for request {0} nobody awaits",
                            Long.toUnsignedString(f.requestId()));
                } else if (f.status() == Status.NOT_LEADER.code()) {
                    r.notRun = true;
                    leaderHint = f.data().length == 0 ? null : Bytes.utf8(f.data());
                    failWhy = c.endpoint + " is not the leader" + (leaderHint == null ? "" : "; the leader is " + leaderHint);
                } else {
                    answeredLocked(r, f, after);
                }
            }
        }
        after.forEach(Runnable::run);
        if (failWhy != null) {
            onFailure(c, new ConnectionLostException(failWhy));
        }
    }

    private void answeredLocked(Req r, ResponseFrame f, List<Runnable> after) {
        sentSinceAnswer = 0;
        inflight.remove(r.id);
        cancelTimerLocked(r);
        if (r.op == Op.ACK) {
            ackInFlight = false;
        } else {
            answersSinceAck++;
        }
        if (r == heartbeat) {
            heartbeat = null;
        }
        if (r.abandoned) {
            if (r.op == Op.ACQUIRE && f.status() == Status.OK.code()) {
                releaseGrantLocked(r.key, f.token(), r);
            } else {
                after.add(() -> r.settled.complete(null));
            }
        } else if (!r.done) {
            r.done = true;
            after.add(() -> {
                r.answer.complete(f);
                r.settled.complete(null);
            });
        }
        maybeAckLocked();
    }

    /** mu must be held. Handles EXPIRED and GOAWAY; returns why to drop the connection, or null. */
    private String pushLocked(Connection c, ResponseFrame f, List<Runnable> after) {
        if (f.op() == Op.EXPIRED.code()) {
            Lock l = held.get(f.token());
            if (l != null && Arrays.equals(l.keyBytesUnsafe(), f.data())) {
                ExpiredReason reason = ExpiredReason.fromCode(f.detail());
                LostReason lost = reason == ExpiredReason.STOPPING ? LostReason.SERVER_STOPPING : LostReason.EXPIRED;
                after.add(() -> l.markLost(lost));
            }
            return null;
        }
        if (f.op() == Op.GOAWAY.code()) {
            leaderHint = f.data().length == 0 ? null : Bytes.utf8(f.data());
            if (leaderHint == null && endpoints.size() > 1) {
                endpointIndex = (endpointIndex + 1) % endpoints.size();
            }
            return c.endpoint + " sent GOAWAY (reason " + f.detail() + ")";
        }
        LOG.log(System.Logger.Level.DEBUG, "ignoring unknown push op 0x{0}", Integer.toHexString(f.op()));
        return null;
    }

    /** mu must be held. Sends ACK when due and none is unanswered. */
    private void maybeAckLocked() {
        if (answersSinceAck < Protocol.ACK_EVERY / 2 || ackInFlight || conn == null || closed) {
            return;
        }
        long x = nextId;
        for (Req r : inflight.values()) {
            if (r.op != Op.ACQUIRE) {
                x = r.id;
                break;
            }
        }
        Req ack = new Req(Op.ACK, null, x, 0, 0, true);
        armRequestTimeoutLocked(ack);
        ackInFlight = true;
        answersSinceAck = 0;
        sendLocked(ack);
    }

    @Override
    public boolean readerComing() {
        return callbacks.readsSoon();
    }

    @Override
    public void onFailure(Connection c, Throwable cause) {
        dropped(c, cause, false);
    }

    /**
     * Gives up connection {@code c}: the reconnect loop replaces it and the session resumes; the
     * calls in flight keep waiting (each bounded by its own timeout and the session grace). After
     * an unanswered heartbeat ({@code silent}: a frozen node, a cut network) that node is neither
     * dialled nor followed as a leader hint for {@link #SILENT_SKIP_NANOS}, then tried last: its
     * kernel may still accept connections.
     */
    private void dropped(Connection c, Throwable cause, boolean silent) {
        synchronized (mu) {
            if (c != conn) {
                c.close();
                return;
            }
            LOG.log(System.Logger.Level.DEBUG, "connection lost: {0}", cause.getMessage());
            if (silent && endpoints.size() > 1) {
                int idx = endpoints.indexOf(c.endpoint);
                if (idx >= 0) {
                    endpointIndex = (idx + 1) % endpoints.size();
                }
                silentNode = c.endpoint;
                silentUntil = System.nanoTime() + SILENT_SKIP_NANOS;
            }
            conn = null;
            current = null;
            droppedAt = System.nanoTime();
            c.close();
            if (heartbeat != null) {
                inflight.remove(heartbeat.id);
                cancelTimerLocked(heartbeat);
                heartbeat.done = true;
                heartbeat = null;
            }
            if (heartbeatTask != null) {
                heartbeatTask.cancel(false);
                heartbeatTask = null;
            }
            if (closed) {
                return;
            }
            graceTimer = timer.schedule(this::onGraceOver, graceMs, TimeUnit.MILLISECONDS);
            ensureConnecting();
        }
    }

    /** The session grace passed without a reconnect: the answers still awaited are lost. */
    private void onGraceOver() {
        List<Runnable> after = new ArrayList<>();
        synchronized (mu) {
            if (conn != null || closed) {
                return;
            }
            ConnectionLostException e = new ConnectionLostException("the connection dropped and was not back within the"
                    + " session grace (" + graceMs + " ms); the outcome of the request is unknown");
            for (Req r : new ArrayList<>(inflight.values())) {
                if (r.abandoned) {
                    continue;
                }
                if (r.op == Op.ACQUIRE) {
                    abandonLocked(r, e, after); // withdrawn on the next connection if the session lives on
                } else {
                    failLocked(r, e, after);
                }
            }
        }
        after.forEach(Runnable::run);
    }

    /**
     * The heartbeat's timing (docs/clients.md, the heartbeat interval): while any request waits for
     * an answer (a queued ACQUIRE included) a PING goes after at most this much silence...
     */
    static final long BUSY_HEARTBEAT_NANOS = TimeUnit.MILLISECONDS.toNanos(250);
    /**
     * ...and a PING unanswered for min(heartbeat, this) gives the connection up: a frozen leader is
     * left about 1 s after it froze, and the session resumes on the next one.
     */
    static final long MAX_PING_WAIT_NANOS = TimeUnit.MILLISECONDS.toNanos(750);

    private long pingWaitNanos() {
        return Math.min(opts.heartbeatInterval().toNanos(), MAX_PING_WAIT_NANOS);
    }

    private void startHeartbeatLocked(Connection c) {
        long interval = opts.heartbeatInterval().toNanos();
        if (interval == 0) {
            return;
        }
        long period = Math.max(TimeUnit.MILLISECONDS.toNanos(5), Math.min(interval, BUSY_HEARTBEAT_NANOS) / 4);
        heartbeatTask = timer.scheduleAtFixedRate(() -> heartbeatCheck(c, interval), period, period,
                TimeUnit.NANOSECONDS);
    }

    /**
     * Sends a PING after {@code interval} without receiving anything, or after
     * min(interval, {@link #BUSY_HEARTBEAT_NANOS}) while requests wait for answers; one PING at a
     * time, given up after {@link #pingWaitNanos()}.
     */
    private void heartbeatCheck(Connection c, long interval) {
        synchronized (mu) {
            if (c != conn || heartbeat != null || closed) {
                return;
            }
            long silence = inflight.isEmpty() ? interval : Math.min(interval, BUSY_HEARTBEAT_NANOS);
            if (System.nanoTime() - c.lastReceive() < silence) {
                return;
            }
            Req ping = new Req(Op.PING, null, 0, 0, 0, true);
            ping.timer = timer.schedule(() -> onTimeout(ping), pingWaitNanos(), TimeUnit.NANOSECONDS);
            heartbeat = ping;
            sendLocked(ping);
        }
    }

    // ---- locks ----

    /** Why {@link #register} refused a granted lock. */
    enum Refusal {
        /** Registered: not refused. */
        NONE,
        /** The client was closed (or is closing) while the grant was being handled. */
        CLOSED,
        /** The grant belongs to a lock state that is gone (the server restarted meanwhile). */
        RESTARTED,
    }

    /**
     * Registers a granted lock, or says why not: the client closed, or the server restarted,
     * while the grant was being handled (the caller's completion runs after the answer, so either
     * may come first).
     */
    Refusal register(Lock l, long requestGeneration) {
        synchronized (mu) {
            if (closed || closing) {
                return Refusal.CLOSED;
            }
            if (requestGeneration != generation) {
                return Refusal.RESTARTED;
            }
            held.put(l.token(), l);
            if (lostCheck == null) {
                suspendSeen = clock.suspended();
                lostCheck = timer.scheduleWithFixedDelay(this::checkDeadlines, Protocol.LOST_CHECK_MS,
                        Protocol.LOST_CHECK_MS, TimeUnit.MILLISECONDS);
            }
            return Refusal.NONE;
        }
    }

    /**
     * Checks every held lock's deadline against the clock, every {@link Protocol#LOST_CHECK_MS}
     * while any is held: the locks' own timers run on the monotonic clock, which stops while the
     * host is suspended, so after a resume they would fire late. Stops once no lock is held.
     */
    private void checkDeadlines() {
        List<Lock> locks;
        boolean suspendedMore;
        long now = clock.nowChecked();
        synchronized (mu) {
            if (held.isEmpty()) {
                if (lostCheck != null) {
                    lostCheck.cancel(false);
                    lostCheck = null;
                }
                return;
            }
            locks = new ArrayList<>(held.values());
            long suspended = clock.suspended();
            suspendedMore = suspended != suspendSeen;
            suspendSeen = suspended;
        }
        for (Lock l : locks) {
            l.checkDeadline(now, suspendedMore);
        }
    }

    void unregister(Lock l) {
        synchronized (mu) {
            held.remove(l.token(), l);
        }
    }

    /** Tells whether this client holds a lock on the key that is not lost. */
    boolean holds(byte[] key) {
        List<Lock> locks;
        synchronized (mu) {
            locks = new ArrayList<>(held.values());
        }
        // isLost() checks the deadline, and may unregister the lock: outside mu.
        for (Lock l : locks) {
            if (Arrays.equals(l.keyBytesUnsafe(), key) && !l.isLost()) {
                return true;
            }
        }
        return false;
    }

    // ---- closing ----

    void close() {
        List<Runnable> after = new ArrayList<>();
        List<CompletableFuture<?>> waits = new ArrayList<>();
        List<Lock> toRelease = new ArrayList<>();
        boolean connected;
        synchronized (mu) {
            if (closing) {
                return;
            }
            closing = true;
            ClosedException e = new ClosedException("the client was closed");
            for (Req r : new ArrayList<>(unsent)) {
                if (!r.internal) {
                    failLocked(r, e, after);
                }
            }
            for (Req r : new ArrayList<>(inflight.values())) {
                if (r.op == Op.ACQUIRE && !r.done) {
                    abandonLocked(r, e, after);
                    waits.add(r.settled);
                } else if (r.abandoned) {
                    waits.add(r.settled);
                }
            }
            if (opts.releaseOnClose()) {
                toRelease.addAll(held.values());
            }
            connected = conn != null;
        }
        after.forEach(Runnable::run);
        after.clear();
        for (Lock l : toRelease) {
            waits.add(l.releaseAsync(true).handle((v, x) -> null));
        }
        if (connected && !waits.isEmpty()) {
            Duration bound = opts.cleanupTimeout().compareTo(opts.requestTimeout()) < 0
                    ? opts.cleanupTimeout() : opts.requestTimeout();
            try {
                CompletableFuture.allOf(waits.toArray(new CompletableFuture<?>[0]))
                        .get(bound.toNanos(), TimeUnit.NANOSECONDS);
            } catch (InterruptedException ie) {
                Thread.currentThread().interrupt();
            } catch (Exception ignored) {
                // bounded clean-up; the server's session grace finishes the rest
            }
        }
        List<Lock> locks;
        synchronized (mu) {
            closed = true;
            ClosedException e = new ClosedException("the client was closed");
            for (Req r : new ArrayList<>(unsent)) {
                failLocked(r, e, after);
            }
            for (Req r : new ArrayList<>(inflight.values())) {
                failLocked(r, e, after);
            }
            locks = new ArrayList<>(held.values());
            held.clear();
            if (conn != null) {
                conn.close();
                conn = null;
                current = null;
            }
            if (dialing != null) {
                closeQuietly(dialing);
            }
            if (connector != null) {
                connector.interrupt();
            }
            mu.notifyAll();
        }
        after.forEach(Runnable::run);
        for (Lock l : locks) {
            l.detach();
        }
        timer.shutdownNow();
        callbacks.shutdown();
    }

    boolean isClosed() {
        synchronized (mu) {
            return closing;
        }
    }
}
