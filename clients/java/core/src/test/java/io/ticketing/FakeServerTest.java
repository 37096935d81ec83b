package io.ticketing;

import static org.junit.jupiter.api.Assertions.assertArrayEquals;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertNotEquals;
import static org.junit.jupiter.api.Assertions.assertNull;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import io.ticketing.protocol.ExpiredReason;
import io.ticketing.protocol.GoawayReason;
import io.ticketing.protocol.Handshake;
import io.ticketing.protocol.Op;
import io.ticketing.protocol.Protocol;
import io.ticketing.protocol.RequestFrame;
import io.ticketing.protocol.ResponseFrame;
import io.ticketing.protocol.Status;
import java.io.DataInputStream;
import java.net.InetAddress;
import java.net.InetSocketAddress;
import java.net.Socket;
import java.nio.charset.StandardCharsets;
import java.nio.file.Path;
import java.time.Duration;
import java.util.ArrayList;
import java.util.List;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.ExecutionException;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicInteger;
import java.util.concurrent.atomic.AtomicLong;
import java.util.function.Consumer;
import org.junit.jupiter.api.AfterEach;
import org.junit.jupiter.api.BeforeEach;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.Timeout;
import org.junit.jupiter.api.io.TempDir;
import javax.net.ssl.SSLServerSocket;

/** The client's protocol behaviour against a scripted server (PROTOCOL.md, docs/clients.md). */
@Timeout(30)
class FakeServerTest {
    private FakeServer server;
    private final List<AutoCloseable> closeables = new ArrayList<>();

    @BeforeEach
    void setUp() throws Exception {
        server = new FakeServer();
        closeables.add(server);
    }

    @AfterEach
    void tearDown() throws Exception {
        for (int i = closeables.size() - 1; i >= 0; i--) {
            closeables.get(i).close();
        }
    }

    private TicketingClient connect(Consumer<ClientOptions.Builder> tweak) {
        return connect(SuspendClock.SYSTEM, tweak);
    }

    private TicketingClient connect(SuspendClock clock, Consumer<ClientOptions.Builder> tweak) {
        ClientOptions.Builder b = ClientOptions.builder().endpoints(server.endpoint())
                .reconnectBackoff(Duration.ofMillis(10), Duration.ofMillis(100)).cleanupTimeout(Duration.ofMillis(300));
        tweak.accept(b);
        TicketingClient c = TicketingClient.connect(b.build(), clock);
        closeables.add(c);
        return c;
    }

    private TicketingClient connect() {
        return connect(b -> { });
    }

    /**
     * A deadline clock without the wall clock's reading noise (the wall is the monotonic clock), so
     * that a test can compare deadlines with {@code System.nanoTime()} to the millisecond.
     */
    private static SuspendClock steadyClock() {
        return new SuspendClock(System::nanoTime, System::nanoTime);
    }

    /** (ms) · (1 − 2ρ), in nanoseconds: the local span of a server span (PROTOCOL.md, "The lost signal"). */
    private static long local(long ms) {
        return ms * (1_000_000L - 2L * Protocol.CLOCK_RATE_BOUND_PPM);
    }

    private static long millisSince(long nanoTime) {
        return TimeUnit.NANOSECONDS.toMillis(System.nanoTime() - nanoTime);
    }

    /**
     * Asserts that the lock's local deadline, on the scale of {@code System.nanoTime()}, is within
     * [{@code earliest} − 5 ms, {@code latest} + 2 ms] (the conformance scenario's tolerances).
     */
    private static void assertDeadline(Lock lock, long earliest, long latest) {
        long before = System.nanoTime();
        long left = lock.timeLeft().toNanos();
        long after = System.nanoTime();
        long low = before + left;
        long high = after + left;
        assertTrue(high >= earliest - TimeUnit.MILLISECONDS.toNanos(5), "deadline "
                + TimeUnit.NANOSECONDS.toMillis(earliest - high) + " ms earlier than the rule allows");
        assertTrue(low <= latest + TimeUnit.MILLISECONDS.toNanos(2), "deadline "
                + TimeUnit.NANOSECONDS.toMillis(low - latest) + " ms after the server's lease end");
    }

    private static byte[] key(String k) {
        return k.getBytes(StandardCharsets.UTF_8);
    }

    private static <T extends Throwable> T failure(Class<T> type, CompletableFuture<?> f) throws Exception {
        ExecutionException e = assertThrows(ExecutionException.class, () -> f.get(10, TimeUnit.SECONDS));
        assertTrue(type.isInstance(e.getCause()), "expected " + type.getSimpleName() + ", got " + e.getCause());
        return type.cast(e.getCause());
    }

    private static void grant(FakeServer.Received r, long token) {
        r.conn().reply(r.frame(), Status.OK, token, r.frame().leaseMs(), 0);
    }

    // ---- handshake ----

    @Test
    void sessionIdIsRandomNonZeroAndTheSameOnEveryConnection() throws Exception {
        TicketingClient c = connect();
        String sid = c.sessionId();
        assertEquals(32, sid.length());
        assertNotEquals("0".repeat(32), sid);
        assertNotEquals(sid, connect().sessionId());
        server.killAll();
        Poll.until(Duration.ofSeconds(5), () -> server.hellos.size() >= 3, "reconnect");
        Poll.until(Duration.ofSeconds(5), () -> server.hellos.stream().filter(sid::equals).count() == 2,
                "the same session id on the reconnect");
    }

    @Test
    void tokenAuthVerifiesBothProofs() throws Exception {
        server.token = key("s3cret");
        TicketingClient c = connect(b -> b.token("s3cret"));
        CompletableFuture<Duration> ping = c.pingAsync();
        assertTrue(ping.get(5, TimeUnit.SECONDS).compareTo(Duration.ZERO) >= 0);

        AuthFailedException wrong = assertThrows(AuthFailedException.class, () -> connect(b -> b.token("nope")));
        assertTrue(wrong.getMessage().contains("rejected the token"), wrong.getMessage());
        AuthFailedException none = assertThrows(AuthFailedException.class, () -> connect());
        assertTrue(none.getMessage().contains("requires a token"), none.getMessage());

        server.forgeServerProof = true;
        AuthFailedException forged = assertThrows(AuthFailedException.class, () -> connect(b -> b.token("s3cret")));
        assertTrue(forged.getMessage().contains("could not prove"), forged.getMessage());
    }

    @Test
    void clientWithTokenRefusesServerWithoutAuth() {
        AuthFailedException e = assertThrows(AuthFailedException.class, () -> connect(b -> b.token("t")));
        assertTrue(e.getMessage().contains("does not require a token"), e.getMessage());
    }

    @Test
    void challengeNotLeaderFollowsTheHint() throws Exception {
        FakeServer leader = new FakeServer();
        closeables.add(leader);
        server.notLeaderHint = leader.endpoint();
        TicketingClient c = connect();
        CompletableFuture<Lock> f = c.acquireAsync("k", Duration.ofSeconds(5));
        FakeServer.Received r = leader.expect(Op.ACQUIRE);
        grant(r, 3);
        assertEquals(3, f.get(5, TimeUnit.SECONDS).token());
    }

    @Test
    void unreachableEndpointIsUnavailable() throws Exception {
        // A port bound but not listening refuses every connection, and nobody else can take it
        // meanwhile (a closed listener's port was once answered by someone else in a loaded run:
        // the connect succeeded).
        try (Socket holder = new Socket()) {
            holder.bind(new InetSocketAddress("127.0.0.1", 0));
            int port = holder.getLocalPort();
            long t0 = System.nanoTime();
            UnavailableException e = assertThrows(UnavailableException.class, () -> TicketingClient.connect(
                    ClientOptions.builder().endpoints("127.0.0.1:" + port).connectTimeout(Duration.ofSeconds(1)).build()));
            assertTrue(e.getMessage().contains("127.0.0.1:" + port), e.getMessage());
            assertTrue(System.nanoTime() - t0 < TimeUnit.SECONDS.toNanos(3));
        }
    }

    /**
     * A connect to a free local port may reach itself (TCP's simultaneous open, when the kernel
     * picks that port as the source): the dialer sees it and treats the endpoint as refused. Here
     * the self-connection is made on purpose, by binding the source port first.
     */
    @Test
    void aConnectionToItselfIsRecognized() throws Exception {
        try (Socket s = new Socket()) {
            s.bind(new InetSocketAddress("127.0.0.1", 0));
            s.connect(new InetSocketAddress("127.0.0.1", s.getLocalPort()), 1000);
            assertTrue(Dialer.connectedToItself(s), s.toString());
        }
        try (Socket s = new Socket("127.0.0.1", server.port())) {
            assertFalse(Dialer.connectedToItself(s), s.toString());
        }
    }

    @Test
    void firstConnectKeepsTryingWhileNodesAnswerNotLeader() throws Exception {
        server.notLeaderNext.set(2); // electing, then a leader
        TicketingClient c = connect(b -> b.reconnectBackoff(Duration.ofMillis(50), Duration.ofSeconds(2)));
        assertEquals(3, server.hellos.size());
        assertEquals(1, server.hellos.stream().distinct().count()); // one session throughout
        assertTrue(c.ping().compareTo(Duration.ZERO) >= 0);
    }

    @Test
    void firstConnectDuringAnElectionGivesUpAfterTheRequestTimeout() {
        server.notLeaderHint = ""; // an election that never ends
        long t0 = System.nanoTime();
        UnavailableException e = assertThrows(UnavailableException.class,
                () -> connect(b -> b.requestTimeout(Duration.ofMillis(500))));
        long ms = TimeUnit.NANOSECONDS.toMillis(System.nanoTime() - t0);
        assertTrue(ms >= 400 && ms < 2000, "took " + ms + " ms");
        assertTrue(e.getMessage().contains("not the leader"), e.getMessage());
        assertTrue(server.hellos.size() >= 3, server.hellos.size() + " rounds");
    }

    @Test
    void firstConnectDuringAnElectionStopsWhenInterrupted() throws Exception {
        server.notLeaderHint = "";
        CompletableFuture<TicketingClient> f = TicketingClient.connectAsync(ClientOptions.builder()
                .endpoints(server.endpoint()).reconnectBackoff(Duration.ofMillis(50), Duration.ofSeconds(2)).build());
        Poll.until(Duration.ofSeconds(5), () -> server.hellos.size() >= 2, "a second round");
        f.cancel(true);
        int rounds = server.hellos.size();
        Thread.sleep(300);
        assertTrue(server.hellos.size() <= rounds + 1, "still connecting after the cancel");
        // A blocking connect: the interrupt ends it with CancelledException.
        Thread.currentThread().interrupt();
        try {
            assertThrows(CancelledException.class, () -> connect());
            assertTrue(Thread.interrupted());
        } finally {
            Thread.interrupted();
        }
    }

    @Test
    void silentServerTimesOutTheHandshake() {
        server.frozen = true;
        long t0 = System.nanoTime();
        assertThrows(UnavailableException.class, () -> connect(b -> b.connectTimeout(Duration.ofMillis(300))));
        long ms = TimeUnit.NANOSECONDS.toMillis(System.nanoTime() - t0);
        assertTrue(ms >= 250 && ms < 3000, "took " + ms + " ms");
    }

    // ---- requests ----

