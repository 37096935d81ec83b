package io.ticketing.protocol;

import java.nio.ByteBuffer;
import java.nio.ByteOrder;

/**
 * A request frame (client to server): a 32-byte header and the key.
 *
 * @param op the operation code ({@link Op#code()}, or any byte for tests of unknown ops)
 * @param flags reserved, 0
 * @param requestId the request id (an unsigned 64-bit value)
 * @param token RELEASE/EXTEND: the fencing token; CANCEL: the request id to withdraw; INSPECT:
 *     0 or a token to check; ACK: the lowest id still awaited (unsigned 64-bit)
 * @param leaseMs ACQUIRE/EXTEND: the lease in milliseconds (unsigned 32-bit)
 * @param waitMs ACQUIRE: how long to wait in the queue (0: try once; {@link Protocol#WAIT_FOREVER})
 * @param key the key, empty for ops without one
 */
public record RequestFrame(int op, int flags, long requestId, long token, long leaseMs, long waitMs, byte[] key) {

    /**
     * Creates the frame, checking that every field fits its width.
     *
     * @param op the operation code ({@link Op#code()}, or any byte for tests of unknown ops)
     * @param flags reserved, 0
     * @param requestId the request id (an unsigned 64-bit value)
     * @param token RELEASE/EXTEND: the fencing token; CANCEL: the request id to withdraw; INSPECT:
     *     0 or a token to check; ACK: the lowest id still awaited (unsigned 64-bit)
     * @param leaseMs ACQUIRE/EXTEND: the lease in milliseconds (unsigned 32-bit)
     * @param waitMs ACQUIRE: how long to wait in the queue (0: try once; {@link Protocol#WAIT_FOREVER})
     * @param key the key, empty for ops without one
     */
    public RequestFrame {
        if (op < 0 || op > 0xFF || flags < 0 || flags > 0xFF) {
            throw new IllegalArgumentException("op and flags are single bytes");
        }
        Bytes.checkU32("lease_ms", leaseMs);
        Bytes.checkU32("wait_ms", waitMs);
        if (key == null) {
            key = new byte[0];
        }
        if (key.length > Protocol.MAX_KEY_LEN) {
            throw new IllegalArgumentException("key longer than " + Protocol.MAX_KEY_LEN + " bytes");
        }
    }

    /** {@return the size of the encoded frame} */
    public int size() {
        return Protocol.HEADER + key.length;
    }

    /** {@return the encoded frame} */
    public byte[] encode() {
        ByteBuffer b = ByteBuffer.allocate(size());
        encodeTo(b);
        return b.array();
    }

    /**
     * Writes the encoded frame at the buffer's position, advancing it.
     *
     * @param b a big-endian buffer with at least {@link #size()} bytes remaining
     */
    public void encodeTo(ByteBuffer b) {
        b.order(ByteOrder.BIG_ENDIAN);
        b.putInt(28 + key.length);
        b.put((byte) op);
        b.put((byte) flags);
        b.putShort((short) key.length);
        b.putLong(requestId);
        b.putLong(token);
        b.putInt((int) leaseMs);
        b.putInt((int) waitMs);
        b.put(key);
    }

    /**
     * Decodes one request frame from the buffer's position. On success the position moves past the
     * frame; when the buffer holds only part of a frame it returns {@code null} and leaves the
     * position (read more bytes: not an error on a stream).
     *
     * @param in a buffer (its byte order is ignored: the protocol is big-endian)
     * @param maxKey the reader's limit on the key length (at most {@link Protocol#MAX_KEY_LEN})
     * @return the frame, or null when incomplete
     * @throws FrameException when the frame breaks the layout
     */
    public static RequestFrame decode(ByteBuffer in, int maxKey) throws FrameException {
        ByteBuffer b = in.slice().order(ByteOrder.BIG_ENDIAN);
        int len = Frames.checkLength(b, maxKey);
        if (len < 0) {
            return null;
        }
        int keyLen = Bytes.u16(b, 6);
        if (keyLen != len - 28) {
            throw new FrameException(FrameException.Kind.LENGTH, "key_len " + keyLen + " disagrees with length " + len);
        }
        byte[] key = new byte[keyLen];
        b.get(32, key);
        RequestFrame f = new RequestFrame(b.get(4) & 0xFF, b.get(5) & 0xFF, b.getLong(8), b.getLong(16),
                Bytes.u32(b, 24), Bytes.u32(b, 28), key);
        in.position(in.position() + 4 + len);
        return f;
    }
}
