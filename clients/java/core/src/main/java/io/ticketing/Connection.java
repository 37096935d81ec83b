package io.ticketing;

import io.ticketing.protocol.FrameException;
import io.ticketing.protocol.Protocol;
import io.ticketing.protocol.ResponseFrame;
import java.io.DataInputStream;
import java.io.EOFException;
import java.io.IOException;
import java.io.OutputStream;
import java.net.Socket;
import java.nio.ByteBuffer;
import java.nio.channels.ClosedSelectorException;
import java.nio.channels.SelectionKey;
import java.nio.channels.Selector;
import java.nio.channels.SocketChannel;
import java.util.ArrayDeque;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.locks.LockSupport;

/**
 * One established connection (after WELCOME): frames read and handed to the engine, and a write
 * queue drained by one thread at a time, in batches: by the caller that queued a request
 * ({@link #flush()}, after it let go of the engine's lock: no thread hop on the request path), or
 * else by the writer thread (frames queued by the client's own threads, which must never block on
 * a full socket). No thread holds a lock during I/O; the queue's monitor guards only the queue and
 * the drainer's claim.
 *
 * <p>Reading, over TLS: the reader thread reads every frame. Over plain TCP (a non-blocking
 * channel): one thread at a time holds the <em>read role</em> and reads (leader/follower). A
 * caller blocked on its own answer ({@link #await}) takes the role when nobody holds it, handles
 * every frame that arrives (its answer, others' answers, pushes) and, once its answer is in, hands
 * the role to another caller waiting for one, or lets it go; so at one caller an answer costs no
 * thread hand-off. A caller waiting while another thread reads parks until its answer is handled
 * or the role is handed to it. The reader thread takes the role when it has been free for
 * {@link #IDLE_NANOS} (pushes, heartbeats and a lost connection while no call waits), or at once
 * when a frame no blocking caller waits on was sent while nobody reads ({@link #nudge}); while it
 * reads, a caller that starts waiting wakes it and it hands the role over, and when it finds nothing
 * to read while another thread will read soon unasked ({@link Listener#readerComing}: a callback
 * thread running tasks) it lets the role go. A reading caller waits
 * in a selector, so {@link Thread#interrupt()} and its request's timeout (its future completed by
 * the timer thread, which wakes the selector) end its wait exactly as they end a future's.
 */
final class Connection {
    /** Receives what the connection reads, and its end. */
    interface Listener {
        void onFrame(Connection c, ResponseFrame f);

        void onFailure(Connection c, Throwable cause);

        /**
         * Tells whether another thread will read the connection soon without being woken (a
         * callback thread running tasks reads once it runs out): the reader thread, finding
         * nothing to read, lets the role go instead of waiting for the next bytes itself.
         */
        default boolean readerComing() {
            return false;
        }
    }

    private static final int MAX_BATCH = 64 * 1024;
    /** How long the read role stays free before the reader thread takes it back. */
    static final long IDLE_NANOS = TimeUnit.MILLISECONDS.toNanos(5);

    final Endpoint endpoint;
    private final Socket socket;
    private final DataInputStream in;
    private final OutputStream out;
    private final Listener listener;
    private final String name;
    private final ArrayDeque<byte[]> queue = new ArrayDeque<>(); // guarded by queue
    private boolean closed; // guarded by queue
    private boolean writing; // guarded by queue: a thread is draining the queue (only one at a time)
    private volatile long lastReceive = System.nanoTime();

    // Plain TCP only (null over TLS): the non-blocking channel, and its read and write selectors.
    private final SocketChannel ch;
    private final Selector rsel;
    private final Selector wsel;
    /** Bytes read and not yet handled: only the read role's holder touches it (write mode between turns). */
    private ByteBuffer rbuf;
    private ByteBuffer wbuf; // only the drainer touches it

    // The read role (plain TCP): guarded by rd, except role, also read without it.
    private final Object rd = new Object();
    private volatile Thread role; // the thread reading now, or null
    private Thread readerThread;
    private final ArrayDeque<Waiter> followers = new ArrayDeque<>(); // callers waiting for their answer
    private long freedAt = System.nanoTime(); // when the role was last let go
    private boolean readerNow; // a frame nobody waits on went out: the reader thread takes the role at once
    private volatile boolean dead; // closed, or failed: callers stop reading here
    /** Frames the reader thread handled over plain TCP (written by it alone; for tests). */
    private volatile long readerFrames;