    @Test
    void requestIdsStartAtOneAndFollowSendOrder() throws Exception {
        server.autoPing = false;
        TicketingClient c = connect(b -> b.heartbeatInterval(Duration.ZERO));
        List<CompletableFuture<Duration>> pings = new ArrayList<>();
        for (int i = 0; i < 5; i++) {
            pings.add(c.pingAsync());
        }
        List<FakeServer.Received> got = new ArrayList<>();
        for (int i = 0; i < 5; i++) {
            got.add(server.expect(Op.PING));
            assertEquals(i + 1, got.get(i).id());
        }
        // answers in reverse order are matched by id
        for (int i = 4; i >= 0; i--) {
            got.get(i).conn().ok(got.get(i).frame());
        }
        for (CompletableFuture<Duration> p : pings) {
            p.get(5, TimeUnit.SECONDS);
        }
    }

    @Test
    void acquireFieldsAndLocalDeadline() throws Exception {
        TicketingClient c = connect();
        long t0 = System.nanoTime();
        CompletableFuture<Lock> f = c.acquireAsync("order-1234", Duration.ofMillis(300), Duration.ofSeconds(5));
        FakeServer.Received r = server.expect(Op.ACQUIRE);
        assertArrayEquals(key("order-1234"), r.frame().key());
        assertEquals(300, r.frame().leaseMs());
        assertEquals(5000, r.frame().waitMs());
        assertEquals(0, r.frame().flags());
        r.conn().reply(r.frame(), Status.OK, 7, 300, 100); // granted after 100 ms in the queue
        Lock lock = f.get(5, TimeUnit.SECONDS);
        assertEquals(7, lock.token());
        assertEquals("order-1234", lock.key());
        CompletableFuture<LostReason> lost = lock.lost().toCompletableFuture();
        assertEquals(LostReason.EXPIRED, lost.get(5, TimeUnit.SECONDS));
        long ms = TimeUnit.NANOSECONDS.toMillis(System.nanoTime() - t0);
        // deadline = t_send + (100 + 300) * 0.998 ms, fired 5 ms early
        assertTrue(ms >= 390, "lost after " + ms + " ms");
        assertTrue(ms < 2000, "lost after " + ms + " ms");
        CompletableFuture<Void> rel = lock.releaseAsync();
        FakeServer.Received told = server.expect(Op.RELEASE); // the server is told anyway
        told.conn().reply(told.frame(), Status.NOT_HELD, 0, 0, 0);
        assertEquals(LostReason.EXPIRED, failure(LockLostException.class, rel).reason());
    }

    @Test
    void waitForeverAndTryOnceOnTheWire() throws Exception {
        TicketingClient c = connect();
        c.acquireAsync("a", Duration.ofSeconds(1));
        assertEquals(0xFFFF_FFFFL, server.expect(Op.ACQUIRE).frame().waitMs());
        CompletableFuture<java.util.Optional<Lock>> t = c.tryAcquireAsync("b", Duration.ofSeconds(1));
        FakeServer.Received r = server.expect(Op.ACQUIRE);
        assertEquals(0, r.frame().waitMs());
        r.conn().reply(r.frame(), Status.TIMED_OUT, 0, 0, 0);
        assertTrue(t.get(5, TimeUnit.SECONDS).isEmpty());
    }

    @Test
    void statusesMapToExceptions() throws Exception {
        TicketingClient c = connect();
        Object[][] cases = {
            {Status.TIMED_OUT, 0L, NotAcquiredException.class},
            {Status.INVALID, 5L, InvalidArgumentException.class},
            {Status.BUSY, 2L, BusyException.class},
            {Status.SHUTTING_DOWN, 0L, ShuttingDownException.class},
        };
        for (Object[] k : cases) {
            CompletableFuture<Lock> f = c.acquireAsync("k", Duration.ofSeconds(1), Duration.ofSeconds(1));
            FakeServer.Received r = server.expect(Op.ACQUIRE);
            r.conn().send(new ResponseFrame(r.frame().op(), ((Status) k[0]).code(), r.id(), 0, 0, (Long) k[1],
                    "why".getBytes(StandardCharsets.UTF_8)));
            @SuppressWarnings("unchecked")
            Class<? extends Throwable> type = (Class<? extends Throwable>) k[2];
            Throwable t = failure(type, f);
            assertTrue(t.getMessage().contains("k"), t.getMessage());
        }
        CompletableFuture<Lock> f = c.acquireAsync("k", Duration.ofSeconds(1), Duration.ofSeconds(1));
        FakeServer.Received r = server.expect(Op.ACQUIRE);
        r.conn().send(new ResponseFrame(r.frame().op(), 77, r.id(), 0, 0, 0, new byte[0]));
        assertTrue(failure(ProtocolException.class, f).getMessage().contains("77"));
        BusyException busy = assertThrows(BusyException.class, () -> {
            CompletableFuture<Void> rel = c.releaseAsync("k", 9);
            FakeServer.Received rr = server.expect(Op.RELEASE);
            rr.conn().reply(rr.frame(), Status.BUSY, 0, 0, 5);
            TicketingClient.await(rel, "release");
        });
        assertEquals(io.ticketing.protocol.BusyLimit.INFLIGHT, busy.limit().orElseThrow());
    }

    @Test
    void badArgumentsAreRejectedBeforeAnythingIsSent() throws Exception {
        TicketingClient c = connect();
        assertThrows(InvalidArgumentException.class, () -> c.acquire("", Duration.ofSeconds(1)));
        assertThrows(InvalidArgumentException.class, () -> c.acquire((String) null, AcquireOptions.of(Duration.ofSeconds(1), null)));
        assertThrows(InvalidArgumentException.class, () -> c.acquire(new byte[65536], AcquireOptions.of(Duration.ofSeconds(1), null)));
        InvalidArgumentException lease = assertThrows(InvalidArgumentException.class, () -> c.acquire("k", Duration.ZERO));
        assertTrue(lease.getMessage().contains("1 ms"), lease.getMessage());
        assertThrows(InvalidArgumentException.class, () -> c.acquire("k", Duration.ofMillis(-5)));
        assertThrows(InvalidArgumentException.class, () -> c.acquire("k", Duration.ofNanos(999_999)));
        assertThrows(InvalidArgumentException.class, () -> c.acquire("k", Duration.ofMillis(1L << 32)));
        assertThrows(InvalidArgumentException.class, () -> c.acquire("k", Duration.ofSeconds(1), Duration.ofMillis(-5)));
        assertThrows(InvalidArgumentException.class, () -> c.release("k", 0));
        assertThrows(InvalidArgumentException.class, () -> c.extend("k", 5, Duration.ZERO));
        assertThrows(InvalidArgumentException.class, () -> ClientOptions.builder().endpoints("nohost"));
        assertThrows(InvalidArgumentException.class, () -> ClientOptions.builder().endpoints("h:70000"));
        assertNull(server.poll(Duration.ofMillis(200)), "nothing reaches the server");
    }

    @Test
    void pushesExpiredAndUnknownOps() throws Exception {
        TicketingClient c = connect();
        CompletableFuture<Lock> f1 = c.acquireAsync("a", Duration.ofSeconds(30));
        FakeServer.Received r1 = server.expect(Op.ACQUIRE);
        grant(r1, 11);
        Lock a = f1.get(5, TimeUnit.SECONDS);
        CompletableFuture<Lock> f2 = c.acquireAsync("b", Duration.ofSeconds(30));
        FakeServer.Received r2 = server.expect(Op.ACQUIRE);
        grant(r2, 12);
        Lock b = f2.get(5, TimeUnit.SECONDS);
        AtomicInteger calls = new AtomicInteger();
        a.onLost(r -> calls.incrementAndGet());

        r1.conn().send(new ResponseFrame(0x2f, 0, 0, 0, 0, 0, new byte[0])); // unknown push: ignored
        // EXPIRED for the right token but another key changes nothing
        r1.conn().send(new ResponseFrame(Op.EXPIRED.code(), 0, 0, 11, 0, ExpiredReason.LEASE.code(), key("zzz")));
        r1.conn().send(new ResponseFrame(Op.EXPIRED.code(), 0, 0, 11, 0, ExpiredReason.LEASE.code(), key("a")));
        r1.conn().send(new ResponseFrame(Op.EXPIRED.code(), 0, 0, 11, 0, ExpiredReason.LEASE.code(), key("a")));
        r1.conn().send(new ResponseFrame(Op.EXPIRED.code(), 0, 0, 12, 0, ExpiredReason.STOPPING.code(), key("b")));
        assertEquals(LostReason.EXPIRED, a.lost().toCompletableFuture().get(5, TimeUnit.SECONDS));
        assertEquals(LostReason.SERVER_STOPPING, b.lost().toCompletableFuture().get(5, TimeUnit.SECONDS));
        Poll.until(Duration.ofSeconds(2), () -> calls.get() == 1, "listener once");
        assertEquals(1, calls.get());
        c.ping(); // the connection survived the unknown push
    }

    // ---- cancellation ----

    @Test
    void cancelledAcquireIsWithdrawn() throws Exception {
        TicketingClient c = connect();
        CompletableFuture<Lock> f = c.acquireAsync("k", Duration.ofSeconds(5));
        FakeServer.Received acq = server.expect(Op.ACQUIRE);
        assertTrue(f.cancel(true));
        FakeServer.Received cancel = server.expect(Op.CANCEL);
        assertEquals(acq.id(), cancel.frame().token());
        acq.conn().reply(acq.frame(), Status.CANCELLED, 0, 0, 0);
        cancel.conn().reply(cancel.frame(), Status.OK, 0, 0, 1);
        assertNull(server.poll(Duration.ofMillis(300)), "no release for a withdrawn wait");
    }

    @Test
    void grantRacingACancelIsReleased() throws Exception {
        TicketingClient c = connect();
        CompletableFuture<Lock> f = c.acquireAsync("k", Duration.ofSeconds(5));
        FakeServer.Received acq = server.expect(Op.ACQUIRE);
        f.cancel(true);
        FakeServer.Received cancel = server.expect(Op.CANCEL);
        grant(acq, 41); // the grant crossed the CANCEL
        cancel.conn().reply(cancel.frame(), Status.OK, 0, 0, 0);
        FakeServer.Received rel = server.expect(Op.RELEASE);
        assertEquals(41, rel.frame().token());
        assertArrayEquals(key("k"), rel.frame().key());
    }

    @Test
    void interruptedBlockingAcquireWithdrawsAndWaitsForTheCleanUp() throws Exception {
        TicketingClient c = connect();
        CompletableFuture<Throwable> outcome = new CompletableFuture<>();
        Thread t = new Thread(() -> {
            try {
                c.acquire("k", Duration.ofSeconds(5));
                outcome.complete(null);
            } catch (Throwable e) {
                outcome.complete(e);
            }
        });
        t.start();
        FakeServer.Received acq = server.expect(Op.ACQUIRE);
        t.interrupt();
        FakeServer.Received cancel = server.expect(Op.CANCEL);
        Thread.sleep(100); // the cleanup is still pending: the thread must still be waiting for it
        assertFalse(outcome.isDone());
        acq.conn().reply(acq.frame(), Status.CANCELLED, 0, 0, 0);
        cancel.conn().reply(cancel.frame(), Status.OK, 0, 0, 1);
        assertTrue(outcome.get(5, TimeUnit.SECONDS) instanceof CancelledException);
        t.join(5000);
    }

    // ---- timeouts and heartbeat ----

