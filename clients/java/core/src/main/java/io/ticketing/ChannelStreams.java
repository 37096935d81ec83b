package io.ticketing;

import java.io.IOException;
import java.io.InputStream;
import java.io.OutputStream;
import java.net.InetSocketAddress;
import java.net.SocketException;
import java.net.SocketTimeoutException;
import java.net.UnknownHostException;
import java.nio.ByteBuffer;
import java.nio.channels.SelectionKey;
import java.nio.channels.Selector;
import java.nio.channels.SocketChannel;
import java.nio.channels.UnresolvedAddressException;

/**
 * Blocking streams over a non-blocking {@link SocketChannel}, for the connect and the handshake of
 * a plain TCP connection (whose channel {@link Connection} then reads without blocking). They keep
 * a plain {@link java.net.Socket}'s behaviour: a read timeout ({@link #timeoutMs}) ends a read with
 * {@link SocketTimeoutException}, {@link Thread#interrupt()} ends nothing (the flag is kept), and
 * closing the socket from another thread ends a wait within {@link #SLICE_MS}.
 */
final class ChannelStreams {
    /** How long one wait lasts before the channel is checked for a close from another thread. */
    static final long SLICE_MS = 20;

    private final SocketChannel ch;
    private final Selector sel;
    volatile int timeoutMs; // 0: none

    private ChannelStreams(SocketChannel ch, Selector sel) {
        this.ch = ch;
        this.sel = sel;
    }

    /**
     * Connects {@code ch} (non-blocking from now on) within {@code timeoutMs}, as
     * {@link java.net.Socket#connect(java.net.SocketAddress, int)} does.
     */
    static ChannelStreams connect(SocketChannel ch, InetSocketAddress addr, int timeoutMs) throws IOException {
        ch.configureBlocking(false);
        Selector sel = Selector.open();
        boolean ok = false;
        try {
            boolean done;
            try {
                done = ch.connect(addr);
            } catch (UnresolvedAddressException e) {
                throw new UnknownHostException(addr.getHostName());
            }
            if (!done) {
                SelectionKey k = ch.register(sel, SelectionKey.OP_CONNECT);
                long deadline = System.nanoTime() + timeoutMs * 1_000_000L;
                while (!ch.finishConnect()) {
                    long left = (deadline - System.nanoTime()) / 1_000_000;
                    if (left <= 0) {
                        throw new SocketTimeoutException("Connect timed out");
                    }
                    waitFor(sel, Math.min(left, SLICE_MS));
                    if (!ch.isOpen()) {
                        throw new SocketException("Socket closed");
                    }
                }
                k.interestOps(0);
            }
            ok = true;
            return new ChannelStreams(ch, sel);
        } finally {
            if (!ok) {
                sel.close();
            }
        }
    }

    /** Selects once, for up to {@code ms}; an interrupt neither ends the wait nor is lost. */
    static void waitFor(Selector sel, long ms) throws IOException {
        boolean interrupted = Thread.interrupted();
        try {
            sel.select(ms);
            sel.selectedKeys().clear();
        } finally {
            if (interrupted) {
                Thread.currentThread().interrupt();
            }
        }
    }

    /** Waits until the channel is ready for {@code op}, within the read timeout when reading. */
    private void await(int op, long deadline) throws IOException {
        SelectionKey k = ch.keyFor(sel);
        if (k == null) {
            k = ch.register(sel, op);
        } else {
            k.interestOps(op);
        }
        long slice = SLICE_MS;
        if (deadline != 0) {
            long left = (deadline - System.nanoTime()) / 1_000_000;
            if (left <= 0) {
                throw new SocketTimeoutException("Read timed out");
            }
            slice = Math.min(left, SLICE_MS);
        }
        waitFor(sel, slice);
        if (!ch.isOpen()) {
            throw new SocketException("Socket closed");
        }
    }

    /** Lets go of the selector used for the handshake (the connection uses its own). */
    void release() throws IOException {
        sel.close();
    }

    InputStream in() {
        return new InputStream() {
            @Override
            public int read() throws IOException {
                byte[] b = new byte[1];
                int n = read(b, 0, 1);
                return n < 0 ? -1 : b[0] & 0xFF;
            }

            @Override
            public int read(byte[] b, int off, int len) throws IOException {
                if (len == 0) {
                    return 0;
                }
                int t = timeoutMs;
                long deadline = t == 0 ? 0 : (System.nanoTime() + t * 1_000_000L) | 1; // 0: no timeout
                ByteBuffer bb = ByteBuffer.wrap(b, off, len);
                while (true) {
                    int n = ch.read(bb);
                    if (n != 0) {
                        return n;
                    }
                    await(SelectionKey.OP_READ, deadline);
                }
            }
        };
    }

    OutputStream out() {
        return new OutputStream() {
            @Override
            public void write(int b) throws IOException {
                write(new byte[] {(byte) b}, 0, 1);
            }

            @Override
            public void write(byte[] b, int off, int len) throws IOException {
                ByteBuffer bb = ByteBuffer.wrap(b, off, len);
                while (bb.hasRemaining()) {
                    if (ch.write(bb) == 0) {
                        await(SelectionKey.OP_WRITE, 0);
                    }
                }
            }
        };
    }
}