    Connection(Dialer.Dialed d, Listener listener, String name) throws IOException {
        this.endpoint = d.endpoint();
        this.socket = d.socket();
        this.in = d.in();
        this.out = d.out();
        this.listener = listener;
        this.name = name;
        SocketChannel c = socket.getChannel();
        if (c == null) {
            ch = null;
            rsel = null;
            wsel = null;
            return;
        }
        // Bytes the handshake's buffered stream read past the WELCOME are the start of the stream.
        int left = in.available();
        byte[] early = left > 0 ? in.readNBytes(left) : new byte[0];
        rbuf = ByteBuffer.allocate(Math.max(128 * 1024, early.length * 2));
        rbuf.put(early);
        wbuf = ByteBuffer.allocateDirect(MAX_BATCH + 4096);
        Selector r = null;
        Selector w = null;
        try {
            r = Selector.open();
            w = Selector.open();
            c.register(r, SelectionKey.OP_READ);
            c.register(w, SelectionKey.OP_WRITE);
        } catch (IOException | RuntimeException e) {
            if (r != null) {
                r.close();
            }
            if (w != null) {
                w.close();
            }
            throw e;
        }
        ch = c;
        rsel = r;
        wsel = w;
    }

    /** Tells whether callers read their own answers here (plain TCP). */
    boolean leaderFollower() {
        return ch != null;
    }

    /** How many frames the reader thread has handled over plain TCP (tests: who read the answers). */
    long readerFrames() {
        return readerFrames;
    }

    /** Tells whether {@code t} holds the read role (it must not block on a socket write then). */
    boolean reading(Thread t) {
        return role == t;
    }

    void start() {
        Thread r = new Engine.IoThread(ch == null ? this::readLoop : this::readerThreadLoop, "ticketing-reader-" + name);
        r.setDaemon(true);
        if (ch != null) {
            synchronized (rd) {
                readerThread = r;
                role = r; // the reader thread reads until a caller waits
            }
        }
        r.start();
        Thread w = new Engine.IoThread(this::writeLoop, "ticketing-writer-" + name);
        w.setDaemon(true);
        w.start();
    }

    /** Tells whether the connection is closed or failed. */
    boolean isDead() {
        return dead;
    }

    /** Nanotime of the last frame received. */
    long lastReceive() {
        return lastReceive;
    }

    /** Queues a frame for the wire, for the writer thread; frames go out in the order queued. */
    void enqueue(byte[] frame) {
        enqueue(frame, true);
    }

    /**
     * Queues a frame for the wire; frames go out in the order queued. With {@code wake} false the
     * caller must call {@link #flush()} next (once it holds no lock): the writer thread is not woken.
     */
    void enqueue(byte[] frame, boolean wake) {
        synchronized (queue) {
            if (closed) {
                return;
            }
            queue.add(frame);
            if (wake && !writing) {
                queue.notifyAll();
            }
        }
        if (wake) {
            nudge(); // the client's own frame: no caller waits on its answer
        }
    }

    /** Has the writer thread write what is queued, unless a thread is writing now (never blocks). */
    void wakeWriter() {
        synchronized (queue) {
            if (!writing && !closed && !queue.isEmpty()) {
                queue.notifyAll();
            }
        }
    }

    /**
     * Writes what is queued in the calling thread, unless another thread is writing (it writes
     * these frames too, before it lets go). Never call it holding a lock, nor from the client's own
     * threads: a full socket blocks it.
     */
    void flush() {
        flush(false);
    }

    /**
     * As {@link #flush()}; with {@code gather} (many requests in flight: other callers are about to
     * queue theirs) it takes the writer's claim, then yields the CPU once before writing, so that
     * the frames the threads that run meanwhile queue go out in the same write.
     */
    void flush(boolean gather) {
        synchronized (queue) {
            if (writing || closed || queue.isEmpty()) {
                return;
            }
            writing = true;
        }
        try {
            if (gather) {
                Thread.yield();
            }
            drain();
        } catch (IOException e) {
            listener.onFailure(this, new ConnectionLostException("connection to " + endpoint + " lost: " + e.getMessage(), e));
        }
    }