    @Test
    void requestTimeoutAndAcquireQueueTimeIsExcluded() throws Exception {
        TicketingClient quiet = connect(b -> b.requestTimeout(Duration.ofMillis(300)).heartbeatInterval(Duration.ZERO));
        server.autoPing = false;
        long t0 = System.nanoTime();
        CompletableFuture<Duration> ping = quiet.pingAsync();
        server.expect(Op.PING); // never answered
        RequestTimeoutException e = failure(RequestTimeoutException.class, ping);
        assertTrue(e.getMessage().contains("300"), e.getMessage());
        assertTrue(System.nanoTime() - t0 >= TimeUnit.MILLISECONDS.toNanos(290));
        server.autoPing = true;
        TicketingClient c = connect(b -> b.requestTimeout(Duration.ofMillis(300)).heartbeatInterval(Duration.ofMillis(300)));

        // an acquire queued for 3 request timeouts is not timed out (the heartbeat keeps the link checked)
        CompletableFuture<Lock> f = c.acquireAsync("k", Duration.ofSeconds(5));
        FakeServer.Received acq = server.expect(Op.ACQUIRE);
        Thread.sleep(900);
        assertFalse(f.isDone());
        grant(acq, 5);
        assertEquals(5, f.get(5, TimeUnit.SECONDS).token());
    }

    /**
     * Request timeouts are one list in send order with one timer task (Engine.armRequestTimeoutLocked):
     * each request still times out at its own deadline, never before it, whether the requests
     * before it in the list were answered (the head unlinked: the task moves on to the next) or
     * timed out themselves; a try-once ACQUIRE that times out is withdrawn with a CANCEL.
     */
    @Test
    void eachRequestTimesOutAtItsOwnDeadlineWhateverHappensToTheOthers() throws Exception {
        long timeoutMs = 400;
        TicketingClient c = connect(b -> b.requestTimeout(Duration.ofMillis(timeoutMs)).heartbeatInterval(Duration.ZERO));
        server.autoPing = false;
        long tA = System.nanoTime();
        CompletableFuture<Duration> a = c.pingAsync(); // answered: the list's head goes
        FakeServer.Received ra = server.expect(Op.PING);
        Thread.sleep(100);
        long tB = System.nanoTime();
        CompletableFuture<Duration> b = c.pingAsync(); // never answered
        server.expect(Op.PING);
        Thread.sleep(100);
        CompletableFuture<Duration> cc = c.pingAsync(); // answered while b waits
        FakeServer.Received rc = server.expect(Op.PING);
        Thread.sleep(100);
        long tD = System.nanoTime();
        CompletableFuture<java.util.Optional<Lock>> d = c.tryAcquireAsync("k", Duration.ofSeconds(5)); // never answered
        FakeServer.Received rd = server.expect(Op.ACQUIRE);
        ra.conn().ok(ra.frame());
        a.get(5, TimeUnit.SECONDS);
        rc.conn().ok(rc.frame());
        cc.get(5, TimeUnit.SECONDS);

        failure(RequestTimeoutException.class, b);
        long bAfter = millisSince(tB);
        failure(RequestTimeoutException.class, d);
        long dAfter = millisSince(tD);
        assertTrue(bAfter >= timeoutMs, "timed out after " + bAfter + " ms");
        assertTrue(dAfter >= timeoutMs, "timed out after " + dAfter + " ms");
        assertTrue(dAfter < timeoutMs + 1000, "timed out after " + dAfter + " ms");
        FakeServer.Received cancel = server.expect(Op.CANCEL); // the timed-out acquire is withdrawn
        assertEquals(rd.id(), cancel.frame().token());
        assertTrue(millisSince(tA) < 3 * timeoutMs + 1000);
    }

    @Test
    void heartbeatDetectsAFrozenServerAndTheClientReconnects() throws Exception {
        TicketingClient c = connect(b -> b.requestTimeout(Duration.ofMillis(300)).heartbeatInterval(Duration.ofMillis(100)));
        server.autoPing = false;
        FakeServer.Received ping = server.expect(Op.PING); // the heartbeat
        assertEquals(1, ping.id());
        server.autoPing = true;
        // unanswered within min(heartbeat, 1 s): the connection is replaced, the session resumed
        FakeServer.Conn second = server.connections.poll(5, TimeUnit.SECONDS);
        second = server.connections.poll(5, TimeUnit.SECONDS);
        assertTrue(second != null && second.resumed);
        c.ping();
    }

    @Test
    void closeReturnsPromptlyWhenTheServerIsFrozen() throws Exception {
        TicketingClient c = connect(b -> b.requestTimeout(Duration.ofMillis(500)).heartbeatInterval(Duration.ofMillis(200)));
        CompletableFuture<Lock> f = c.acquireAsync("k", Duration.ofSeconds(5));
        server.expect(Op.ACQUIRE);
        server.frozen = true;
        long t0 = System.nanoTime();
        c.close();
        assertTrue(System.nanoTime() - t0 < TimeUnit.SECONDS.toNanos(3));
        failure(ClosedException.class, f);
        assertThrows(ClosedException.class, c::ping);
    }

    // ---- sessions ----

    @Test
    void resumedSessionResendsUnansweredRequestsWithTheirIdsBeforeNewOnes() throws Exception {
        TicketingClient c = connect();
        CompletableFuture<Lock> f = c.acquireAsync("k", Duration.ofSeconds(5));
        FakeServer.Received first = server.expect(Op.ACQUIRE);
        CompletableFuture<LockInfo> insp = c.inspectAsync("other", 0);
        FakeServer.Received second = server.expect(Op.INSPECT);
        first.conn().kill();
        FakeServer.Received retry1 = server.expect(Op.ACQUIRE);
        FakeServer.Received retry2 = server.expect(Op.INSPECT);
        assertTrue(retry1.conn().resumed);
        assertEquals(first.id(), retry1.id());
        assertEquals(second.id(), retry2.id());
        assertArrayEquals(first.frame().key(), retry1.frame().key());
        assertEquals(first.frame().leaseMs(), retry1.frame().leaseMs());
        CompletableFuture<Duration> later = c.pingAsync();
        server.autoPing = true;
        later.get(5, TimeUnit.SECONDS);
        grant(retry1, 9);
        retry2.conn().send(new ResponseFrame(Op.INSPECT.code(), 0, retry2.id(), 0, 0, 0, new byte[12]));
        assertEquals(9, f.get(5, TimeUnit.SECONDS).token());
        assertFalse(insp.get(5, TimeUnit.SECONDS).held());
    }

    /**
     * A grant decided before the re-send and read after it (the hand-off to a resumed session): the
     * deadline counts from the first send, with the answer's detail (ms since the first arrival) and
     * lease (the lease left), never from the re-send (that would be 300 ms late).
     */
    @Test
    void grantReadAfterTheResendCountsFromTheFirstSend() throws Exception {
        TicketingClient c = connect(steadyClock(), b -> { });
        long sent = System.nanoTime();
        CompletableFuture<Lock> f = c.acquireAsync("k", Duration.ofSeconds(3));
        FakeServer.Received first = server.expect(Op.ACQUIRE);
        long arrived = System.nanoTime();
        server.refuse = Status.BUSY; // the session's next connection comes 300 ms later
        first.conn().kill();
        Thread.sleep(300);
        server.refuse = null;
        FakeServer.Received retry = server.expect(Op.ACQUIRE);
        assertEquals(first.id(), retry.id());
        assertTrue(retry.conn().resumed);
        // Granted 150 ms after the first arrival, while the client was away: the table's answer.
        long since = millisSince(arrived);
        retry.conn().reply(retry.frame(), Status.OK, 7, 3000 - (since - 150), since);
        Lock lock = f.get(5, TimeUnit.SECONDS);
        assertDeadline(lock, sent + local(3150), arrived + local(3150));
    }

    /**
     * A waiter granted long after its re-send: the answer's detail counts the time it spent queued
     * since the first arrival, so the deadline is not a second early.
     */
    @Test
    void waiterGrantedLongAfterItsResendCountsItsQueuedTime() throws Exception {
        TicketingClient c = connect(steadyClock(), b -> { });
        long sent = System.nanoTime();
        CompletableFuture<Lock> f = c.acquireAsync("k", Duration.ofSeconds(3));
        FakeServer.Received first = server.expect(Op.ACQUIRE);
        long arrived = System.nanoTime();
        first.conn().kill();
        FakeServer.Received retry = server.expect(Op.ACQUIRE);
        assertEquals(first.id(), retry.id());
        Thread.sleep(1000);
        long queued = millisSince(arrived);
        retry.conn().reply(retry.frame(), Status.OK, 7, 3000, queued);
        Lock lock = f.get(5, TimeUnit.SECONDS);
        assertDeadline(lock, sent + local(queued + 3000), arrived + local(queued + 3000));
    }

    @Test
    void endedSessionFailsUnansweredRequestsAndKeepsLocks() throws Exception {
        TicketingClient c = connect();
        CompletableFuture<Lock> f1 = c.acquireAsync("held", Duration.ofSeconds(30));
        grant(server.expect(Op.ACQUIRE), 3);
        Lock held = f1.get(5, TimeUnit.SECONDS);
        CompletableFuture<Lock> f2 = c.acquireAsync("waiting", Duration.ofSeconds(30));
        FakeServer.Received w = server.expect(Op.ACQUIRE);
        server.resume = false;
        w.conn().kill();
        failure(ConnectionLostException.class, f2);
        assertFalse(held.isLost());
        c.ping();
    }

    @Test
    void differentStateIdLosesEveryLockAndStartsANewSession() throws Exception {
        TicketingClient c = connect();
        String oldSession = c.sessionId();
        CompletableFuture<Lock> f1 = c.acquireAsync("held", Duration.ofSeconds(30));
        grant(server.expect(Op.ACQUIRE), 3);
        Lock held = f1.get(5, TimeUnit.SECONDS);
        CompletableFuture<Lock> f2 = c.acquireAsync("waiting", Duration.ofSeconds(30));
        FakeServer.Received w = server.expect(Op.ACQUIRE);
        server.newStateId();
        w.conn().kill();
        assertEquals(LostReason.SERVER_RESTARTED, held.lost().toCompletableFuture().get(5, TimeUnit.SECONDS));
        failure(ServerRestartedException.class, f2);
        assertNull(server.poll(Duration.ofMillis(300)), "the waiter is not re-queued");
        c.ping();
        assertNotEquals(oldSession, c.sessionId());
        assertEquals(c.sessionId(), server.hellos.get(server.hellos.size() - 1));
        // A lock lost to a restart: release answers at once and sends nothing (the new server has
        // nothing of the old state to release).
        CompletableFuture<Void> rel = held.releaseAsync();
        assertTrue(rel.isDone(), "the release of a lock known lost did not answer at once");
        assertEquals(LostReason.SERVER_RESTARTED, failure(LockLostException.class, rel).reason());
        assertNull(server.poll(Duration.ofMillis(300)), "a lock lost to a restart is not released on the new server");
    }

    @Test
    void graceOverFailsAwaitedRequests() throws Exception {
        server.graceMs = 300;
        TicketingClient c = connect(b -> b.requestTimeout(Duration.ofSeconds(20)));
        CompletableFuture<Void> rel = c.releaseAsync("k", 5);
        FakeServer.Received r = server.expect(Op.RELEASE);
        int port = server.port();
        server.close(); // nobody to reconnect to
        long t0 = System.nanoTime();
        failure(ConnectionLostException.class, rel);
        long ms = TimeUnit.NANOSECONDS.toMillis(System.nanoTime() - t0);
        assertTrue(ms < 5000, "failed after " + ms + " ms");
        assertEquals(port, server.port());
        assertEquals(Op.RELEASE, r.op());
    }

