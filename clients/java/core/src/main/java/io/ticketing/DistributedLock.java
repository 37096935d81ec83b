package io.ticketing;

import io.ticketing.protocol.Bytes;
import java.util.Optional;
import java.util.concurrent.CancellationException;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.ExecutionException;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.locks.Condition;

/**
 * One key of the server seen as a {@link java.util.concurrent.locks.Lock}, for code written against
 * that interface (as Redisson's {@code RLock} and Hazelcast's {@code FencedLock} offer it). Get one
 * with {@link TicketingClient#distributedLock(String, java.time.Duration)} or
 * {@link TicketingClient#distributedLock(String, AcquireOptions)}:
 *
 * <pre>{@code
 * DistributedLock lock = client.distributedLock("nightly-report", Duration.ofSeconds(30));
 * lock.lock();
 * try {
 *     store.write(report, lock.token()); // fencing: the store rejects tokens below the highest it saw
 * } finally {
 *     lock.unlock();
 * }
 * }</pre>
 *
 * <p><b>Threads own it.</b> As with {@link java.util.concurrent.locks.ReentrantLock}, the thread that
 * locked is the only one that may {@link #unlock()}: any other thread gets
 * {@link IllegalMonitorStateException} and the lock stays held. Threads of one client exclude each
 * other on the key (they queue on the server in FIFO order), and so do separate clients or processes.
 * Ownership is per client and key, not per {@code DistributedLock} object: two objects for the same
 * key from the same client are the same lock. (The core API has no owning thread: to hand a held
 * lock to another thread, pass it {@link #heldLock()}'s {@link Lock} and release that.)
 *
 * <p><b>Not reentrant.</b> A thread that holds the key and calls {@link #lock()} or
 * {@link #lockInterruptibly()} again gets {@link AlreadyHeldException} at once (nothing is sent, and
 * the lock stays held); {@link #tryLock()} and {@link #tryLock(long, TimeUnit)} return {@code false}
 * at once. This is Hazelcast's non-reentrant {@code FencedLock}, not {@code ReentrantLock}: a
 * distributed lock's holder is a fencing token, and a reentrant second hold would have no token of
 * its own. A {@link Lock} the same thread got from {@link TicketingClient#acquire} is not seen here:
 * locking the same key through this class then queues behind it (set
 * {@link AcquireOptions.Builder#refuseHeld(boolean) refuseHeld} to fail instead).
 *
 * <p><b>Leases.</b> Every grant carries the options' lease. {@code distributedLock(key, lease)}
 * turns keep-alive on (Redisson's watchdog): the lock is extended every lease/3 while held, and a
 * crashed process loses it within one lease. With keep-alive off the lock expires after its lease
 * even while the thread is inside the critical section; check {@link #isHeldByCurrentThread()} or
 * {@link Lock#onLost heldLock().onLost(...)} when that matters. The options' wait timeout is not
 * used: {@code lock()} waits without limit, {@code tryLock()} tries once, and
 * {@code tryLock(time, unit)} waits that long.
 *
 * <p><b>Lost.</b> When the lock is lost while held (lease expired, server restarted...),
 * {@link #isHeldByCurrentThread()} turns {@code false}, {@link #token()} throws
 * {@link LockLostException}, and the thread must still call {@link #unlock()}, which then throws
 * {@link LockLostException} naming the reason (unless the options set
 * {@link AcquireOptions.Builder#throwOnLost(boolean) throwOnLost(false)}): the critical section was
 * not protected to its end.
 *
 * <p>{@link #newCondition()} is not supported. Failures of the client itself (timeouts, a closed
 * client, a lost connection) are thrown as unchecked {@link TicketingException}s.
 */
public final class DistributedLock implements java.util.concurrent.locks.Lock {
    /** Who holds what: the key of one client's ownership map. */
    record Owner(Thread thread, String key) {
    }

    private final TicketingClient client;
    private final String key;
    private final AcquireOptions options;
    private final String shown;

    DistributedLock(TicketingClient client, String key, AcquireOptions options) {
        if (options == null) {
            throw new InvalidArgumentException("options are required: AcquireOptions.builder(lease).build()");
        }
        this.client = client;
        this.key = key;
        this.options = options;
        this.shown = Bytes.forMessage(TicketingClient.keyBytes(key));
    }

