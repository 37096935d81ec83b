package io.ticketing;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertInstanceOf;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.time.Duration;
import java.util.ArrayList;
import java.util.List;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.ExecutorService;
import java.util.concurrent.Executors;
import java.util.concurrent.Future;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicBoolean;
import java.util.concurrent.atomic.AtomicInteger;
import org.junit.jupiter.api.AfterAll;
import org.junit.jupiter.api.AfterEach;
import org.junit.jupiter.api.BeforeAll;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.Timeout;

/** {@link DistributedLock}, the java.util.concurrent.locks.Lock adapter, against the real server. */
@Timeout(60)
class DistributedLockTest {
    private static final Duration LEASE = Duration.ofSeconds(10);
    private static ServerProcess server;
    private final List<AutoCloseable> closeables = new ArrayList<>();
    private final ExecutorService pool = Executors.newCachedThreadPool();

    @BeforeAll
    static void startServer() throws Exception {
        server = ServerProcess.start();
    }

    @AfterAll
    static void stopServer() throws Exception {
        server.close();
    }

    @AfterEach
    void tearDown() throws Exception {
        pool.shutdownNow();
        for (int i = closeables.size() - 1; i >= 0; i--) {
            closeables.get(i).close();
        }
    }

    private TicketingClient client() {
        TicketingClient c = TicketingClient.connect(ClientOptions.builder().endpoints(server.endpoint()).build());
        closeables.add(c);
        return c;
    }

    private static void waiters(TicketingClient observer, String key, int n) throws InterruptedException {
        Poll.until(Duration.ofSeconds(10), () -> observer.inspect(key).waiters() == n, n + " waiters on " + key);
    }

    @Test
    void lockUnlockWithFencingTokens() {
        TicketingClient c = client();
        DistributedLock lock = c.distributedLock("juc-basic", LEASE);
        java.util.concurrent.locks.Lock asJuc = lock; // usable wherever a Lock is expected
        assertFalse(lock.isHeldByCurrentThread());
        asJuc.lock();
        long first;
        try {
            assertTrue(lock.isHeldByCurrentThread());
            first = lock.token();
            assertTrue(first > 0);
            assertTrue(c.inspect("juc-basic").held());
            assertTrue(lock.options().keepAlive(), "distributedLock(key, lease) keeps alive");
        } finally {
            asJuc.unlock();
        }
        assertFalse(lock.isHeldByCurrentThread());
        assertFalse(c.inspect("juc-basic").held(), "unlock released it on the server");
        assertThrows(IllegalMonitorStateException.class, lock::token);
        assertTrue(lock.heldLock().isEmpty());
        long second = lock.lockAndGetToken();
        try {
            assertTrue(Long.compareUnsigned(second, first) > 0, "every grant gets a larger token");
        } finally {
            lock.unlock();
        }
    }

    @Test
    void notReentrantSecondLockFromTheSameThreadFailsAtOnce() throws Exception {
        TicketingClient c = client();
        DistributedLock lock = c.distributedLock("juc-reentry", LEASE);
        lock.lock();
        long token = lock.token();
        AlreadyHeldException e = assertThrows(AlreadyHeldException.class, lock::lock);
        assertTrue(e.getMessage().contains("not reentrant"), e.getMessage());
        assertThrows(AlreadyHeldException.class, lock::lockInterruptibly);
        assertFalse(lock.tryLock(), "tryLock by the holder: false, not a second hold");
        long t0 = System.nanoTime();
        assertFalse(lock.tryLock(5, TimeUnit.SECONDS), "tryLock(time) by the holder: false at once");
        assertTrue(System.nanoTime() - t0 < TimeUnit.SECONDS.toNanos(3), "did not wait");
        // Another object for the same key on the same client is the same lock.
        assertThrows(AlreadyHeldException.class, () -> c.distributedLock("juc-reentry", LEASE).lock());
        // Still held once, with the same token, and one unlock releases it.
        assertTrue(lock.isHeldByCurrentThread());
        assertEquals(token, lock.token());
        assertEquals(0, c.inspect("juc-reentry").waiters(), "nothing was queued");
        lock.unlock();
        assertFalse(c.inspect("juc-reentry").held());
        assertThrows(IllegalMonitorStateException.class, lock::unlock, "a second unlock");
    }