    // ---- reconnecting ----

    @Test
    void failedReconnectRoundsDoNotFailWaitingCallsUnlessNoRetryFixesThem() throws Exception {
        TicketingClient c = connect(b -> b.requestTimeout(Duration.ofSeconds(5)).heartbeatInterval(Duration.ZERO));
        server.connections.poll(5, TimeUnit.SECONDS); // (so that killAll finds it)
        server.refuse = Status.BUSY; // every round fails, as it would at a node at its connection limit
        server.killAll();
        CompletableFuture<Duration> ping = c.pingAsync();
        Thread.sleep(500);
        assertFalse(ping.isDone(), "a failed reconnect round failed a waiting call: " + ping);
        server.refuse = null;
        ping.get(5, TimeUnit.SECONDS);
        // An error no retry fixes fails every waiting call at once.
        server.refuse = Status.UNSUPPORTED_VERSION;
        server.refuseVersion = 2;
        server.killAll();
        long t0 = System.nanoTime();
        UnsupportedVersionException e = failure(UnsupportedVersionException.class, c.pingAsync());
        assertTrue(System.nanoTime() - t0 < TimeUnit.SECONDS.toNanos(3));
        assertTrue(e.getMessage().startsWith("the server at " + server.endpoint() + " speaks protocol version 2, this client 1"),
                e.getMessage());
    }

    /** Issue 27: the message named this client's version as the server's ("does not speak 1 (it speaks 1)"). */
    @Test
    void anUnsupportedVersionNamesBothVersions() throws Exception {
        server.refuse = Status.UNSUPPORTED_VERSION;
        server.refuseVersion = 3;
        UnsupportedVersionException e = assertThrows(UnsupportedVersionException.class,
                () -> connect(b -> b.connectTimeout(Duration.ofSeconds(5))));
        assertEquals("the server at " + server.endpoint() + " speaks protocol version 3, this client 1", e.getMessage());
        // A server that names this client's own version while refusing it is not said to speak another.
        server.refuseVersion = 1;
        e = assertThrows(UnsupportedVersionException.class, () -> connect(b -> b.connectTimeout(Duration.ofSeconds(5))));
        assertEquals("the server at " + server.endpoint() + " refused protocol version 1, although it names 1 as its own",
                e.getMessage());
    }

    @Test
    @Timeout(60) // the class's 30 s is below this test's own 40 s poll: a slow run ended as a timeout
    void afterARoundWithNotLeaderTheNextPauseIsTheShortest() throws Exception {
        FakeServer follower = new FakeServer();
        closeables.add(follower);
        follower.stateId = server.stateId;
        follower.notLeaderHint = ""; // electing: it knows no leader yet
        TicketingClient c = connect(b -> b.endpoints(server.endpoint(), follower.endpoint())
                .reconnectBackoff(Duration.ofMillis(50), Duration.ofSeconds(2)));
        CompletableFuture<Lock> f = c.acquireAsync("k", Duration.ofSeconds(30));
        grant(server.expect(Op.ACQUIRE), 7);
        Lock lock = f.get(5, TimeUnit.SECONDS);
        server.close(); // refused from now on
        // Eleven rounds reach the follower. Doubling pauses (50, 100, 200 ... 2000 ms, jitter down
        // to half) would take at most about 12 s for them; the wait is wide so that a loaded
        // machine's slowness is never taken for the backoff.
        long end = System.nanoTime() + TimeUnit.SECONDS.toNanos(40);
        while (follower.hellos.size() < 11 && System.nanoTime() < end) {
            Thread.sleep(10);
        }
        List<Long> at = new ArrayList<>(follower.helloTimes);
        List<Long> gaps = new ArrayList<>();
        for (int i = 1; i < at.size(); i++) {
            gaps.add(TimeUnit.NANOSECONDS.toMillis(at.get(i) - at.get(i - 1)));
        }
        // (Once seen under load: fewer than eleven in 40 s. The gaps say whether the backoff grew
        // or the rounds stopped.)
        assertTrue(at.size() >= 11, at.size() + " reconnect rounds reached the follower in 40 s, not eleven; "
                + "gaps between them (ms): " + gaps);
        // The pauses themselves: with doubling, the pause before the 7th round and every later one
        // is at least 800 ms (base 1600 ms, jitter down to half); the shortest pause is 25-50 ms.
        // A busy machine may stretch some of these five gaps, not all of them by 350 ms.
        long shortest = Long.MAX_VALUE;
        for (int i = 6; i < 11; i++) {
            shortest = Math.min(shortest, at.get(i) - at.get(i - 1));
        }
        assertTrue(shortest < TimeUnit.MILLISECONDS.toNanos(400), "the rounds 7 to 11 came at least "
                + TimeUnit.NANOSECONDS.toMillis(shortest) + " ms apart: the backoff grew during the election");
        assertFalse(lock.lost().toCompletableFuture().isDone());
    }

    @Test
    void aCallTimingOutWhileReconnectingNamesTheLastConnectError() throws Exception {
        TicketingClient c = connect(b -> b.requestTimeout(Duration.ofMillis(500)).heartbeatInterval(Duration.ZERO));
        server.autoPing = false;
        CompletableFuture<Duration> sent = c.pingAsync();
        server.expect(Op.PING); // never answered
        server.close(); // refused from now on
        RequestTimeoutException e = failure(RequestTimeoutException.class, sent);
        assertTrue(e.getMessage().contains("not connected, last connect error: ")
                && e.getMessage().contains(server.endpoint()), e.getMessage());
        assertTrue(e.getCause() instanceof UnavailableException, String.valueOf(e.getCause()));
        // A call made while reconnecting: the same.
        e = failure(RequestTimeoutException.class, c.acquireAsync("k", Duration.ofSeconds(5)));
        assertTrue(e.getMessage().contains("last connect error: "), e.getMessage());
        assertTrue(e.getCause() instanceof UnavailableException, String.valueOf(e.getCause()));
    }

    @Test
    void closedDuringTheHandshakeAfterTlsIsUnavailable(@TempDir Path dir) throws Exception {
        Certs certs = Certs.make(dir);
        SSLServerSocket tls = (SSLServerSocket) Pem.context(TlsOptions.builder().trustCertificates(certs.ca)
                .clientCertificate(certs.serverCert, certs.serverKey).build())
                .getServerSocketFactory().createServerSocket(0, 50, InetAddress.getLoopbackAddress());
        closeables.add(tls);
        Thread t = new Thread(() -> {
            try (Socket s = tls.accept()) { // CHALLENGE, then the node goes away before WELCOME
                new DataInputStream(s.getInputStream()).readFully(new byte[Protocol.HELLO]);
                s.getOutputStream().write(new Handshake.Challenge(0, 1, 0, 0, new byte[32], new byte[0]).encode());
                s.getOutputStream().flush();
                new DataInputStream(s.getInputStream()).readFully(new byte[Protocol.AUTH]);
            } catch (Exception ignored) {
                // the test fails on the client's side
            }
        });
        t.setDaemon(true);
        t.start();
        UnavailableException e = assertThrows(UnavailableException.class, () -> TicketingClient.connect(
                ClientOptions.builder().endpoints("127.0.0.1:" + tls.getLocalPort()).connectTimeout(Duration.ofSeconds(5))
                        .tls(TlsOptions.builder().trustCertificates(certs.ca).build()).build()));
        assertTrue(e.getMessage().contains("closed during the handshake"), e.getMessage());
        // Refused NOT_LEADER, or closed before the CHALLENGE without TLS: the same.
        server.notLeaderHint = "";
        assertThrows(UnavailableException.class, () -> connect(b -> b.requestTimeout(Duration.ofMillis(200))));
        server.notLeaderHint = null;
        try (var plain = new java.net.ServerSocket(0, 50, InetAddress.getLoopbackAddress())) {
            Thread p = new Thread(() -> {
                try (Socket s = plain.accept()) {
                    new DataInputStream(s.getInputStream()).readFully(new byte[Protocol.HELLO]);
                } catch (Exception ignored) {
                    // the test fails on the client's side
                }
            });
            p.setDaemon(true);
            p.start();
            assertThrows(UnavailableException.class, () -> TicketingClient.connect(
                    ClientOptions.builder().endpoints("127.0.0.1:" + plain.getLocalPort()).build()));
        }
    }

    @Test
    void goawayMovesToTheLeaderAndResumes() throws Exception {
        FakeServer leader = new FakeServer();
        closeables.add(leader);
        leader.stateId = server.stateId;
        TicketingClient c = connect();
        CompletableFuture<Lock> f = c.acquireAsync("k", Duration.ofSeconds(5));
        FakeServer.Received r = server.expect(Op.ACQUIRE);
        byte[] hint = leader.endpoint().getBytes(StandardCharsets.UTF_8);
        leader.sessions = server.sessions; // a cluster replicates its sessions
        r.conn().send(new ResponseFrame(Op.GOAWAY.code(), 0, 0, 0, 0, GoawayReason.LEADERSHIP.code(), hint));
        FakeServer.Received retry = leader.expect(Op.ACQUIRE);
        assertEquals(r.id(), retry.id());
        grant(retry, 77);
        assertEquals(77, f.get(5, TimeUnit.SECONDS).token());
    }

    @Test
    void notLeaderAnswerIsResentToTheLeaderWithTheSameId() throws Exception {
        FakeServer leader = new FakeServer();
        closeables.add(leader);
        leader.stateId = server.stateId;
        TicketingClient c = connect();
        CompletableFuture<Void> rel = c.releaseAsync("k", 5);
        FakeServer.Received r = server.expect(Op.RELEASE);
        r.conn().send(new ResponseFrame(Op.RELEASE.code(), Status.NOT_LEADER.code(), r.id(), 0, 0, 0,
                leader.endpoint().getBytes(StandardCharsets.UTF_8)));
        FakeServer.Received again = leader.expect(Op.RELEASE);
        assertEquals(r.id(), again.id());
        assertFalse(again.conn().resumed); // a new session there: the not-run request is still sent
        again.conn().ok(again.frame());
        rel.get(5, TimeUnit.SECONDS);
    }

    @Test
    void malformedFrameFromTheServerReplacesTheConnection() throws Exception {
        TicketingClient c = connect();
        CompletableFuture<Duration> p = c.pingAsync();
        FakeServer.Conn first = server.connections.poll(5, TimeUnit.SECONDS);
        first.sendRaw(new byte[] {0, 0, 0, 5, 1, 2, 3, 4, 5}); // length below the header
        FakeServer.Conn second = server.connections.poll(5, TimeUnit.SECONDS);
        assertTrue(second != null && second.resumed);
        p.get(5, TimeUnit.SECONDS); // re-sent and answered on the new connection
    }

