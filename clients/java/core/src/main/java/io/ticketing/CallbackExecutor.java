package io.ticketing;

import java.util.concurrent.ConcurrentLinkedQueue;
import java.util.concurrent.Executor;
import java.util.concurrent.RejectedExecutionException;
import java.util.concurrent.ScheduledExecutorService;
import java.util.concurrent.ThreadFactory;
import java.util.concurrent.TimeUnit;

/**
 * Runs the application-facing completions off the client's I/O threads. One queue, drained by
 * callback threads that run task after task while there are any, so that a burst of answers costs
 * one thread wake-up, not one per answer (a hand-off per task to an idle thread, as a cached thread
 * pool does, costs a context switch each). A thread is woken (or started) only when none is
 * draining; and since a callback may block (the application's code runs here), a check on the
 * timer adds a thread whenever tasks have waited {@link #STALL_NANOS} with none started meanwhile:
 * no callback waits on another blocked callback for longer than that. Idle threads end after
 * {@link #KEEP_ALIVE_NANOS}.
 */
final class CallbackExecutor implements Executor {
    static final long STALL_NANOS = TimeUnit.MILLISECONDS.toNanos(5);
    static final long KEEP_ALIVE_NANOS = TimeUnit.SECONDS.toNanos(30);

    private final ThreadFactory factory;
    private final ScheduledExecutorService timer;
    private final ConcurrentLinkedQueue<Runnable> tasks = new ConcurrentLinkedQueue<>();
    private final Object lock = new Object();
    /**
     * Reads the connection while a callback thread has nothing to run (see {@link #work()}): told
     * of a future completed when a task comes, it reads until then or until nothing comes for a
     * while; false when it could not read (another thread reads, or no connection). Null: never.
     */
    volatile java.util.function.Predicate<java.util.concurrent.CompletableFuture<Void>> idleRead;
    private volatile Thread reading; // the callback thread reading now, if any
    private java.util.concurrent.CompletableFuture<Void> taskCame; // guarded by lock: completed by execute
    private volatile boolean busy; // a callback thread is running tasks (it reads when it runs out)
    private volatile long started; // tasks started so far (the stall check's measure of progress)

    // guarded by lock
    private int active; // threads draining the queue (or woken to)
    private int idle; // threads waiting for a signal
    private int signals; // wake-ups given and not yet taken
    private boolean checkPending;
    private long checkedAt; // started, at the last stall check
    private boolean shutdown;

    CallbackExecutor(ThreadFactory factory, ScheduledExecutorService timer) {
        this.factory = factory;
        this.timer = timer;
    }

    @Override
    public void execute(Runnable r) {
        tasks.add(r);
        Thread me = Thread.currentThread();
        if (me == reading) {
            // The callback thread that reads queued it (handling an answer): it runs it next.
            java.util.concurrent.CompletableFuture<Void> f;
            synchronized (lock) {
                f = taskCame;
            }
            if (f != null) {
                f.complete(null);
                return;
            }
        }
        synchronized (lock) {
            if (shutdown) {
                if (tasks.remove(r)) {
                    throw new RejectedExecutionException("the client is closed");
                }
                return; // a thread took it meanwhile
            }
            if (taskCame != null) {
                taskCame.complete(null); // wakes the callback thread that reads: it runs it next
            } else if (active == 0) {
                addDrainerLocked();
            } else if (!checkPending) {
                scheduleCheckLocked();
            }
        }
    }

    /** Tells whether a callback thread is running tasks now (it reads the connection when it runs out). */
    boolean busy() {
        return busy;
    }

    /** Tells whether {@code t} is a callback thread of {@code owner}'s executor. */
    static boolean isCallbackThread(Thread t, Object owner) {
        return t instanceof CallbackThread c && c.owner == owner;
    }

    /** The threads of a CallbackExecutor, with the object they work for. */
    static final class CallbackThread extends Thread {
        final Object owner;

        CallbackThread(Runnable r, String name, Object owner) {
            super(r, name);
            this.owner = owner;
        }
    }

    private void addDrainerLocked() {
        active++;
        if (idle > 0) {
            idle--;
            signals++;
            lock.notify();
        } else {
            Thread t = factory.newThread(this::work);
            t.start();
        }
    }

    private void scheduleCheckLocked() {
        checkPending = true;
        checkedAt = started;
        try {
            timer.schedule(this::stallCheck, STALL_NANOS, TimeUnit.NANOSECONDS);
        } catch (RejectedExecutionException e) {
            checkPending = false; // the client is closing
        }
    }

    /** Tasks waited a whole interval and none started: every draining thread is blocked. */
    private void stallCheck() {
        synchronized (lock) {
            checkPending = false;
            if (shutdown || tasks.isEmpty()) {
                return;
            }
            if (started == checkedAt) {
                addDrainerLocked();
            }
            scheduleCheckLocked();
        }
    }

    private void work() {
        busy = true;
        while (true) {
            Runnable r = tasks.poll();
            if (r == null && idleRead != null) {
                r = readWhileIdle();
            }
            if (r != null) {
                busy = true;
                started++; // (one writer at a time is not needed: a lost count only delays a check)
                try {
                    r.run();
                } catch (Throwable t) {
                    Thread me = Thread.currentThread();
                    me.getUncaughtExceptionHandler().uncaughtException(me, t);
                }
                continue;
            }
            synchronized (lock) {
                if (!tasks.isEmpty()) {
                    continue;
                }
                busy = false;
                active--;
                idle++;
                long deadline = System.nanoTime() + KEEP_ALIVE_NANOS;
                while (signals == 0) {
                    long left = deadline - System.nanoTime();
                    if (shutdown || left <= 0) {
                        idle--;
                        return;
                    }
                    try {
                        TimeUnit.NANOSECONDS.timedWait(lock, left);
                    } catch (InterruptedException e) {
                        // only shutdown ends a thread
                    }
                }
                signals--; // counted active by the signaller
                busy = true;
            }
        }
    }

    /**
     * No task: reads the connection (the answers that queue the next tasks) unless another thread
     * reads; returns the next task, or null when none came (then the thread waits as usual).
     */
    private Runnable readWhileIdle() {
        java.util.concurrent.CompletableFuture<Void> f = new java.util.concurrent.CompletableFuture<>();
        synchronized (lock) {
            if (shutdown || reading != null || !tasks.isEmpty()) {
                return tasks.poll();
            }
            reading = Thread.currentThread();
            taskCame = f;
        }
        try {
            idleRead.test(f);
        } catch (RuntimeException e) {
            Thread me = Thread.currentThread();
            me.getUncaughtExceptionHandler().uncaughtException(me, e);
        } finally {
            synchronized (lock) {
                reading = null;
                taskCame = null;
            }
        }
        return tasks.poll();
    }

    /** Lets the queued tasks run, then ends the threads; later tasks are rejected. */
    void shutdown() {
        synchronized (lock) {
            shutdown = true;
            if (taskCame != null) {
                taskCame.complete(null);
            }
            lock.notifyAll();
        }
    }
}