    /** {@return the key this lock stands for} */
    public String key() {
        return key;
    }

    /** {@return the options every grant uses (their wait timeout is not used)} */
    public AcquireOptions options() {
        return options;
    }

    private Owner me() {
        return new Owner(Thread.currentThread(), key);
    }

    /** The current thread's hold, dropping one that was released through its {@link Lock}. */
    private Lock current() {
        Owner me = me();
        Lock l = client.javaLockHolds.get(me);
        if (l != null && l.isReleased()) {
            client.javaLockHolds.remove(me, l);
            return null;
        }
        return l;
    }

    private void hold(Lock l) {
        client.javaLockHolds.put(me(), l);
    }

    private AlreadyHeldException reentered(String call) {
        return new AlreadyHeldException(call + " of " + shown + " by a thread that already holds it: DistributedLock "
                + "is not reentrant; unlock() first");
    }

    /**
     * Acquires the lock, waiting in the key's FIFO queue without limit. Like
     * {@link java.util.concurrent.locks.Lock#lock()}, it ignores interrupts while it waits and
     * returns with the thread's interrupt flag set again when one came.
     *
     * @throws AlreadyHeldException when the current thread already holds it (not reentrant)
     * @throws TicketingException when the client fails (closed, connection lost, server restarted...)
     */
    @Override
    public void lock() {
        if (current() != null) {
            throw reentered("lock()");
        }
        hold(joinUninterruptibly(client.acquireAsync(key, options.withWaitMillis(AcquireOptions.WAIT_FOREVER_MS))));
    }

    /**
     * Acquires the lock like {@link #lock()} and returns its fencing token (Redisson's
     * {@code lockAndGetToken()}, Hazelcast's {@code lockAndGetFence()}).
     *
     * @return the fencing token of this grant
     * @throws AlreadyHeldException when the current thread already holds it (not reentrant)
     */
    public long lockAndGetToken() {
        lock();
        return token();
    }

    /**
     * Acquires the lock, waiting without limit unless the thread is interrupted. An interrupt
     * withdraws the wait from the server's queue (a grant that raced it is released) before the
     * {@link InterruptedException} is thrown, so nothing is left held.
     *
     * @throws InterruptedException when the thread is interrupted before or while waiting (its flag
     *     is then clear)
     * @throws AlreadyHeldException when the current thread already holds it (not reentrant)
     */
    @Override
    public void lockInterruptibly() throws InterruptedException {
        if (Thread.interrupted()) {
            throw new InterruptedException("lockInterruptibly() of " + shown + ": interrupted before waiting");
        }
        if (current() != null) {
            throw reentered("lockInterruptibly()");
        }
        hold(acquireInterruptibly(AcquireOptions.WAIT_FOREVER_MS));
    }

    /**
     * Acquires the lock only if it is free now: one try, without queueing. Interrupts are ignored
     * while the server answers.
     *
     * @return {@code true} when the lock was acquired; {@code false} when another holder has it, or
     *     when the current thread already holds it (not reentrant)
     */
    @Override
    public boolean tryLock() {
        if (current() != null) {
            return false;
        }
        try {
            hold(joinUninterruptibly(client.acquireAsync(key, options.withWaitMillis(0))));
            return true;
        } catch (NotAcquiredException e) {
            return false;
        }
    }

    /**
     * Acquires the lock if it becomes free within {@code time}, waiting in the key's FIFO queue.
     * A time of zero or less tries once. An interrupt withdraws the wait, as in
     * {@link #lockInterruptibly()}.
     *
     * @param time the longest wait (below a millisecond rounds up to one)
     * @param unit the unit of {@code time}
     * @return {@code true} when the lock was acquired; {@code false} when the time passed first, or
     *     at once when the current thread already holds it (not reentrant)
     * @throws InterruptedException when the thread is interrupted before or while waiting
     */
    @Override
    public boolean tryLock(long time, TimeUnit unit) throws InterruptedException {
        if (Thread.interrupted()) {
            throw new InterruptedException("tryLock() of " + shown + ": interrupted before waiting");
        }
        if (current() != null) {
            return false;
        }
        long nanos = unit.toNanos(time);
        long ms = nanos <= 0 ? 0 : Math.max(1, TimeUnit.NANOSECONDS.toMillis(nanos + 999_999));
        try {
            hold(acquireInterruptibly(ms));
            return true;
        } catch (NotAcquiredException e) {
            return false;
        }
    }