    /** With the claim ({@link #writing}) taken: writes batches until the queue is empty, then lets go. */
    private void drain() throws IOException {
        byte[][] frames = new byte[16][];
        boolean ok = false;
        try {
            while (true) {
                int count = 0;
                synchronized (queue) {
                    if (queue.isEmpty() || closed) {
                        writing = false;
                        ok = true;
                        return;
                    }
                    int n = 0;
                    while (!queue.isEmpty() && n < MAX_BATCH) {
                        byte[] f = queue.poll();
                        if (count == frames.length) {
                            frames = java.util.Arrays.copyOf(frames, count * 2);
                        }
                        frames[count++] = f;
                        n += f.length;
                    }
                }
                if (ch != null) {
                    writeChannel(frames, count);
                    continue;
                }
                for (int i = 0; i < count; i++) {
                    out.write(frames[i]); // into the 64 KiB buffer; large frames go straight through
                    frames[i] = null;
                }
                out.flush();
            }
        } finally {
            if (!ok) {
                synchronized (queue) {
                    writing = false;
                }
            }
        }
    }

    /** Writes a batch to the non-blocking channel, waiting for room when the socket is full. */
    private void writeChannel(byte[][] frames, int count) throws IOException {
        ByteBuffer b = wbuf;
        b.clear();
        for (int i = 0; i < count; i++) {
            byte[] f = frames[i];
            frames[i] = null;
            if (f.length > b.remaining()) {
                b.flip();
                writeFully(b);
                b.clear();
                if (f.length > b.remaining()) {
                    writeFully(ByteBuffer.wrap(f));
                    continue;
                }
            }
            b.put(f);
        }
        b.flip();
        writeFully(b);
    }

    /**
     * Writes all of {@code b}. Like a blocking socket write it is not ended by an interrupt: the
     * flag is kept for the caller, and set again when the write is done.
     */
    private void writeFully(ByteBuffer b) throws IOException {
        boolean interrupted = false;
        try {
            while (b.hasRemaining()) {
                if (ch.write(b) > 0) {
                    continue;
                }
                if (dead) {
                    throw new IOException("connection closed");
                }
                if (Thread.interrupted()) {
                    interrupted = true;
                }
                try {
                    wsel.select(100);
                    wsel.selectedKeys().clear();
                } catch (ClosedSelectorException e) {
                    throw new IOException("connection closed");
                }
            }
        } finally {
            if (interrupted) {
                Thread.currentThread().interrupt();
            }
        }
    }

    /** Closes the socket; the reader and writer end. Idempotent. */
    void close() {
        synchronized (queue) {
            if (closed) {
                return;
            }
            closed = true;
            queue.clear();
            queue.notifyAll();
        }
        dead = true;
        try {
            socket.close();
        } catch (IOException ignored) {
            // closing anyway
        }
        if (ch != null) {
            rsel.wakeup();
            wsel.wakeup();
            synchronized (rd) {
                rd.notifyAll();
                for (Waiter w : followers) {
                    LockSupport.unpark(w.thread);
                }
            }
        }
    }

    // ---- the read role (plain TCP) ----

    /** A caller blocked on its answer. */
    static final class Waiter {
        final Thread thread = Thread.currentThread();
        final CompletableFuture<?> f;
        volatile Connection at; // the connection it waits on (whose role it may hold)

        Waiter(CompletableFuture<?> f) {
            this.f = f;
            f.whenComplete((v, e) -> woken());
        }

        /** The answer is in (or the call failed): wake the caller, parked or reading. */
        private void woken() {
            if (Thread.currentThread() == thread) {
                return;
            }
            LockSupport.unpark(thread);
            Connection c = at;
            if (c != null && c.role == thread) {
                c.rsel.wakeup();
            }
        }
    }

    /**
     * Waits here (plain TCP) until {@code w}'s future is done, reading when this thread gets the
     * role; returns early, future not done, when the connection is closed or failed (the caller
     * waits on the next one). Throws when the thread is interrupted (the flag cleared, as a
     * future's {@code get} does).
     */
    void await(Waiter w) throws InterruptedException {
        Thread me = w.thread;
        w.at = this;
        try {
            while (!w.f.isDone()) {
                boolean lead = false;
                synchronized (rd) {
                    if (dead) {
                        return;
                    }
                    if (role == null) {
                        role = me;
                        lead = true;
                    } else if (role != me) {
                        if (!followers.contains(w)) {
                            followers.add(w);
                        }
                        if (role == readerThread) {
                            rsel.wakeup(); // it hands the role over after the frames it has
                        }
                    } else {
                        lead = true; // handed to this thread
                    }
                }
                if (lead) {
                    lead(w);
                    continue;
                }
                if (Thread.interrupted()) {
                    throw new InterruptedException();
                }
                LockSupport.park(this);
                if (Thread.interrupted()) {
                    synchronized (rd) {
                        followers.remove(w);
                        if (role == me) {
                            releaseLocked(me);
                        }
                    }
                    throw new InterruptedException();
                }
            }
        } finally {
            synchronized (rd) {
                followers.remove(w);
                if (role == me) {
                    releaseLocked(me); // (a role handed over just as the answer came in)
                }
            }
            w.at = null;
        }
    }

