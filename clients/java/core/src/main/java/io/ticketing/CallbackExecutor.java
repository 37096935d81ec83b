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
    private volatile long taskStart; // System.nanoTime() when the running task started (readsSoon)
    /**
     * Writes the frames that tasks queued without writing them ({@link #cork}): set by the engine,
     * run by a callback thread (it may block on a full socket). Null: never corked.
     */
    volatile Runnable flushCorked;
    /** As {@link #flushCorked}, for the timer thread: hands the frames to the writer thread (never blocks). */
    volatile Runnable wakeWriter;
    /** Frames were queued by tasks and not written yet: whoever takes the last task writes them. */
    private volatile boolean corked;

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

    /**
     * A task on a callback thread sent a request while other tasks wait in the queue: instead of a
     * socket write per task, the frames of a run of tasks go out in one write, by the thread that
     * takes the last queued task (before running it) or finds the queue empty. Returns false (the
     * caller writes now) unless other tasks are queued. Should the task block before the run ends
     * (waiting on the answer to the frame it queued, say), the stall check writes the frames
     * within {@link #STALL_NANOS}: a corked frame never waits for a blocked task.
     */
    boolean cork() {
        if (tasks.isEmpty() || flushCorked == null) {
            return false;
        }
        corked = true;
        synchronized (lock) {
            if (!checkPending && !shutdown) {
                scheduleCheckLocked();
            }
        }
        return true;
    }

    /** Writes the corked frames, if any, in this (callback) thread. */
    private void uncork() {
        if (corked) {
            corked = false;
            Runnable f = flushCorked;
            if (f != null) {
                f.run();
            }
        }
    }

    /** Tells whether a callback thread is running tasks now (it reads the connection when it runs out). */
    boolean busy() {
        return busy;
    }

    /**
     * How long a task may run and still count as one whose thread reads soon ({@link #readsSoon}):
     * a task that runs longer may be blocked (in the application's code).
     */
    static final long SOON_NANOS = TimeUnit.MILLISECONDS.toNanos(1);

    /**
     * Tells whether a callback thread runs tasks now and started the current one less than
     * {@link #SOON_NANOS} ago: it reads the connection when it runs out, soon, without a wake-up.
     */
    boolean readsSoon() {
        return busy && idleRead != null && System.nanoTime() - taskStart < SOON_NANOS;
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
        // No longer pending before corked is read: a cork() that this check misses (it set corked
        // after the read below) finds no check pending and schedules the next one.
        synchronized (lock) {
            checkPending = false;
        }
        if (corked) {
            // Frames corked for a whole interval: the task that queued them may be blocked. The
            // writer thread writes them (a write of frames already written meanwhile is a no-op).
            corked = false;
            Runnable w = wakeWriter;
            if (w != null) {
                w.run();
            }
        }
        synchronized (lock) {
            if (checkPending || shutdown || tasks.isEmpty()) {
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
            if (r == null || tasks.isEmpty()) {
                uncork(); // the run of tasks ends: its frames go out in one write
            }
            if (r == null && idleRead != null) {
                r = readWhileIdle();
            }
            if (r != null) {
                busy = true;
                taskStart = System.nanoTime();
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
