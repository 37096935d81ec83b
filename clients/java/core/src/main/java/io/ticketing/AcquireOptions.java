package io.ticketing;

import java.time.Duration;
import java.time.temporal.ChronoUnit;

/**
 * Immutable settings of one acquire, made with {@link #builder(Duration)}: the lease (required)
 * and the wait timeout, keep-alive, max hold, refuse-held and throw-on-lost settings.
 *
 * <pre>{@code
 * Lock lock = client.acquire("daily-batch", AcquireOptions.builder(Duration.ofMinutes(1))
 *         .waitTimeout(Duration.ofSeconds(10))
 *         .keepAlive(true)
 *         .maxHold(Duration.ofHours(1))
 *         .build());
 * }</pre>
 */
public final class AcquireOptions {
    /** A wait timeout meaning "wait without limit" (the default); any wait of 2^32-1 ms or more means the same. */
    public static final Duration WAIT_FOREVER = ChronoUnit.FOREVER.getDuration();
    /** Default wait timeout: {@link #WAIT_FOREVER}. */
    public static final Duration DEFAULT_WAIT_TIMEOUT = WAIT_FOREVER;
    /** Default keep-alive: off. */
    public static final boolean DEFAULT_KEEP_ALIVE = false;
    /** Default refuse-held: off (acquiring a key this client holds queues behind itself). */
    public static final boolean DEFAULT_REFUSE_HELD = false;
    /** Default throw-on-lost: on ({@link Lock#close()} raises {@link LockLostException} for a lost lock). */
    public static final boolean DEFAULT_THROW_ON_LOST = true;

    static final long WAIT_FOREVER_MS = 0xFFFF_FFFFL;

    private final long leaseMs;
    private final long waitMs;
    private final boolean keepAlive;
    private final Duration maxHold;
    private final boolean refuseHeld;
    private final boolean throwOnLost;

    private AcquireOptions(Builder b) {
        this.leaseMs = b.leaseMs;
        this.waitMs = b.waitMs;
        this.keepAlive = b.keepAlive;
        this.maxHold = b.maxHold;
        this.refuseHeld = b.refuseHeld;
        this.throwOnLost = b.throwOnLost;
    }

    private AcquireOptions(AcquireOptions o, long waitMs) {
        this.leaseMs = o.leaseMs;
        this.waitMs = waitMs;
        this.keepAlive = o.keepAlive;
        this.maxHold = o.maxHold;
        this.refuseHeld = o.refuseHeld;
        this.throwOnLost = o.throwOnLost;
    }

    /** These options with another wait timeout, in milliseconds ({@link #WAIT_FOREVER_MS}: no limit). */
    AcquireOptions withWaitMillis(long waitMs) {
        return new AcquireOptions(this, Math.max(0, Math.min(waitMs, WAIT_FOREVER_MS)));
    }

    /**
     * Returns a builder for an acquire with this lease.
     *
     * @param lease how long the lock is held unless released or extended: at least 1 ms and below
     *     2^32 ms; it starts when the lock is granted
     * @return the builder
     * @throws InvalidArgumentException when the lease is out of range
     */
    public static Builder builder(Duration lease) {
        return new Builder(lease);
    }

    /**
     * Returns options with this lease and wait timeout, and the other defaults.
     *
     * @param lease the lease
     * @param waitTimeout the wait timeout ({@link Duration#ZERO}: try once; {@link #WAIT_FOREVER} or null: without limit)
     * @return the options
     */
    public static AcquireOptions of(Duration lease, Duration waitTimeout) {
        return builder(lease).waitTimeout(waitTimeout).build();
    }

    /** {@return the lease} */
    public Duration lease() {
        return Duration.ofMillis(leaseMs);
    }

    long leaseMs() {
        return leaseMs;
    }

    /** {@return the wait timeout ({@link #WAIT_FOREVER} when without limit)} */
    public Duration waitTimeout() {
        return waitMs == WAIT_FOREVER_MS ? WAIT_FOREVER : Duration.ofMillis(waitMs);
    }

    long waitMs() {
        return waitMs;
    }

    /** {@return whether keep-alive is on} */
    public boolean keepAlive() {
        return keepAlive;
    }