    /**
     * For a callback thread with nothing to run: takes the read role if nobody holds it and reads
     * until {@code w}'s future is done (a task came) or nothing has come for {@code idleNanos}.
     * Returns false at once when another thread reads or the connection is dead.
     */
    boolean tryLead(Waiter w, long idleNanos) {
        Thread me = w.thread;
        synchronized (rd) {
            if (dead) {
                return false;
            }
            if (role == null) {
                role = me;
            } else if (role == readerThread && followers.isEmpty()) {
                followers.add(w); // the reader thread hands the role over after the frames it has
                rsel.wakeup();
            } else {
                return false; // a caller reads (for everyone)
            }
        }
        w.at = this;
        boolean interrupted = false;
        try {
            while (role != me) {
                if (w.f.isDone() || dead) {
                    return true;
                }
                LockSupport.park(this);
                if (Thread.interrupted()) {
                    interrupted = true; // not ours: kept for the task code
                }
            }
            lead(w, idleNanos);
        } catch (InterruptedException e) {
            interrupted = true;
        } finally {
            synchronized (rd) {
                followers.remove(w);
                if (role == me) {
                    releaseLocked(me);
                }
            }
            w.at = null;
            if (interrupted) {
                Thread.currentThread().interrupt();
            }
        }
        return true;
    }

    /** This thread holds the role: reads until w's answer is in, then lets the role go. */
    private void lead(Waiter w) throws InterruptedException {
        lead(w, 0);
    }

    /** As {@link #lead(Waiter)}; with {@code idleNanos} > 0 it stops when nothing came for that long. */
    private void lead(Waiter w, long idleNanos) throws InterruptedException {
        Thread me = w.thread;
        long active = System.nanoTime();
        try {
            while (!w.f.isDone() && !dead) {
                if (Thread.interrupted()) {
                    throw new InterruptedException();
                }
                if (idleNanos > 0) {
                    long left = idleNanos - (System.nanoTime() - active);
                    int r = left <= 0 ? 0 : readFor(left);
                    if (r < 0) {
                        return; // failed (the engine was told) or closed
                    }
                    if (r > 0) {
                        active = System.nanoTime();
                    } else if (System.nanoTime() - active >= idleNanos) {
                        synchronized (rd) {
                            readerNow = true; // nothing came: the reader thread takes over at once
                        }
                        return;
                    }
                    continue; // (woken with nothing to read)
                }
                if (!readOnce()) {
                    return; // failed: the engine was told
                }
            }
        } finally {
            synchronized (rd) {
                if (role == me) {
                    releaseLocked(me);
                }
            }
        }
    }

    /**
     * rd held, the role held by {@code me}: hands it to a caller still waiting for its answer, or
     * lets it go (the reader thread is told at once when a frame nobody waits on went out).
     */
    private void releaseLocked(Thread me) {
        // However many callers wait, one of them reads for all (never the reader thread): each
        // answer it reads wakes only its own caller, and the reader would add a thread of its own
        // (its epoll wake-up per read, and the selector wake-ups callers make to take the role
        // from it). With 16 callers this halved the CPU per pair (issue 31).
        Waiter next;
        while ((next = followers.poll()) != null) {
            if (!next.f.isDone() && next.thread != me) {
                role = next.thread;
                LockSupport.unpark(next.thread);
                return;
            }
        }
        role = null;
        freedAt = System.nanoTime();
        if (readerNow || dead) {
            rd.notifyAll();
        }
    }

    /** rd held: how many callers other than {@code me} wait for an answer not yet in. */
    private int waiting(Thread me) {
        int n = 0;
        for (Waiter w : followers) {
            if (w.thread != me && !w.f.isDone()) {
                n++;
            }
        }
        return n;
    }

    /**
     * Sent a frame no blocking caller waits on (an asynchronous call's, the client's own): the
     * reader thread reads its answer unless another thread does.
     */
    void nudge() {
        if (ch == null) {
            return;
        }
        synchronized (rd) {
            readerNow = true;
            if (role == null) {
                rd.notifyAll();
            }
        }
    }

