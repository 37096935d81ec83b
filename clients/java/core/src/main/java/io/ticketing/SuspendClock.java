package io.ticketing;

import java.time.Instant;
import java.util.concurrent.TimeUnit;
import java.util.function.LongSupplier;

/**
 * The clock of first sends, local deadlines and the lost check: it keeps counting while the host is
 * suspended, as the server's leases do (PROTOCOL.md, "The lost signal"). Java cannot read
 * {@code CLOCK_BOOTTIME}, and {@link System#nanoTime()} stops during a suspend on Linux, so each
 * interval counts as the larger of the monotonic and the wall clock's advance: a suspend shows as
 * the wall clock running ahead; a wall clock stepped back is ignored, one stepped forward only makes
 * deadlines earlier.
 *
 * <p>A reading is nanoseconds on the scale of {@code System.nanoTime()} plus the suspend time seen
 * so far, and never goes backwards. Reading it is as cheap as {@code nanoTime()}: the wall clock is
 * looked at by the first reading {@link #LOOK_EVERY_NANOS} after the previous look, and by every
 * {@link #nowChecked()}. Safe for concurrent use.
 */
final class SuspendClock {
    /** How often {@link #now()} looks at the wall clock: the request path reads the clock per request. */
    private static final long LOOK_EVERY_NANOS = TimeUnit.MILLISECONDS.toNanos(20);
    /**
     * A look reads the monotonic clock on both sides of the wall clock; when the thread was
     * preempted in between (more than this passed), the readings are no pair and the look is tried
     * again: a preemption taken for wall clock advance would add up, look by look.
     */
    private static final long PAIR_NANOS = TimeUnit.MICROSECONDS.toNanos(100);
    /**
     * The wall clock's advance beyond the monotonic clock's that counts: less is reading noise (it
     * would add up too), a suspend is far longer.
     */
    private static final long NOISE_NANOS = TimeUnit.MILLISECONDS.toNanos(1);
    private static final int LOOK_TRIES = 3;

    /** The system's clock (after the constants, which its constructor reads). */
    static final SuspendClock SYSTEM = new SuspendClock(System::nanoTime, SuspendClock::wallNanos);

    private final LongSupplier mono;
    private final LongSupplier wall;
    private volatile long suspended; // written under this
    private volatile long lastMono; // written under this
    private long lastWall; // guarded by this

    /** {@code mono} and {@code wall} are the monotonic and the wall clock, in nanoseconds (replaced in tests). */
    SuspendClock(LongSupplier mono, LongSupplier wall) {
        this.mono = mono;
        this.wall = wall;
        long m;
        long w;
        int tries = 0;
        do {
            m = mono.getAsLong();
            w = wall.getAsLong();
        } while (mono.getAsLong() - m > PAIR_NANOS && ++tries < LOOK_TRIES);
        this.lastMono = m;
        this.lastWall = w;
    }

    private static long wallNanos() {
        Instant now = Instant.now();
        return now.getEpochSecond() * 1_000_000_000L + now.getNano();
    }

    /** Returns the clock now, in nanoseconds; suspend time is noticed within {@link #LOOK_EVERY_NANOS}. */
    long now() {
        long m = mono.getAsLong();
        return (m - lastMono >= LOOK_EVERY_NANOS ? look() : m) + suspended;
    }

    /** Returns the clock now, having looked at the wall clock first: for checking a deadline. */
    long nowChecked() {
        return look() + suspended;
    }

    /** Returns the suspend time seen so far, in nanoseconds; it grows when a look finds some. */
    long suspended() {
        return suspended;
    }

    /**
     * Adds the wall clock's advance beyond the monotonic one since the last look; returns the
     * monotonic reading. After {@link #LOOK_TRIES} preempted tries it counts nothing: the next read
     * looks again.
     */
    private synchronized long look() {
        long m = 0;
        for (int i = 0; i < LOOK_TRIES; i++) {
            m = mono.getAsLong();
            long w = wall.getAsLong();
            long after = mono.getAsLong();
            if (after - m > PAIR_NANOS) {
                m = after;
                continue;
            }
            long ahead = (w - lastWall) - (m - lastMono);
            if (ahead >= NOISE_NANOS) {
                suspended += ahead;
            }
            lastWall = w;
            lastMono = m;
            return m;
        }
        return m;
    }
}