    @Test
    void randomFramesFromTheServerNeverBreakTheClient() throws Exception {
        TicketingClient c = connect(b -> b.heartbeatInterval(Duration.ZERO));
        CompletableFuture<Lock> f = c.acquireAsync("k", Duration.ofSeconds(30));
        FakeServer.Received acq = server.expect(Op.ACQUIRE);
        grant(acq, 5);
        Lock lock = f.get(5, TimeUnit.SECONDS);
        java.util.Random rnd = new java.util.Random(42);
        int[] ops = {0x10, 0x11, 0x12, 0x13, 0x14, 0x15, 0x16, 0x20, 0x21, 0x7f, 0};
        for (int i = 0; i < 500; i++) {
            byte[] data = new byte[rnd.nextInt(20)];
            rnd.nextBytes(data);
            int op = ops[rnd.nextInt(ops.length)];
            if (op == Op.GOAWAY.code()) {
                continue; // a valid GOAWAY only moves the connection: tested above
            }
            long id = rnd.nextInt(4) == 0 ? 0 : 1000 + rnd.nextInt(1000); // pushes and unknown ids
            acq.conn().send(new ResponseFrame(op, rnd.nextInt(12), id, rnd.nextLong(), rnd.nextInt() & 0xFFFFL,
                    rnd.nextInt() & 0xFFFFL, data));
        }
        c.ping(); // still served on the same connection
        assertEquals(1, server.all.size(), "no reconnect was needed");
        assertFalse(lock.isLost(), "no EXPIRED matched the lock's token and key");
    }

    // ---- ACK ----

    @Test
    void ackIsSentOncePerBatchOfAnswersAndNeverTwiceAtOnce() throws Exception {
        server.autoPing = false;
        TicketingClient c = connect(b -> b.heartbeatInterval(Duration.ZERO));
        Thread answerer = new Thread(() -> {
            try {
                while (true) {
                    FakeServer.Received r = server.next(Duration.ofSeconds(20));
                    if (r.op() == Op.PING) {
                        r.conn().ok(r.frame());
                    } else {
                        acks.add(r);
                    }
                }
            } catch (InterruptedException | AssertionError e) {
                // done
            }
        });
        answerer.setDaemon(true);
        answerer.start();
        for (int i = 0; i < 1500; i++) {
            c.pingAsync().get(5, TimeUnit.SECONDS);
        }
        Poll.until(Duration.ofSeconds(5), () -> !acks.isEmpty(), "an ACK");
        FakeServer.Received ack = acks.get(0);
        assertEquals(Op.ACK, ack.op());
        assertEquals(ack.id(), ack.frame().token(), "nothing awaited: x is the next id (the ACK's own)");
        Thread.sleep(100);
        assertEquals(1, acks.size(), "no second ACK while the first is unanswered");
        ack.conn().ok(ack.frame());
        for (int i = 0; i < 600; i++) {
            c.pingAsync().get(5, TimeUnit.SECONDS);
        }
        Poll.until(Duration.ofSeconds(5), () -> acks.size() == 2, "the next ACK");
        answerer.interrupt();
    }

    private final List<FakeServer.Received> acks = new java.util.concurrent.CopyOnWriteArrayList<>();

    // ---- locks ----

    @Test
    void releaseNotHeldFiresLostOnceAndRaises() throws Exception {
        TicketingClient c = connect();
        CompletableFuture<Lock> f = c.acquireAsync("k", Duration.ofSeconds(30));
        grant(server.expect(Op.ACQUIRE), 8);
        Lock lock = f.get(5, TimeUnit.SECONDS);
        AtomicInteger lostCalls = new AtomicInteger();
        lock.onLost(r -> lostCalls.incrementAndGet());
        CompletableFuture<Void> rel = lock.releaseAsync();
        FakeServer.Received r = server.expect(Op.RELEASE);
        r.conn().reply(r.frame(), Status.NOT_HELD, 0, 0, 0);
        assertEquals(LostReason.NOT_HELD, failure(LockLostException.class, rel).reason());
        Poll.until(Duration.ofSeconds(2), () -> lostCalls.get() == 1, "lost listener");
        lock.release(); // released (found gone): nothing more is sent
        assertNull(server.poll(Duration.ofMillis(200)));
        assertEquals(1, lostCalls.get());
    }

    @Test
    void tryWithResourcesReleasesAndReportsALostLock() throws Exception {
        TicketingClient c = connect();
        CompletableFuture<Lock> f = c.acquireAsync("k", Duration.ofSeconds(30));
        FakeServer.Received a = server.expect(Op.ACQUIRE);
        grant(a, 8);
        Lock lock = f.get(5, TimeUnit.SECONDS);
        CompletableFuture<Void> body = CompletableFuture.runAsync(() -> {
            try (Lock l = lock) {
                a.conn().send(new ResponseFrame(Op.EXPIRED.code(), 0, 0, 8, 0, 1, key("k")));
                l.lost().toCompletableFuture().join();
            }
        });
        FakeServer.Received rel = server.expect(Op.RELEASE);
        rel.conn().reply(rel.frame(), Status.NOT_HELD, 0, 0, 0);
        LockLostException e = failure(LockLostException.class, body);
        assertEquals(LostReason.EXPIRED, e.reason());
    }

    @Test
    void closeDoesNotReleaseUnlessAsked() throws Exception {
        TicketingClient c = connect();
        CompletableFuture<Lock> f = c.acquireAsync("k", Duration.ofSeconds(30));
        grant(server.expect(Op.ACQUIRE), 8);
        f.get(5, TimeUnit.SECONDS);
        c.close();
        assertNull(server.poll(Duration.ofMillis(300)), "close sends no RELEASE");

        TicketingClient c2 = connect(b -> b.releaseOnClose(true));
        CompletableFuture<Lock> f2 = c2.acquireAsync("k2", Duration.ofSeconds(30));
        grant(server.expect(Op.ACQUIRE), 9);
        f2.get(5, TimeUnit.SECONDS);
        CompletableFuture<Void> closing = c2.closeAsync();
        FakeServer.Received rel = server.expect(Op.RELEASE);
        assertEquals(9, rel.frame().token());
        rel.conn().ok(rel.frame());
        closing.get(5, TimeUnit.SECONDS);
    }

    /**
     * Keep-alive: EXTEND with the lease every lease/3, so the lock outlives its first lease; none
     * after the release. The margins come from the lease (issue 27: a 300 ms lease failed on a
     * loaded machine, where answering an EXTEND took longer than the 200 ms the lease left): each
     * EXTEND is answered with 2/3 of a 1.5 s lease to spare, and "none after the release" waits
     * more than a keep-alive period.
     */
    @Test
    void extendMovesTheDeadlineAndKeepAliveStopsAtRelease() throws Exception {
        long leaseMs = 1500;
        TicketingClient c = connect(b -> b.heartbeatInterval(Duration.ZERO));
        CompletableFuture<Lock> f = c.acquireAsync("k", AcquireOptions.builder(Duration.ofMillis(leaseMs)).keepAlive(true).build());
        grant(server.expect(Op.ACQUIRE), 8);
        Lock lock = f.get(5, TimeUnit.SECONDS);
        long granted = System.nanoTime();
        while (millisSince(granted) <= leaseMs + leaseMs / 3) { // past the first lease, with a margin
            FakeServer.Received ext = server.next(Duration.ofMillis(10 * leaseMs));
            assertEquals(Op.EXTEND, ext.op());
            assertEquals(8, ext.frame().token());
            assertEquals(leaseMs, ext.frame().leaseMs());
            ext.conn().reply(ext.frame(), Status.OK, 8, leaseMs, 0);
        }
        assertFalse(lock.isLost(), "kept alive past its first lease"); // (its first deadline has passed)
        assertTrue(lock.timeLeft().toMillis() > 0);
        CompletableFuture<Void> rel = lock.releaseAsync();
        FakeServer.Received r = server.next();
        while (r.op() == Op.EXTEND) { // one may have been on its way
            r.conn().reply(r.frame(), Status.OK, 8, leaseMs, 0);
            r = server.next();
        }
        assertEquals(Op.RELEASE, r.op());
        r.conn().ok(r.frame());
        rel.get(5, TimeUnit.SECONDS);
        assertNull(server.poll(Duration.ofMillis(leaseMs / 3 * 2)), "no extend after the release");
        assertFalse(lock.lost().toCompletableFuture().isDone());
    }

    /** EXTEND OK: deadline = t_first(EXTEND) + lease · (1 − 2ρ), the re-send after a resume changing nothing. */
    @Test
    void extendDeadlineCountsFromItsFirstSend() throws Exception {
        TicketingClient c = connect(steadyClock(), b -> { });
        CompletableFuture<Lock> f = c.acquireAsync("k", Duration.ofSeconds(30));
        grant(server.expect(Op.ACQUIRE), 8);
        Lock lock = f.get(5, TimeUnit.SECONDS);
        long sent = System.nanoTime();
        CompletableFuture<Duration> ext = lock.extendAsync(Duration.ofSeconds(3));
        FakeServer.Received first = server.expect(Op.EXTEND);
        long arrived = System.nanoTime();
        server.refuse = Status.BUSY; // the re-send goes out 300 ms later
        first.conn().kill();
        Thread.sleep(300);
        server.refuse = null;
        FakeServer.Received retry = server.expect(Op.EXTEND);
        assertEquals(first.id(), retry.id());
        retry.conn().reply(retry.frame(), Status.OK, 8, 3000, 0);
        assertEquals(Duration.ofSeconds(3), ext.get(5, TimeUnit.SECONDS));
        assertDeadline(lock, sent + local(3000), arrived + local(3000));
    }

    /**
     * Two extends in flight: the server applies them in id order, so the answer to the older one,
     * read after the newer one's, does not move the deadline even though its lease is longer.
     */
    @Test
    void olderExtendsAnswerReadAfterANewerOnesDoesNotMoveTheDeadline() throws Exception {
        TicketingClient c = connect(steadyClock(), b -> { });
        CompletableFuture<Lock> f = c.acquireAsync("k", Duration.ofSeconds(30));
        grant(server.expect(Op.ACQUIRE), 8);
        Lock lock = f.get(5, TimeUnit.SECONDS);
        CompletableFuture<Duration> older = lock.extendAsync(Duration.ofSeconds(60));
        FakeServer.Received e1 = server.expect(Op.EXTEND);
        long sent = System.nanoTime();
        CompletableFuture<Duration> newer = lock.extendAsync(Duration.ofSeconds(2));
        FakeServer.Received e2 = server.expect(Op.EXTEND);
        long arrived = System.nanoTime();
        assertTrue(e2.id() > e1.id());
        e2.conn().reply(e2.frame(), Status.OK, 8, 2000, 0);
        e1.conn().reply(e1.frame(), Status.OK, 8, 60000, 0);
        assertEquals(Duration.ofSeconds(60), older.get(5, TimeUnit.SECONDS)); // the server did grant it
        assertEquals(Duration.ofSeconds(2), newer.get(5, TimeUnit.SECONDS));
        assertDeadline(lock, sent + local(2000), arrived + local(2000));
        assertEquals(Duration.ofSeconds(2), lock.lease());
    }