    /**
     * One turn of a waiting caller holding the role: handles the complete frames buffered, or else
     * waits for bytes, reads and handles what came (its answer is rarely in yet: no read before
     * the wait; the reader thread's turn is {@link #readerTurn}). Returns false once the connection
     * failed (the engine was told) or closed.
     */
    private boolean readOnce() {
        try {
            if (handleBuffered() > 0) {
                return true;
            }
            rsel.select();
            rsel.selectedKeys().clear();
            int n = ch.read(rbuf);
            if (n < 0) {
                fail(new ConnectionLostException("connection to " + endpoint + " closed by the server"));
                return false;
            }
            if (n > 0) {
                handleBuffered();
            }
            return !dead;
        } catch (FrameException | IOException | RuntimeException e) {
            failReading(e);
        }
        return false;
    }

    /**
     * The reader thread's turn: handles the complete frames buffered, or else reads without
     * waiting and handles what came, or else, unless another thread will read soon
     * ({@link Listener#readerComing}), waits for bytes. Returns 1 when it handled or read
     * something, 0 when nothing was there and it did not wait, -1 once dead or failed.
     */
    private int readerTurn() {
        try {
            int h = handleBuffered();
            if (h > 0) {
                readerFrames += h;
                return 1;
            }
            int n = ch.read(rbuf);
            if (n == 0) {
                if (listener.readerComing()) {
                    return 0;
                }
                rsel.select();
                rsel.selectedKeys().clear();
                n = ch.read(rbuf);
            }
            if (n < 0) {
                fail(new ConnectionLostException("connection to " + endpoint + " closed by the server"));
                return -1;
            }
            if (n > 0) {
                readerFrames += handleBuffered();
            }
            return dead ? -1 : 1;
        } catch (FrameException | IOException | RuntimeException e) {
            failReading(e);
        }
        return -1;
    }

    /** As readOnce, waiting at most {@code nanos}: 1 when it read or handled, 0 when nothing came, -1 once dead. */
    private int readFor(long nanos) {
        try {
            if (handleBuffered() > 0) {
                return 1;
            }
            rsel.select(Math.max(1, TimeUnit.NANOSECONDS.toMillis(nanos)));
            rsel.selectedKeys().clear();
            int n = ch.read(rbuf);
            if (n < 0) {
                fail(new ConnectionLostException("connection to " + endpoint + " closed by the server"));
                return -1;
            }
            if (n > 0) {
                handleBuffered();
                return dead ? -1 : 1;
            }
            return dead ? -1 : 0;
        } catch (FrameException | IOException | RuntimeException e) {
            failReading(e);
        }
        return -1;
    }

    /** Fails the connection for what a read or the handling of a frame threw. */
    private void failReading(Exception e) {
        if (e instanceof FrameException) {
            fail(new ProtocolException("malformed frame from " + endpoint + ": " + e.getMessage()));
        } else if (e instanceof ClosedSelectorException) {
            fail(new ConnectionLostException("connection to " + endpoint + " closed"));
        } else if (e instanceof IOException) {
            fail(new ConnectionLostException("connection to " + endpoint + " lost: " + e.getMessage(), e));
        } else {
            fail(new ProtocolException("cannot handle a frame from " + endpoint + ": " + e, e));
        }
    }

    private void fail(TicketingException e) {
        if (dead) {
            return; // closed on purpose: nothing to tell
        }
        dead = true;
        listener.onFailure(this, e);
        close();
    }

    /** Handles every complete frame in {@link #rbuf}; returns how many. */
    private int handleBuffered() throws FrameException {
        ByteBuffer b = rbuf;
        b.flip();
        int handled = 0;
        try {
            while (b.remaining() >= 4 && !dead) {
                long len = b.getInt(b.position()) & 0xFFFF_FFFFL;
                if (len > 28L + Protocol.MAX_DATA_LEN || len < 28) {
                    throw new FrameException(FrameException.Kind.LENGTH, "frame length " + len + " from the server");
                }
                if (b.remaining() < 4 + len) {
                    break;
                }
                byte[] frame = new byte[4 + (int) len];
                b.get(frame);
                lastReceive = System.nanoTime();
                ResponseFrame f = ResponseFrame.decode(ByteBuffer.wrap(frame), Protocol.MAX_DATA_LEN);
                handled++;
                listener.onFrame(this, f);
            }
        } finally {
            b.compact();
        }
        return handled;
    }

