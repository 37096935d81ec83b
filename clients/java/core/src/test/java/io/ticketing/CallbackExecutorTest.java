package io.ticketing;

import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.util.concurrent.CountDownLatch;
import java.util.concurrent.ScheduledThreadPoolExecutor;
import java.util.concurrent.TimeUnit;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.Timeout;

/** The callback threads' signal to the reader thread (Engine.readerComing). */
@Timeout(30)
class CallbackExecutorTest {
    /**
     * readsSoon: only while a task runs, and only for {@link CallbackExecutor#SOON_NANOS} after it
     * started (a longer one may be blocked in the application's code: the reader thread must not
     * leave the reading to its thread then).
     */
    @Test
    void readsSoonOnlyWhileATaskHasRunBriefly() throws Exception {
        ScheduledThreadPoolExecutor timer = new ScheduledThreadPoolExecutor(1);
        CallbackExecutor cb = new CallbackExecutor(r -> {
            Thread t = new Thread(r, "test-callback");
            t.setDaemon(true);
            return t;
        }, timer);
        cb.idleRead = f -> false; // no connection to read
        try {
            assertFalse(cb.readsSoon(), "no task runs");
            CountDownLatch running = new CountDownLatch(1);
            CountDownLatch unblock = new CountDownLatch(1);
            long[] start = new long[1];
            cb.execute(() -> {
                start[0] = System.nanoTime();
                running.countDown();
                try {
                    unblock.await(20, TimeUnit.SECONDS);
                } catch (InterruptedException e) {
                    Thread.currentThread().interrupt();
                }
            });
            assertTrue(running.await(5, TimeUnit.SECONDS));
            while (System.nanoTime() - start[0] <= 2 * CallbackExecutor.SOON_NANOS) {
                Thread.onSpinWait(); // (the task has now run past SOON_NANOS)
            }
            assertTrue(cb.busy());
            assertFalse(cb.readsSoon(), "a task blocked past SOON_NANOS");
            unblock.countDown();
        } finally {
            cb.shutdown();
            timer.shutdownNow();
        }
    }
}
