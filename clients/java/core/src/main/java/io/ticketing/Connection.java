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
 * it to the engine, and a writer thread that batches queued frames into one write. Neither thread
 * holds a lock during I/O; the queue's monitor guards only the queue.
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
        Thread r = new Thread(this::readLoop, "ticketing-reader-" + name);
        r.setDaemon(true);
        r.start();
        Thread w = new Thread(this::writeLoop, "ticketing-writer-" + name);
        w.setDaemon(true);
        w.start();
    }

    /** Nanotime of the last frame received. */
    long lastReceive() {
        return lastReceive;
    }

    /** Queues a frame for the wire; frames go out in the order queued. */
    void enqueue(byte[] frame) {
        synchronized (queue) {
            if (closed) {
                return;
            }
            queue.add(frame);
            queue.notifyAll();
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
        byte[] batch = new byte[MAX_BATCH];
        try {
            while (true) {
                int n = 0;
                byte[] big = null;
                synchronized (queue) {
                    while (queue.isEmpty() && !closed) {
                        queue.wait();
                    }
                    if (closed) {
                        return;
                    }
                    while (!queue.isEmpty()) {
                        byte[] f = queue.peek();
                        if (f.length > MAX_BATCH - n) {
                            if (n == 0) {
                                big = queue.poll();
                            }
                            break;
                        }
                        queue.poll();
                        System.arraycopy(f, 0, batch, n, f.length);
                        n += f.length;
                    }
                }
                if (big != null) {
                    out.write(big);
                } else {
                    out.write(batch, 0, n);
                }
                out.flush();
            }
        } catch (IOException e) {
            listener.onFailure(this, new ConnectionLostException("connection to " + endpoint + " lost: " + e.getMessage(), e));
        } catch (InterruptedException e) {
            Thread.currentThread().interrupt();
        }
    }
}
