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
import java.util.ArrayDeque;

/**
 * One established connection (after WELCOME): a reader thread that decodes every frame and hands
 * it to the engine, and a write queue drained by one thread at a time, in batches: by the caller
 * that queued a request ({@link #flush()}, after it let go of the engine's lock: no thread hop
 * on the request path), or else by the writer thread (frames queued by the client's own threads,
 * which must never block on a full socket). No thread holds a lock during I/O; the queue's
 * monitor guards only the queue and the drainer's claim.
 */
final class Connection {
    /** Receives what the connection reads, and its end. */
    interface Listener {
        void onFrame(Connection c, ResponseFrame f);

        void onFailure(Connection c, Throwable cause);
    }

    private static final int MAX_BATCH = 64 * 1024;

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

    Connection(Dialer.Dialed d, Listener listener, String name) {
        this.endpoint = d.endpoint();
        this.socket = d.socket();
        this.in = d.in();
        this.out = d.out();
        this.listener = listener;
        this.name = name;
    }

    void start() {
        Thread r = new Engine.IoThread(this::readLoop, "ticketing-reader-" + name);
        r.setDaemon(true);
        r.start();
        Thread w = new Engine.IoThread(this::writeLoop, "ticketing-writer-" + name);
        w.setDaemon(true);
        w.start();
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
    }

    /**
     * Writes what is queued in the calling thread, unless another thread is writing (it writes
     * these frames too, before it lets go). Never call it holding a lock, nor from the client's own
     * threads: a full socket blocks it.
     */
    void flush() {
        synchronized (queue) {
            if (writing || closed || queue.isEmpty()) {
                return;
            }
            writing = true;
        }
        try {
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
        try {
            socket.close();
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