    @Test
    void onlyTheLockingThreadMayUnlock() throws Exception {
        TicketingClient c = client();
        DistributedLock lock = c.distributedLock("juc-owner", LEASE);
        assertThrows(IllegalMonitorStateException.class, lock::unlock, "unlock without a lock");
        lock.lock();
        Future<Throwable> other = pool.submit(() -> {
            try {
                lock.unlock();
                return null;
            } catch (Throwable t) {
                return t;
            }
        });
        assertInstanceOf(IllegalMonitorStateException.class, other.get(10, TimeUnit.SECONDS));
        Future<Boolean> otherHolds = pool.submit(lock::isHeldByCurrentThread);
        assertFalse(otherHolds.get(10, TimeUnit.SECONDS));
        assertTrue(lock.isHeldByCurrentThread(), "still held by its owner");
        assertTrue(lock.heldLock().orElseThrow().verify(), "still held on the server");
        lock.unlock();
        assertFalse(c.inspect("juc-owner").held());
    }

    @Test
    void threadsOfOneClientAndOtherClientsExcludeEachOther() throws Exception {
        TicketingClient c1 = client();
        TicketingClient c2 = client();
        String key = "juc-mutex";
        DistributedLock shared = c1.distributedLock(key, LEASE);
        AtomicInteger inside = new AtomicInteger();
        AtomicBoolean overlap = new AtomicBoolean();
        List<Long> tokens = java.util.Collections.synchronizedList(new ArrayList<>());
        List<Future<?>> workers = new ArrayList<>();
        for (int i = 0; i < 6; i++) {
            DistributedLock lock = i % 2 == 0 ? shared : c2.distributedLock(key, LEASE);
            workers.add(pool.submit(() -> {
                for (int j = 0; j < 3; j++) {
                    lock.lock();
                    try {
                        if (inside.incrementAndGet() != 1) {
                            overlap.set(true);
                        }
                        tokens.add(lock.token());
                        Thread.sleep(5);
                        inside.decrementAndGet();
                    } finally {
                        lock.unlock();
                    }
                }
                return null;
            }));
        }
        for (Future<?> w : workers) {
            w.get(40, TimeUnit.SECONDS);
        }
        assertFalse(overlap.get(), "two holders at once");
        assertEquals(18, tokens.size());
        for (int i = 1; i < tokens.size(); i++) {
            assertTrue(Long.compareUnsigned(tokens.get(i), tokens.get(i - 1)) > 0, "tokens grow: " + tokens);
        }
        assertFalse(c1.inspect(key).held());
    }

    @Test
    void tryLockOnceAndWithATimeout() throws Exception {
        TicketingClient holder = client();
        TicketingClient c = client();
        Lock held = holder.acquire("juc-try", LEASE);
        DistributedLock lock = c.distributedLock("juc-try", LEASE);
        assertFalse(lock.tryLock(), "taken: one try fails");
        long t0 = System.nanoTime();
        assertFalse(lock.tryLock(300, TimeUnit.MILLISECONDS));
        assertTrue(System.nanoTime() - t0 >= TimeUnit.MILLISECONDS.toNanos(250), "waited its time");
        assertFalse(lock.isHeldByCurrentThread());
        assertEquals(0, holder.inspect("juc-try").waiters(), "the timed-out wait left the queue");

        Future<Boolean> waiting = pool.submit(() -> {
            boolean got = lock.tryLock(20, TimeUnit.SECONDS);
            if (got) {
                lock.unlock();
            }
            return got;
        });
        waiters(holder, "juc-try", 1);
        held.release();
        assertTrue(waiting.get(20, TimeUnit.SECONDS), "granted when the holder released");

        assertTrue(lock.tryLock());
        assertTrue(lock.isHeldByCurrentThread());
        lock.unlock();
    }