    /**
     * A suspend (seen as the wall clock running ahead of the monotonic one, which stops) passes a
     * lock's deadline while its timer, on the monotonic clock, is still far off: the lost check
     * fires lost within LOST_CHECK_MS, and a call that asks about the lock's state sees it at once.
     */
    @Test
    void aSuspendPastTheDeadlineLosesTheLockWithinTheLostCheck() throws Exception {
        AtomicLong suspended = new AtomicLong();
        TicketingClient c = connect(new SuspendClock(System::nanoTime, () -> System.nanoTime() + suspended.get()),
                b -> b.heartbeatInterval(Duration.ZERO));
        CompletableFuture<Lock> f1 = c.acquireAsync("a", Duration.ofSeconds(30));
        grant(server.expect(Op.ACQUIRE), 8);
        Lock a = f1.get(5, TimeUnit.SECONDS);
        Thread.sleep(2 * Protocol.LOST_CHECK_MS); // checks that find nothing change nothing
        assertFalse(a.lost().toCompletableFuture().isDone());

        suspended.addAndGet(TimeUnit.SECONDS.toNanos(40));
        long t0 = System.nanoTime();
        assertEquals(LostReason.EXPIRED, a.lost().toCompletableFuture().get(5, TimeUnit.SECONDS));
        long ms = millisSince(t0);
        assertTrue(ms <= Protocol.LOST_CHECK_MS + 100, "lost " + ms + " ms after the suspend");

        CompletableFuture<Lock> f2 = c.acquireAsync("b", Duration.ofSeconds(30));
        grant(server.expect(Op.ACQUIRE), 9);
        Lock b = f2.get(5, TimeUnit.SECONDS);
        assertFalse(b.isLost());
        suspended.addAndGet(TimeUnit.SECONDS.toNanos(40));
        assertTrue(b.isLost(), "isLost() checks the deadline against the clock");
        assertTrue(b.timeLeft().isNegative());
        assertEquals(LostReason.EXPIRED, b.lost().toCompletableFuture().get(5, TimeUnit.SECONDS));
    }

    /**
     * A deadline farther than Lock.ARM_AHEAD_NANOS has no timer at first: the lost check sets it as
     * the deadline comes close, and the lock is still lost at its deadline (less the margin), not
     * at the next check after it. Leases staggered across the check's period; one deadline moved
     * from near to far by an extend is lost at the new one.
     */
    @Test
    void farDeadlinesAreLostAtTheDeadlineNotAtTheNextCheck() throws Exception {
        TicketingClient c = connect(steadyClock(), b -> b.heartbeatInterval(Duration.ZERO));
        long[] leases = {1200, 1260, 1330, 1390, 1450}; // beyond ARM_AHEAD_NANOS (1 s)
        long[] sent = new long[leases.length];
        long[] lostAt = new long[leases.length + 1];
        List<CompletableFuture<?>> lost = new ArrayList<>();
        for (int i = 0; i < leases.length; i++) {
            sent[i] = System.nanoTime(); // (at or before the ACQUIRE's send: the deadline counts from it)
            CompletableFuture<Lock> f = c.acquireAsync("far-" + i, Duration.ofMillis(leases[i]));
            grant(server.expect(Op.ACQUIRE), 10 + i);
            int n = i;
            lost.add(f.get(5, TimeUnit.SECONDS).lost().toCompletableFuture().whenComplete((r, e) -> lostAt[n] = System.nanoTime()));
        }
        // A lease of 300 ms (its timer set at once), extended to 1700 ms: the deadline moves far.
        CompletableFuture<Lock> fe = c.acquireAsync("far-extended", Duration.ofMillis(300));
        grant(server.expect(Op.ACQUIRE), 20);
        Lock extended = fe.get(5, TimeUnit.SECONDS);
        long extSent = System.nanoTime();
        CompletableFuture<Duration> ext = extended.extendAsync(Duration.ofMillis(1700));
        FakeServer.Received re = server.expect(Op.EXTEND);
        re.conn().reply(re.frame(), Status.OK, 20, 1700, 0);
        ext.get(5, TimeUnit.SECONDS);
        lost.add(extended.lost().toCompletableFuture().whenComplete((r, e) -> lostAt[leases.length] = System.nanoTime()));

        CompletableFuture.allOf(lost.toArray(new CompletableFuture<?>[0])).get(10, TimeUnit.SECONDS);
        long margin = TimeUnit.MILLISECONDS.toNanos(Protocol.LOST_MARGIN_MS);
        for (int i = 0; i <= leases.length; i++) {
            long due = i < leases.length ? sent[i] + local(leases[i]) - margin : extSent + local(1700) - margin;
            long early = due - lostAt[i];
            assertTrue(early <= TimeUnit.MILLISECONDS.toNanos(2), "lock " + i + " lost "
                    + TimeUnit.NANOSECONDS.toMillis(early) + " ms before its deadline");
            // (sent[i] is at or before the send: the true deadline is a little later than due)
            assertTrue(-early <= TimeUnit.MILLISECONDS.toNanos(150), "lock " + i + " lost "
                    + TimeUnit.NANOSECONDS.toMillis(-early) + " ms after its deadline");
        }
    }

    @Test
    void maxHoldStopsKeepAlive() throws Exception {
        TicketingClient c = connect();
        CompletableFuture<Lock> f = c.acquireAsync("k", AcquireOptions.builder(Duration.ofMillis(150))
                .keepAlive(true).maxHold(Duration.ofMillis(200)).build());
        grant(server.expect(Op.ACQUIRE), 8);
        Lock lock = f.get(5, TimeUnit.SECONDS);
        FakeServer.Received ext = server.expect(Op.EXTEND);
        ext.conn().reply(ext.frame(), Status.OK, 8, 150, 0);
        assertEquals(LostReason.EXPIRED, lock.lost().toCompletableFuture().get(5, TimeUnit.SECONDS));
        FakeServer.Received more;
        while ((more = server.poll(Duration.ofMillis(100))) != null) {
            assertEquals(Op.EXTEND, more.op());
            more.conn().reply(more.frame(), Status.OK, 8, 150, 0);
        }
    }

    @Test
    void extendNotHeldLosesTheLock() throws Exception {
        TicketingClient c = connect();
        CompletableFuture<Lock> f = c.acquireAsync("k", Duration.ofSeconds(30));
        grant(server.expect(Op.ACQUIRE), 8);
        Lock lock = f.get(5, TimeUnit.SECONDS);
        CompletableFuture<Duration> e = lock.extendAsync(Duration.ofSeconds(60));
        FakeServer.Received r = server.expect(Op.EXTEND);
        assertEquals(60000, r.frame().leaseMs());
        r.conn().reply(r.frame(), Status.NOT_HELD, 0, 0, 0);
        assertEquals(LostReason.NOT_HELD, failure(LockLostException.class, e).reason());
        assertEquals(LostReason.NOT_HELD, lock.lostReason().orElseThrow());
        assertThrows(LockLostException.class, () -> lock.extend(Duration.ofSeconds(1)));
    }

    @Test
    void refuseHeld() throws Exception {
        TicketingClient c = connect();
        CompletableFuture<Lock> f = c.acquireAsync("k", Duration.ofSeconds(30));
        grant(server.expect(Op.ACQUIRE), 8);
        f.get(5, TimeUnit.SECONDS);
        assertThrows(AlreadyHeldException.class, () -> c.acquire("k",
                AcquireOptions.builder(Duration.ofSeconds(1)).refuseHeld(true).build()));
        assertNull(server.poll(Duration.ofMillis(200)));
        c.acquireAsync("k", Duration.ofSeconds(1)); // without refuseHeld it queues behind itself
        assertEquals(Op.ACQUIRE, server.expect(Op.ACQUIRE).op());
    }

    // ---- the edges every client agrees on (issue 26) ----

    /**
     * A release of a lock already known lost answers lock-lost at once, even when the server does
     * not answer (it never waits out the request timeout), and tells the server in the background.
     */
    @Test
    void releaseOfALostLockAnswersAtOnceAndTellsTheServerInTheBackground() throws Exception {
        long timeoutMs = 20_000;
        TicketingClient c = connect(b -> b.requestTimeout(Duration.ofMillis(timeoutMs)));
        CompletableFuture<Lock> f = c.acquireAsync("k", Duration.ofSeconds(30));
        FakeServer.Received a = server.expect(Op.ACQUIRE);
        grant(a, 8);
        Lock lock = f.get(5, TimeUnit.SECONDS);
        a.conn().send(new ResponseFrame(Op.EXPIRED.code(), 0, 0, 8, 0, ExpiredReason.LEASE.code(), key("k")));
        assertEquals(LostReason.EXPIRED, lock.lost().toCompletableFuture().get(5, TimeUnit.SECONDS));
        long t0 = System.nanoTime();
        LockLostException e = assertThrows(LockLostException.class, lock::release); // the server never answers
        assertEquals(LostReason.EXPIRED, e.reason());
        assertTrue(millisSince(t0) < timeoutMs / 2, "the release of a lost lock took " + millisSince(t0) + " ms");
        FakeServer.Received told = server.expect(Op.RELEASE); // in the background
        assertEquals(8, told.frame().token());
        assertArrayEquals(key("k"), told.frame().key());
        lock.release(); // released: nothing more happens
        assertNull(server.poll(Duration.ofMillis(200)));

        // Lost to a NOT_HELD answer: nothing is left to release, nothing is sent.
        CompletableFuture<Lock> f2 = c.acquireAsync("k2", Duration.ofSeconds(30));
        grant(server.expect(Op.ACQUIRE), 9);
        Lock other = f2.get(5, TimeUnit.SECONDS);
        CompletableFuture<Duration> ext = other.extendAsync(Duration.ofSeconds(30));
        FakeServer.Received er = server.expect(Op.EXTEND);
        er.conn().reply(er.frame(), Status.NOT_HELD, 0, 0, 0);
        failure(LockLostException.class, ext);
        assertEquals(LostReason.NOT_HELD, assertThrows(LockLostException.class, other::release).reason());
        assertNull(server.poll(Duration.ofMillis(200)), "a lock lost to NOT_HELD is not released again");
    }

    /**
     * The first calls after a restart (a new state id) that never reached the old server go to the
     * new one; requests in flight on the old state and held locks fail {@code server restarted}. A
     * lock handle's release made meanwhile is not sent (nothing of the old state is left).
     */
    @Test
    void callsMadeWhileReconnectingGoToARestartedServer() throws Exception {
        TicketingClient c = connect(b -> b.heartbeatInterval(Duration.ZERO));
        CompletableFuture<Lock> f1 = c.acquireAsync("held", Duration.ofSeconds(30));
        grant(server.expect(Op.ACQUIRE), 3);
        Lock held = f1.get(5, TimeUnit.SECONDS);
        CompletableFuture<Lock> inFlight = c.acquireAsync("waiting", Duration.ofSeconds(30));
        FakeServer.Received w = server.expect(Op.ACQUIRE);
        server.refuse = Status.BUSY; // every reconnect round fails until the "restart"
        int before = server.hellos.size();
        w.conn().kill();
        Poll.until(Duration.ofSeconds(5), () -> server.hellos.size() > before, "a reconnect round");
        CompletableFuture<Duration> ping = c.pingAsync(); // made while the client reconnects
        CompletableFuture<Lock> later = c.acquireAsync("new", Duration.ofSeconds(30), Duration.ZERO);
        CompletableFuture<Void> rel = held.releaseAsync(); // the lock is not known lost yet
        Thread.sleep(100);
        assertFalse(ping.isDone() || later.isDone() || rel.isDone());
        server.newStateId();
        server.refuse = null;

        failure(ServerRestartedException.class, inFlight);
        assertEquals(LostReason.SERVER_RESTARTED, held.lost().toCompletableFuture().get(5, TimeUnit.SECONDS));
        assertEquals(LostReason.SERVER_RESTARTED, failure(LockLostException.class, rel).reason());
        ping.get(5, TimeUnit.SECONDS); // answered by the new server (autoPing)
        FakeServer.Received acq = server.expect(Op.ACQUIRE); // the new acquire, and nothing before it
        assertArrayEquals(key("new"), acq.frame().key());
        assertEquals(0, acq.frame().waitMs());
        grant(acq, 20);
        assertEquals(20, later.get(5, TimeUnit.SECONDS).token());
        assertNull(server.poll(Duration.ofMillis(300)), "nothing of the old state is sent to the new server");
    }