    /**
     * Releases the lock. Only the thread that locked may unlock; once this returns or throws, that
     * thread no longer holds it. Interrupts are ignored while the server answers (the flag is kept).
     *
     * @throws IllegalMonitorStateException when the current thread does not hold the lock (another
     *     thread does, or nobody: nothing is sent)
     * @throws LockLostException when the lock was lost while held (it was not protected to the end),
     *     unless the options set {@link AcquireOptions.Builder#throwOnLost(boolean) throwOnLost(false)}
     * @throws TicketingException when the client fails to release (the server then reclaims the
     *     lock when its lease ends)
     */
    @Override
    public void unlock() {
        Lock l = client.javaLockHolds.remove(me());
        if (l == null) {
            throw new IllegalMonitorStateException("unlock() of " + shown + " by a thread that does not hold it");
        }
        try {
            joinUninterruptibly(l.releaseAsync());
        } catch (LockLostException e) {
            if (options.throwOnLost()) {
                throw e;
            }
        }
    }

    /**
     * Not supported: a distributed lock has no condition variables.
     *
     * @return never
     * @throws UnsupportedOperationException always
     */
    @Override
    public Condition newCondition() {
        throw new UnsupportedOperationException("DistributedLock does not support conditions");
    }

    /**
     * Tells whether the current thread holds the lock: it locked, has not unlocked, and the lock is
     * not known lost.
     *
     * @return {@code true} while the current thread holds it
     */
    public boolean isHeldByCurrentThread() {
        Lock l = current();
        return l != null && !l.isLost();
    }

    /**
     * Returns the fencing token of the current thread's hold (Hazelcast's {@code getFence()}): pass
     * it to the resource you protect, which rejects tokens lower than the highest it has seen.
     *
     * @return the token, an unsigned 64-bit value (see {@link Lock#token()})
     * @throws IllegalMonitorStateException when the current thread does not hold the lock
     * @throws LockLostException when the lock was lost while held
     */
    public long token() {
        Lock l = current();
        if (l == null) {
            throw new IllegalMonitorStateException("token() of " + shown + " by a thread that does not hold it");
        }
        Optional<LostReason> lost = l.lostReason();
        if (lost.isPresent()) {
            throw new LockLostException("lock on " + shown + " was lost (" + lost.get() + "); unlock() it",
                    lost.get());
        }
        return l.token();
    }

    /**
     * Returns the current thread's hold as a {@link Lock}: its lease, time left, lost signal,
     * {@link Lock#extend extend} and {@link Lock#verify verify}. Releasing it directly ends the hold
     * as {@link #unlock()} would (from any thread).
     *
     * @return the hold, or empty when the current thread does not hold the lock
     */
    public Optional<Lock> heldLock() {
        return Optional.ofNullable(current());
    }

    private Lock acquireInterruptibly(long waitMs) throws InterruptedException {
        try {
            return client.acquire(key, options.withWaitMillis(waitMs));
        } catch (CancelledException e) {
            if (Thread.interrupted()) {
                InterruptedException ie = new InterruptedException(e.getMessage());
                ie.initCause(e);
                throw ie;
            }
            throw e;
        }
    }

    /** Waits for {@code f} ignoring interrupts (restoring the flag), as {@code Lock.lock()} and {@code unlock()} do. */
    private static <T> T joinUninterruptibly(CompletableFuture<T> f) {
        boolean interrupted = false;
        try {
            while (true) {
                try {
                    return f.get();
                } catch (InterruptedException e) {
                    interrupted = true;
                } catch (ExecutionException | CancellationException e) {
                    throw TicketingClient.unwrap(e);
                }
            }
        } finally {
            if (interrupted) {
                Thread.currentThread().interrupt();
            }
        }
    }

    @Override
    public String toString() {
        return "DistributedLock[" + shown + "]";
    }
}