    @Test
    void lockInterruptiblyWithdrawsTheWaitOnInterrupt() throws Exception {
        TicketingClient holder = client();
        TicketingClient c = client();
        Lock held = holder.acquire("juc-interrupt", LEASE);
        DistributedLock lock = c.distributedLock("juc-interrupt", LEASE);
        CompletableFuture<Thread> thread = new CompletableFuture<>();
        Future<Throwable> waiting = pool.submit(() -> {
            thread.complete(Thread.currentThread());
            try {
                lock.lockInterruptibly();
                return null;
            } catch (Throwable t) {
                return t;
            }
        });
        waiters(holder, "juc-interrupt", 1);
        thread.get().interrupt();
        Throwable t = waiting.get(20, TimeUnit.SECONDS);
        assertInstanceOf(InterruptedException.class, t);
        waiters(holder, "juc-interrupt", 0);
        held.release();
        assertFalse(holder.inspect("juc-interrupt").held(), "the withdrawn wait was never granted");

        Thread.currentThread().interrupt();
        assertThrows(InterruptedException.class, lock::lockInterruptibly, "interrupted before waiting");
        assertFalse(Thread.interrupted(), "the flag is cleared when InterruptedException is thrown");
        Thread.currentThread().interrupt();
        assertThrows(InterruptedException.class, () -> lock.tryLock(1, TimeUnit.SECONDS));
    }

    @Test
    void lockIgnoresInterruptsAndKeepsTheFlag() throws Exception {
        TicketingClient holder = client();
        TicketingClient c = client();
        Lock held = holder.acquire("juc-uninterruptible", LEASE);
        DistributedLock lock = c.distributedLock("juc-uninterruptible", LEASE);
        CompletableFuture<Thread> thread = new CompletableFuture<>();
        Future<Boolean> waiting = pool.submit(() -> {
            thread.complete(Thread.currentThread());
            lock.lock();
            try {
                return Thread.currentThread().isInterrupted();
            } finally {
                lock.unlock();
            }
        });
        waiters(holder, "juc-uninterruptible", 1);
        thread.get().interrupt();
        Thread.sleep(200);
        assertFalse(waiting.isDone(), "lock() goes on waiting after an interrupt");
        assertEquals(1, holder.inspect("juc-uninterruptible").waiters(), "still queued");
        held.release();
        assertTrue(waiting.get(20, TimeUnit.SECONDS), "acquired, with the interrupt flag set again");
    }

    @Test
    void unlockOfALostLockThrowsLockLost() throws Exception {
        TicketingClient c = client();
        DistributedLock lock = c.distributedLock("juc-lost", AcquireOptions.builder(Duration.ofMillis(300)).build());
        lock.lock();
        assertFalse(lock.options().keepAlive());
        Poll.until(Duration.ofSeconds(10), () -> !lock.isHeldByCurrentThread(), "the lease to run out");
        assertThrows(LockLostException.class, lock::token);
        assertTrue(lock.heldLock().isPresent(), "the thread must still unlock");
        LockLostException e = assertThrows(LockLostException.class, lock::unlock);
        assertEquals(LostReason.EXPIRED, e.reason());
        assertThrows(IllegalMonitorStateException.class, lock::unlock, "the hold ended with the failed unlock");

        DistributedLock quiet = c.distributedLock("juc-lost-quiet",
                AcquireOptions.builder(Duration.ofMillis(300)).throwOnLost(false).build());
        quiet.lock();
        Poll.until(Duration.ofSeconds(10), () -> !quiet.isHeldByCurrentThread(), "the lease to run out");
        quiet.unlock(); // throwOnLost(false): no exception
    }

    @Test
    void heldLockReleasedDirectlyEndsTheHold() throws Exception {
        TicketingClient c = client();
        DistributedLock lock = c.distributedLock("juc-handoff", LEASE);
        lock.lock();
        Lock handle = lock.heldLock().orElseThrow();
        pool.submit(() -> {
            handle.release(); // the core API: any thread may release by token
            return null;
        }).get(10, TimeUnit.SECONDS);
        assertFalse(lock.isHeldByCurrentThread());
        assertFalse(c.inspect("juc-handoff").held());
        assertTrue(lock.tryLock(), "the thread may lock again");
        lock.unlock();
    }

    @Test
    void conditionsAreNotSupported() {
        DistributedLock lock = client().distributedLock("juc-condition", LEASE);
        assertThrows(UnsupportedOperationException.class, lock::newCondition);
        assertThrows(InvalidArgumentException.class, () -> client().distributedLock("", LEASE));
        assertThrows(InvalidArgumentException.class, () -> client().distributedLock("k", (AcquireOptions) null));
    }

    @Test
    void closedClientFailsWithTicketingException() {
        TicketingClient c = client();
        DistributedLock lock = c.distributedLock("juc-closed", LEASE);
        c.close();
        assertThrows(ClosedException.class, lock::lock);
        assertThrows(ClosedException.class, lock::tryLock);
        assertFalse(lock.isHeldByCurrentThread());
    }
}