    /** {@return the keep-alive cap, or null for none} */
    public Duration maxHold() {
        return maxHold;
    }

    /** {@return whether acquiring a key this client holds fails at once} */
    public boolean refuseHeld() {
        return refuseHeld;
    }

    /** {@return whether {@link Lock#close()} raises {@link LockLostException} for a lost lock} */
    public boolean throwOnLost() {
        return throwOnLost;
    }

    static long leaseMillis(Duration lease) {
        if (lease == null) {
            throw new InvalidArgumentException("lease is required: a java.time.Duration of at least 1 ms");
        }
        if (lease.isNegative() || lease.compareTo(Duration.ofMillis(1)) < 0) {
            throw new InvalidArgumentException("lease must be at least 1 ms, got " + lease
                    + " (a java.time.Duration, e.g. Duration.ofSeconds(30))");
        }
        if (lease.compareTo(Duration.ofMillis(WAIT_FOREVER_MS)) > 0) {
            throw new InvalidArgumentException("lease must be below 2^32 ms (about 49.7 days), got " + lease);
        }
        return lease.toMillis();
    }

    static long waitMillis(Duration wait) {
        if (wait == null) {
            return WAIT_FOREVER_MS;
        }
        if (wait.isNegative()) {
            throw new InvalidArgumentException("waitTimeout must be zero (try once), positive, or WAIT_FOREVER, got "
                    + wait);
        }
        if (wait.compareTo(Duration.ofMillis(WAIT_FOREVER_MS)) >= 0) {
            return WAIT_FOREVER_MS;
        }
        return wait.toMillis();
    }

    /** Builds {@link AcquireOptions}; every setter checks its argument at once. */
    public static final class Builder {
        private final long leaseMs;
        private long waitMs = WAIT_FOREVER_MS;
        private boolean keepAlive = DEFAULT_KEEP_ALIVE;
        private Duration maxHold;
        private boolean refuseHeld = DEFAULT_REFUSE_HELD;
        private boolean throwOnLost = DEFAULT_THROW_ON_LOST;

        private Builder(Duration lease) {
            this.leaseMs = leaseMillis(lease);
        }

        /**
         * Sets how long to wait in the key's FIFO queue. Default: without limit.
         *
         * @param waitTimeout {@link Duration#ZERO} to try once; {@link #WAIT_FOREVER} or null for
         *     without limit; negative durations are rejected
         * @return this builder
         */
        public Builder waitTimeout(Duration waitTimeout) {
            this.waitMs = waitMillis(waitTimeout);
            return this;
        }

        /**
         * Turns keep-alive on: while held, the lock is extended by its lease every lease/3 until it
         * is released or lost (like Redisson's watchdog). Default off.
         *
         * @param keepAlive whether to keep the lock alive
         * @return this builder
         */
        public Builder keepAlive(boolean keepAlive) {
            this.keepAlive = keepAlive;
            return this;
        }

        /**
         * Caps keep-alive: it stops this long after the grant, and the lock then runs out its lease.
         * Default: no cap.
         *
         * @param maxHold a positive duration, or null for no cap
         * @return this builder
         */
        public Builder maxHold(Duration maxHold) {
            if (maxHold != null && (maxHold.isNegative() || maxHold.isZero())) {
                throw new InvalidArgumentException("maxHold must be positive, got " + maxHold);
            }
            this.maxHold = maxHold;
            return this;
        }

        /**
         * Makes the acquire fail at once with {@link AlreadyHeldException} when this client already
         * holds the key, instead of queueing behind itself. Default off.
         *
         * @param refuseHeld whether to refuse
         * @return this builder
         */
        public Builder refuseHeld(boolean refuseHeld) {
            this.refuseHeld = refuseHeld;
            return this;
        }

        /**
         * Chooses whether {@link Lock#close()} (try-with-resources) raises
         * {@link LockLostException} when the lock was lost while held. Default on; the documented
         * opt-out for code that checks {@link Lock#isLost()} itself.
         *
         * @param throwOnLost whether to raise
         * @return this builder
         */
        public Builder throwOnLost(boolean throwOnLost) {
            this.throwOnLost = throwOnLost;
            return this;
        }

        /** {@return the options} */
        public AcquireOptions build() {
            return new AcquireOptions(this);
        }
    }
}