    /**
     * The library is silent until the application configures logging: routine events (a dropped
     * connection, a reconnect, a restarted server, a failed round) log below INFO.
     */
    @Test
    void routineEventsLogNothingAtInfoOrAbove() throws Exception {
        java.util.logging.Logger jul = java.util.logging.Logger.getLogger("io.ticketing");
        java.util.logging.Level level = jul.getLevel();
        List<java.util.logging.LogRecord> loud = new java.util.concurrent.CopyOnWriteArrayList<>();
        List<java.util.logging.LogRecord> all = new java.util.concurrent.CopyOnWriteArrayList<>();
        java.util.logging.Handler h = new java.util.logging.Handler() {
            @Override
            public void publish(java.util.logging.LogRecord r) {
                all.add(r);
                if (r.getLevel().intValue() >= java.util.logging.Level.INFO.intValue()) {
                    loud.add(r);
                }
            }

            @Override
            public void flush() {
            }

            @Override
            public void close() {
            }
        };
        jul.setLevel(java.util.logging.Level.ALL);
        jul.addHandler(h);
        try {
            TicketingClient c = connect();
            CompletableFuture<Lock> f = c.acquireAsync("k", Duration.ofSeconds(30));
            grant(server.expect(Op.ACQUIRE), 3);
            Lock lock = f.get(5, TimeUnit.SECONDS);
            server.refuse = Status.BUSY;
            int before = server.hellos.size();
            server.killAll();
            Poll.until(Duration.ofSeconds(5), () -> server.hellos.size() > before + 1, "failed reconnect rounds");
            server.newStateId();
            server.refuse = null;
            assertEquals(LostReason.SERVER_RESTARTED, lock.lost().toCompletableFuture().get(5, TimeUnit.SECONDS));
            c.ping();
            c.close();
            assertTrue(loud.isEmpty(), "logged at INFO or above: " + loud.stream()
                    .map(r -> r.getLevel() + " " + r.getMessage()).toList());
            assertFalse(all.isEmpty(), "the routine events are logged at a debug level");
        } finally {
            jul.removeHandler(h);
            jul.setLevel(level);
        }
    }

    /**
     * Heartbeat liveness: while a request waits, a PING goes after 250 ms of silence (not the
     * 10 s interval); unanswered within min(heartbeat, 750 ms) (not the 30 s request timeout) the
     * connection is replaced and the session resumes, the call in flight is re-sent, not failed.
     */
    @Test
    void busyHeartbeatReplacesASilentConnectionWithoutFailingCalls() throws Exception {
        TicketingClient c = connect(b -> b.heartbeatInterval(Duration.ofSeconds(10)).requestTimeout(Duration.ofSeconds(30)));
        server.autoPing = false;
        CompletableFuture<Lock> f = c.acquireAsync("k", Duration.ofSeconds(30));
        FakeServer.Received a = server.expect(Op.ACQUIRE);
        long t0 = System.nanoTime();
        FakeServer.Received ping = server.next(Duration.ofSeconds(8));
        assertEquals(Op.PING, ping.op());
        long pingMs = millisSince(t0);
        assertTrue(pingMs < 5000, "PING " + pingMs + " ms after the request (the busy heartbeat is 250 ms)");
        server.autoPing = true; // (the first PING stays unanswered)
        FakeServer.Conn second = null;
        while (second == null || second == a.conn()) {
            second = server.connections.poll(15, TimeUnit.SECONDS);
            assertTrue(second != null, "the silent connection was not replaced");
        }
        assertTrue(millisSince(t0) < 15_000, "replaced after " + millisSince(t0) + " ms");
        assertTrue(second.resumed, "the session was not resumed");
        FakeServer.Received retry = server.expect(Op.ACQUIRE);
        assertEquals(a.id(), retry.id());
        assertFalse(f.isDone(), "the call in flight failed: " + f);
        grant(retry, 11);
        assertEquals(11, f.get(5, TimeUnit.SECONDS).token());
    }

    /**
     * After a node stopped answering, the next round starts at the next endpoint: a frozen node's
     * kernel still accepts connections (and would hold the round for the handshake wait).
     */
    @Test
    void silentNodeIsTriedLast() throws Exception {
        FakeServer second = new FakeServer();
        closeables.add(second);
        second.stateId = server.stateId;
        second.sessions = server.sessions; // a cluster: the session lives on
        TicketingClient c = connect(b -> b.endpoints(server.endpoint(), second.endpoint())
                .heartbeatInterval(Duration.ofSeconds(10)));
        CompletableFuture<Lock> f = c.acquireAsync("k", Duration.ofSeconds(30));
        FakeServer.Received a = server.expect(Op.ACQUIRE);
        server.frozen = true; // answers nothing, handshakes included
        FakeServer.Conn moved = second.connections.poll(15, TimeUnit.SECONDS);
        assertTrue(moved != null && moved.resumed, "the session did not resume on the second endpoint");
        assertEquals(1, server.hellos.size(), "the silent node was dialled again before the next one");
        FakeServer.Received retry = second.expect(Op.ACQUIRE);
        assertEquals(a.id(), retry.id());
        grant(retry, 4);
        assertEquals(4, f.get(5, TimeUnit.SECONDS).token());
    }

    /**
     * The other nodes keep naming a frozen leader until they elect another one: for 2 s the client
     * neither dials the node it just found silent nor follows a hint to it (it would accept TCP and
     * cost the handshake wait), and goes on to the next endpoint.
     */
    @Test
    void silentNodeIsNotFollowedAsAHint() throws Exception {
        FakeServer second = new FakeServer();
        FakeServer third = new FakeServer();
        closeables.add(second);
        closeables.add(third);
        second.notLeaderHint = server.endpoint(); // still names the frozen node as the leader
        third.stateId = server.stateId;
        third.sessions = server.sessions; // a cluster: the session lives on
        TicketingClient c = connect(b -> b.endpoints(server.endpoint(), second.endpoint(), third.endpoint())
                .heartbeatInterval(Duration.ofSeconds(10)));
        CompletableFuture<Lock> f = c.acquireAsync("k", Duration.ofSeconds(30));
        FakeServer.Received a = server.expect(Op.ACQUIRE);
        server.frozen = true; // answers nothing, handshakes included
        FakeServer.Conn moved = third.connections.poll(15, TimeUnit.SECONDS);
        assertTrue(moved != null && moved.resumed, "the session did not resume on the third endpoint");
        assertFalse(second.hellos.isEmpty(), "the second endpoint was not asked");
        assertEquals(1, server.hellos.size(), "the hint to the silent node was followed");
        FakeServer.Received retry = third.expect(Op.ACQUIRE);
        assertEquals(a.id(), retry.id());
        grant(retry, 5);
        assertEquals(5, f.get(5, TimeUnit.SECONDS).token());
        Thread.sleep(100);
        assertEquals(1, server.hellos.size(), "the silent node was dialled again");
    }

    /** Once TCP is connected, TLS and the handshake get 2 s, whatever the connect timeout. */
    @Test
    void handshakeGetsTwoSecondsAfterTheTcpConnect() {
        server.frozen = true;
        long t0 = System.nanoTime();
        UnavailableException e = assertThrows(UnavailableException.class,
                () -> connect(b -> b.connectTimeout(Duration.ofSeconds(25))));
        long ms = millisSince(t0);
        assertTrue(ms >= 1900 && ms < 12_000, "gave up after " + ms + " ms");
        assertTrue(e.getMessage().contains("2000 ms"), e.getMessage());
    }

    /** INSPECT's STARTUP flag, and a TIMED_OUT during the start-up wait says why. */
    @Test
    void startupWaitIsVisible() throws Exception {
        TicketingClient c = connect();
        CompletableFuture<LockInfo> in = c.inspectAsync("k", 0);
        FakeServer.Received r = server.expect(Op.INSPECT);
        byte[] data = java.nio.ByteBuffer.allocate(12).putInt(0).putInt(2700).putInt(0x10).array();
        r.conn().send(new ResponseFrame(Op.INSPECT.code(), 0, r.id(), 0, 0, 0, data));
        LockInfo info = in.get(5, TimeUnit.SECONDS);
        assertTrue(info.startup());
        assertFalse(info.held());
        assertEquals(Duration.ofMillis(2700), info.lockDelayLeft());

        CompletableFuture<Lock> f = c.acquireAsync("k", Duration.ofSeconds(5), Duration.ofMillis(300));
        FakeServer.Received a = server.expect(Op.ACQUIRE);
        String why = "the server is in its start-up wait: no grant for 2400 ms more";
        a.conn().send(new ResponseFrame(Op.ACQUIRE.code(), Status.TIMED_OUT.code(), a.id(), 0, 0, 0,
                why.getBytes(StandardCharsets.UTF_8)));
        NotAcquiredException e = failure(NotAcquiredException.class, f);
        assertTrue(e.getMessage().contains(why), e.getMessage());
        assertFalse(e.getMessage().contains("held by another token"), e.getMessage());
    }

    /** A message shows at most 64 bytes of a key, on one line, with the server's reason once. */
    @Test
    void messagesCutLongKeys() throws Exception {
        TicketingClient c = connect();
        String longKey = "k".repeat(5000);
        CompletableFuture<Lock> f = c.acquireAsync(longKey, Duration.ofSeconds(1), Duration.ZERO);
        FakeServer.Received a = server.expect(Op.ACQUIRE);
        String why = "key of 5000 bytes is longer than the server's max key length (256)";
        a.conn().send(new ResponseFrame(Op.ACQUIRE.code(), Status.INVALID.code(), a.id(), 0, 0, 2,
                (why + "\nsecond line").getBytes(StandardCharsets.UTF_8)));
        InvalidArgumentException e = failure(InvalidArgumentException.class, f);
        String m = e.getMessage();
        String shown = m.length() > 400 ? m.substring(0, 400) + "... (" + m.length() + " chars)" : m;
        assertTrue(m.length() < 300, m.length() + " chars: " + shown);
        assertTrue(m.contains(why), m);
        assertTrue(m.contains("k".repeat(64) + "\u2026(5000 bytes)"), m);
        assertFalse(m.contains("k".repeat(65)), m);
        assertFalse(m.contains("\n"), m);
        assertEquals(m.indexOf(why), m.lastIndexOf(why), m);
    }

    // ---- a burst of answers whose callbacks send requests (CallbackExecutor.cork) ----

    /** Answers every received INSPECT of {@code rs} in one write (one burst of answers for the client). */
    private static void answerInOneWrite(List<FakeServer.Received> rs) {
        java.io.ByteArrayOutputStream b = new java.io.ByteArrayOutputStream();
        for (FakeServer.Received r : rs) {
            b.writeBytes(new ResponseFrame(Op.INSPECT.code(), 0, r.id(), 0, 0, 0, new byte[12]).encode());
        }
        rs.get(0).conn().sendRaw(b.toByteArray());
    }

    private List<FakeServer.Received> inspects(int n) throws Exception {
        List<FakeServer.Received> rs = new ArrayList<>();
        for (int i = 0; i < n; i++) {
            rs.add(server.expect(Op.INSPECT));
        }
        return rs;
    }

