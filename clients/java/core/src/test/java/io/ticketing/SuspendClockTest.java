package io.ticketing;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicLong;
import org.junit.jupiter.api.Test;

/** The deadline clock's fallback for a runtime without CLOCK_BOOTTIME (PROTOCOL.md, "The lost signal"). */
class SuspendClockTest {
    private final AtomicLong mono = new AtomicLong(5_000_000_000L);
    private final AtomicLong wall = new AtomicLong(1_700_000_000_000_000_000L);
    private final SuspendClock clock = new SuspendClock(mono::get, wall::get);

    private static long ms(long n) {
        return TimeUnit.MILLISECONDS.toNanos(n);
    }

    /** Both clocks advance by {@code n} ms (no suspend). */
    private void run(long n) {
        mono.addAndGet(ms(n));
        wall.addAndGet(ms(n));
    }

    @Test
    void countsTheMonotonicClockWithoutASuspend() {
        long t0 = clock.now();
        run(10);
        assertEquals(ms(10), clock.now() - t0);
        run(30);
        assertEquals(ms(40), clock.nowChecked() - t0);
        assertEquals(0, clock.suspended());
    }

    @Test
    void aSuspendCountsAsTheWallClocksAdvance() {
        long t0 = clock.now();
        wall.addAndGet(ms(60_000)); // suspended for a minute: the monotonic clock stood still
        mono.addAndGet(ms(1));
        wall.addAndGet(ms(1));
        assertEquals(ms(60_001), clock.nowChecked() - t0, "a deadline check looks at once");

        SuspendClock other = new SuspendClock(mono::get, wall::get);
        long u0 = other.now();
        wall.addAndGet(ms(5_000));
        mono.addAndGet(ms(1));
        wall.addAndGet(ms(1));
        assertEquals(ms(1), other.now() - u0, "the request path looks only every 20 ms");
        run(20);
        assertEquals(ms(5_021), other.now() - u0, "then it counts the suspend");
    }

    @Test
    void aWallClockSteppedBackIsIgnoredAndLaterSuspendsStillCount() {
        long t0 = clock.now();
        wall.addAndGet(-ms(3_600_000)); // stepped back an hour
        run(25);
        assertEquals(ms(25), clock.nowChecked() - t0);
        run(25);
        assertEquals(ms(50), clock.nowChecked() - t0, "no catching up the hour");
        wall.addAndGet(ms(10_000)); // then a suspend of 10 s
        run(25);
        assertEquals(ms(10_075), clock.nowChecked() - t0);
    }

    @Test
    void readingJitterDoesNotAddUp() {
        long t0 = clock.now();
        for (int i = 0; i < 10_000; i++) {
            // every interval, the wall clock reads a little ahead, then behind: no suspend
            mono.addAndGet(ms(20));
            wall.addAndGet(ms(20) + (i % 2 == 0 ? 900_000 : -900_000));
            clock.now();
        }
        assertEquals(ms(200_000), clock.nowChecked() - t0);
        assertEquals(0, clock.suspended());
    }

    @Test
    void aPreemptionBetweenTheReadingsIsNotASuspend() {
        AtomicLong preempt = new AtomicLong(); // ns that pass right after the next wall clock reading
        SuspendClock c = new SuspendClock(mono::get, () -> {
            long w = wall.get();
            run(TimeUnit.NANOSECONDS.toMillis(preempt.getAndSet(0)));
            return w;
        });
        long t0 = c.nowChecked();
        for (int i = 0; i < 100; i++) {
            preempt.set(ms(5));
            run(20);
            c.now();
        }
        assertEquals(ms(100 * 25), c.nowChecked() - t0);
        assertEquals(0, c.suspended());
    }

    @Test
    void neverGoesBackwards() {
        long last = clock.now();
        for (int i = 0; i < 1_000; i++) {
            mono.addAndGet(ms(i % 7));
            wall.addAndGet(i % 3 == 0 ? -ms(50) : ms(i % 11));
            long t = i % 2 == 0 ? clock.now() : clock.nowChecked();
            assertTrue(t >= last, "went back at step " + i);
            last = t;
        }
    }
}