    /** The reader thread over plain TCP: reads while no caller waits (see the class comment). */
    private void readerThreadLoop() {
        Thread me = Thread.currentThread();
        try {
            while (true) {
                synchronized (rd) {
                    while (role != me) {
                        if (dead) {
                            return;
                        }
                        if (role == null) {
                            long idle = System.nanoTime() - freedAt;
                            if (readerNow || idle >= IDLE_NANOS) {
                                role = me;
                                readerNow = false;
                                break;
                            }
                            TimeUnit.NANOSECONDS.timedWait(rd, IDLE_NANOS - idle);
                        } else {
                            rd.wait(TimeUnit.NANOSECONDS.toMillis(IDLE_NANOS) + 1);
                        }
                    }
                }
                while (true) {
                    int got = readerTurn();
                    synchronized (rd) {
                        if (got < 0 || dead) {
                            if (role == me) {
                                releaseLocked(me);
                            }
                            return;
                        }
                        int n = waiting(me);
                        if (n > 0) {
                            releaseLocked(me); // a caller waits: it reads from now on
                            break;
                        }
                        if (got == 0 && n == 0) {
                            // Nothing to read, and a callback thread reads when its tasks run out:
                            // it reads the answers to the requests its tasks send, so one thread
                            // handles them and runs their completions, with no hand-off between
                            // two (the pipelined driver's loop: read all, run all, write all). Not
                            // handed back at once (readerNow cleared): this thread takes the role
                            // again when it stays free for IDLE_NANOS.
                            readerNow = false;
                            releaseLocked(me);
                            break;
                        }
                    }
                }
            }
        } catch (InterruptedException e) {
            Thread.currentThread().interrupt();
        } finally {
            closeSelectorsWhenFree();
        }
    }

    /** The reader thread ends (the connection is dead): the selectors go once no thread reads. */
    private void closeSelectorsWhenFree() {
        synchronized (rd) {
            long until = System.nanoTime() + TimeUnit.SECONDS.toNanos(5);
            while (role != null && role != Thread.currentThread() && System.nanoTime() - until < 0) {
                rsel.wakeup();
                try {
                    rd.wait(10);
                } catch (InterruptedException e) {
                    break;
                }
            }
        }
        try {
            rsel.close();
        } catch (IOException ignored) {
            // closing anyway
        }
        try {
            wsel.close();
        } catch (IOException ignored) {
            // closing anyway
        }
    }

    private void readLoop() {
        byte[] lenBuf = new byte[4];
        try {
            while (true) {
                in.readFully(lenBuf);
                long len = ByteBuffer.wrap(lenBuf).getInt() & 0xFFFF_FFFFL;
                if (len > 28L + Protocol.MAX_DATA_LEN || len < 28) {
                    throw new FrameException(FrameException.Kind.LENGTH, "frame length " + len + " from the server");
                }
                byte[] frame = new byte[4 + (int) len];
                System.arraycopy(lenBuf, 0, frame, 0, 4);
                in.readFully(frame, 4, (int) len);
                lastReceive = System.nanoTime();
                ResponseFrame f = ResponseFrame.decode(ByteBuffer.wrap(frame), Protocol.MAX_DATA_LEN);
                listener.onFrame(this, f);
            }
        } catch (EOFException e) {
            listener.onFailure(this, new ConnectionLostException("connection to " + endpoint + " closed by the server"));
        } catch (FrameException e) {
            listener.onFailure(this, new ProtocolException("malformed frame from " + endpoint + ": " + e.getMessage()));
        } catch (IOException e) {
            listener.onFailure(this, new ConnectionLostException("connection to " + endpoint + " lost: " + e.getMessage(), e));
        } catch (RuntimeException e) {
            listener.onFailure(this, new ProtocolException("cannot handle a frame from " + endpoint + ": " + e, e));
        }
    }

    private void writeLoop() {
        try {
            while (true) {
                synchronized (queue) {
                    while ((queue.isEmpty() || writing) && !closed) {
                        queue.wait();
                    }
                    if (closed) {
                        return;
                    }
                    writing = true;
                }
                drain();
            }
        } catch (IOException e) {
            listener.onFailure(this, new ConnectionLostException("connection to " + endpoint + " lost: " + e.getMessage(), e));
        } catch (InterruptedException e) {
            Thread.currentThread().interrupt();
        }
    }
}