    /**
     * A burst of answers queues a run of callback tasks; the requests those tasks send are written
     * together when the run ends (corked meanwhile): every one of them reaches the server.
     */
    @Test
    void requestsSentByARunOfCallbacksAllGoOut() throws Exception {
        TicketingClient c = connect();
        int n = 8;
        List<CompletableFuture<LockInfo>> chains = new ArrayList<>();
        for (int i = 0; i < n; i++) {
            String second = "second-" + i;
            chains.add(c.inspectAsync("first-" + i, 0).thenCompose(x -> c.inspectAsync(second, 0)));
        }
        answerInOneWrite(inspects(n));
        List<FakeServer.Received> seconds = inspects(n);
        java.util.Set<String> keys = new java.util.HashSet<>();
        for (FakeServer.Received r : seconds) {
            keys.add(new String(r.frame().key(), StandardCharsets.UTF_8));
        }
        assertEquals(n, keys.size(), keys.toString());
        answerInOneWrite(seconds);
        for (CompletableFuture<LockInfo> f : chains) {
            f.get(10, TimeUnit.SECONDS);
        }
    }

    /**
     * The reader thread lets the reading go to a callback thread that runs tasks (it reads when it
     * runs out: Engine.readerComing), but not to one blocked in the application's code: while the
     * only callback thread blocks, answers are still read, for the public futures (run by the
     * thread the stall check adds) and for the futures completed where the answer is read (the
     * Kotlin module's, io.ticketing.internal.Bridge).
     */
    @Test
    void answersAreReadWhileACallbackBlocksInTheApplicationsCode() throws Exception {
        TicketingClient c = connect(b -> b.heartbeatInterval(Duration.ZERO));
        java.util.concurrent.CountDownLatch blocked = new java.util.concurrent.CountDownLatch(1);
        java.util.concurrent.CountDownLatch unblock = new java.util.concurrent.CountDownLatch(1);
        CompletableFuture<LockInfo> first = c.inspectAsync("blocker", 0);
        FakeServer.Received answerLater = server.expect(Op.INSPECT);
        // (attached before the answer comes: it runs on a callback thread, not on this one)
        CompletableFuture<Void> stuck = first.thenRun(() -> {
            blocked.countDown();
            try {
                unblock.await(20, TimeUnit.SECONDS);
            } catch (InterruptedException e) {
                Thread.currentThread().interrupt();
            }
        });
        answerLater.conn().ok(answerLater.frame());
        try {
            assertTrue(blocked.await(5, TimeUnit.SECONDS));
            for (int i = 0; i < 20; i++) {
                c.pingAsync().get(5, TimeUnit.SECONDS);
                CompletableFuture<Lock> f = io.ticketing.internal.Bridge.ops().acquire(c, "k" + i,
                        AcquireOptions.of(Duration.ofSeconds(5), Duration.ZERO));
                grant(server.expect(Op.ACQUIRE), 10 + i);
                Lock lock = f.get(5, TimeUnit.SECONDS);
                CompletableFuture<Void> rel = io.ticketing.internal.Bridge.ops().release(lock);
                FakeServer.Received r = server.expect(Op.RELEASE);
                r.conn().ok(r.frame());
                rel.get(5, TimeUnit.SECONDS);
            }
        } finally {
            unblock.countDown();
        }
        stuck.get(5, TimeUnit.SECONDS);
    }

    /**
     * A callback that sends a request while others are queued, then blocks on its answer, is not
     * left with its frame corked behind the tasks it holds up: the stall check has it written (and
     * adds a callback thread for the rest). Every callback of the burst does so here, and the
     * server answers only once it has received all of their requests.
     */
    @Test
    void aCallbackBlockedOnItsOwnAnswerIsNotLeftCorked() throws Exception {
        TicketingClient c = connect(b -> b.requestTimeout(Duration.ofSeconds(20)).heartbeatInterval(Duration.ZERO));
        int n = 4;
        List<CompletableFuture<LockInfo>> chains = new ArrayList<>();
        for (int i = 0; i < n; i++) {
            String second = "second-" + i;
            chains.add(c.inspectAsync("first-" + i, 0).thenApply(x -> {
                try {
                    return c.inspectAsync(second, 0).get(20, TimeUnit.SECONDS);
                } catch (Exception e) {
                    throw new java.util.concurrent.CompletionException(e);
                }
            }));
        }
        answerInOneWrite(inspects(n));
        List<FakeServer.Received> seconds = new ArrayList<>();
        for (int i = 0; i < n; i++) {
            FakeServer.Received r = server.next(Duration.ofSeconds(10));
            assertTrue(r != null && r.op() == Op.INSPECT, "request " + i + " of the blocked callbacks never came: " + r);
            seconds.add(r);
        }
        answerInOneWrite(seconds);
        for (CompletableFuture<LockInfo> f : chains) {
            f.get(10, TimeUnit.SECONDS);
        }
    }

    /**
     * Only the first callback of a burst sends a request, then blocks on its answer; the tasks
     * after it send nothing: its frame, corked because they were queued, is still written (by the
     * stall check's writer, or by the callback thread that takes the last task).
     */
    @Test
    void aCorkedFrameGoesOutWhenNoLaterCallbackSends() throws Exception {
        // (no heartbeat: its PING would carry the frame out within 250 ms)
        TicketingClient c = connect(b -> b.requestTimeout(Duration.ofSeconds(20)).heartbeatInterval(Duration.ZERO));
        int n = 6;
        List<CompletableFuture<LockInfo>> chains = new ArrayList<>();
        for (int i = 0; i < n; i++) {
            boolean sends = i == 0;
            chains.add(c.inspectAsync("first-" + i, 0).thenApply(x -> {
                if (!sends) {
                    return x;
                }
                try {
                    return c.inspectAsync("second", 0).get(20, TimeUnit.SECONDS);
                } catch (Exception e) {
                    throw new java.util.concurrent.CompletionException(e);
                }
            }));
        }
        answerInOneWrite(inspects(n));
        FakeServer.Received r = server.next(Duration.ofSeconds(10));
        assertEquals(Op.INSPECT, r.op());
        assertEquals("second", new String(r.frame().key(), StandardCharsets.UTF_8));
        answerInOneWrite(List.of(r));
        for (CompletableFuture<LockInfo> f : chains) {
            f.get(10, TimeUnit.SECONDS);
        }
    }

    /** Blocking tryAcquire callers on keys crowd-0.., each in its own thread; their requests received. */
    private final class Crowd {
        final List<Thread> threads = new ArrayList<>();
        final List<CompletableFuture<Long>> tokens = new ArrayList<>();
        final FakeServer.Received[] requests;

        Crowd(TicketingClient c, int n) throws Exception {
            requests = new FakeServer.Received[n];
            for (int i = 0; i < n; i++) {
                String key = "crowd-" + i;
                CompletableFuture<Long> token = new CompletableFuture<>();
                Thread t = new Thread(() -> {
                    try {
                        token.complete(c.tryAcquire(key, Duration.ofSeconds(30)).orElseThrow().token());
                    } catch (Throwable e) {
                        token.completeExceptionally(e);
                    }
                }, key);
                tokens.add(token);
                threads.add(t);
                t.start();
            }
            for (int i = 0; i < n; i++) {
                FakeServer.Received r = server.expect(Op.ACQUIRE);
                requests[Integer.parseInt(new String(r.frame().key(), StandardCharsets.UTF_8).substring(6))] = r;
            }
        }

        /**
         * Waits until every caller still waiting (but {@code except}) is parked save one, and
         * returns that one: the caller holding the read role (in its selector, so not parked).
         * Fails when none reads.
         */
        int reader(int except) throws InterruptedException {
            int[] found = new int[1];
            Poll.until(Duration.ofSeconds(10), () -> {
                int running = 0;
                for (int i = 0; i < threads.size(); i++) {
                    if (tokens.get(i).isDone() || i == except) {
                        continue;
                    }
                    if (threads.get(i).getState() != Thread.State.WAITING) {
                        running++;
                        found[0] = i;
                    }
                }
                return running == 1;
            }, "one waiting caller reading, the others parked");
            return found[0];
        }

        /** Answers the requests of callers {@code which} in one write (token 100 + i for caller i). */
        void grant(List<Integer> which) {
            java.io.ByteArrayOutputStream b = new java.io.ByteArrayOutputStream();
            for (int i : which) {
                RequestFrame q = requests[i].frame();
                b.writeBytes(new ResponseFrame(Op.ACQUIRE.code(), Status.OK.code(), q.requestId(), 100 + i, q.leaseMs(), 0,
                        new byte[0]).encode());
            }
            requests[which.get(0)].conn().sendRaw(b.toByteArray());
        }

        /** Grants every caller but {@code first} in one write and checks each got its own token. */
        void grantAllBut(int first) throws Exception {
            List<Integer> rest = new ArrayList<>();
            for (int i = 0; i < threads.size(); i++) {
                if (i != first) {
                    rest.add(i);
                }
            }
            grant(rest);
            for (int i : rest) {
                assertEquals(100 + i, tokens.get(i).get(10, TimeUnit.SECONDS));
            }
        }
    }

    /**
     * However many blocking callers wait, one of them reads for all (Connection's read role): when
     * the reading caller's answer is in, the role goes to another waiting caller, never to the
     * reader thread (which would add a wake-up per read), and every caller gets its own answer.
     */
    @Test
    void aCrowdOfWaitingCallersIsReadForByOneOfThem() throws Exception {
        TicketingClient c = connect(b -> b.heartbeatInterval(Duration.ZERO));
        Crowd crowd = new Crowd(c, 4);
        Connection conn = c.engine().connection();
        long before = conn.readerFrames();
        int first = crowd.reader(-1);
        crowd.grant(List.of(first));
        assertEquals(100 + first, crowd.tokens.get(first).get(10, TimeUnit.SECONDS));
        int second = crowd.reader(first); // handed to a caller still waiting, the others parked
        assertNotEquals(first, second);
        crowd.grantAllBut(first);
        assertEquals(before, conn.readerFrames(), "answers read by the reader thread");
    }

    /**
     * A reading caller that is interrupted hands the role to another waiting caller: the others'
     * answers are still read (by a caller), and the interrupted one's acquire is withdrawn.
     */
    @Test
    void anInterruptedReadingCallerHandsTheRoleToAWaitingOne() throws Exception {
        TicketingClient c = connect(b -> b.heartbeatInterval(Duration.ZERO));
        Crowd crowd = new Crowd(c, 4);
        Connection conn = c.engine().connection();
        long before = conn.readerFrames();
        int first = crowd.reader(-1);
        crowd.threads.get(first).interrupt();
        FakeServer.Received cancel = server.expect(Op.CANCEL);
        assertEquals(crowd.requests[first].frame().requestId(), cancel.frame().token()); // CANCEL names the request id
        int second = crowd.reader(first);
        assertNotEquals(first, second);
        crowd.grantAllBut(first);
        assertEquals(before, conn.readerFrames(), "answers read by the reader thread");
        crowd.requests[first].conn().reply(crowd.requests[first].frame(), Status.CANCELLED, 0, 0, 0);
        cancel.conn().reply(cancel.frame(), Status.OK, 0, 0, 1);
        ExecutionException e = assertThrows(ExecutionException.class, () -> crowd.tokens.get(first).get(10, TimeUnit.SECONDS));
        assertTrue(e.getCause() instanceof CancelledException, String.valueOf(e.getCause()));
    }
}
