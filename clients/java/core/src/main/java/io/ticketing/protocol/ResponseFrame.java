package io.ticketing.protocol;

import java.nio.ByteBuffer;
import java.nio.ByteOrder;

/**
 * A response or push frame (server to client): a 32-byte header and the data.
 *
 * @param op the request's op; {@link Op#EXPIRED} or {@link Op#GOAWAY} for pushes; 0 for
 *     {@code INVALID}/{@code LENGTH}
 * @param status the status code ({@link Status#code()}; unknown codes are kept as read)
 * @param requestId the request's id; 0 for pushes (an unsigned 64-bit value)
 * @param token ACQUIRE/EXTEND OK: the token; EXPIRED: the lost lock's token; INSPECT: the
 *     holder's token when shown
 * @param leaseMs ACQUIRE/EXTEND OK: the lease now running; INSPECT: ms left (unsigned 32-bit)
 * @param detail ACQUIRE OK: ms queued; INSPECT: acquires queued; CANCEL: 1 if withdrawn; ACK:
 *     outcomes stored; INVALID: field code; BUSY: limit code; EXPIRED, GOAWAY: reason
 * @param data EXPIRED: the key; GOAWAY, NOT_LEADER: the leader's address; INSPECT: 12 bytes;
 *     errors: a message
 */
public record ResponseFrame(int op, int status, long requestId, long token, long leaseMs, long detail, byte[] data) {

    /**
     * Creates the frame, checking that every field fits its width.
     *
     * @param op the request's op; {@link Op#EXPIRED} or {@link Op#GOAWAY} for pushes; 0 for
     *     {@code INVALID}/{@code LENGTH}
     * @param status the status code ({@link Status#code()}; unknown codes are kept as read)
     * @param requestId the request's id; 0 for pushes (an unsigned 64-bit value)
     * @param token ACQUIRE/EXTEND OK: the token; EXPIRED: the lost lock's token; INSPECT: the
     *     holder's token when shown
     * @param leaseMs ACQUIRE/EXTEND OK: the lease now running; INSPECT: ms left (unsigned 32-bit)
     * @param detail ACQUIRE OK: ms queued; INSPECT: acquires queued; CANCEL: 1 if withdrawn; ACK:
     *     outcomes stored; INVALID: field code; BUSY: limit code; EXPIRED, GOAWAY: reason
     * @param data EXPIRED: the key; GOAWAY, NOT_LEADER: the leader's address; INSPECT: 12 bytes;
     *     errors: a message
     */
    public ResponseFrame {
        if (op < 0 || op > 0xFF || status < 0 || status > 0xFF) {
            throw new IllegalArgumentException("op and status are single bytes");
        }
        Bytes.checkU32("lease_ms", leaseMs);
        Bytes.checkU32("detail", detail);
        if (data == null) {
            data = new byte[0];
        }
        if (data.length > Protocol.MAX_DATA_LEN) {
            throw new IllegalArgumentException("data longer than " + Protocol.MAX_DATA_LEN + " bytes");
        }
    }

    /** {@return the size of the encoded frame} */
    public int size() {
        return Protocol.HEADER + data.length;
    }

    /** {@return the encoded frame} */
    public byte[] encode() {
        ByteBuffer b = ByteBuffer.allocate(size());
        b.putInt(28 + data.length);
        b.put((byte) op);
        b.put((byte) status);
        b.putShort((short) data.length);
        b.putLong(requestId);
        b.putLong(token);
        b.putInt((int) leaseMs);
        b.putInt((int) detail);
        b.put(data);
        return b.array();
    }

    /**
     * Decodes one response frame from the buffer's position; see
     * {@link RequestFrame#decode(ByteBuffer, int)} for the contract.
     *
     * @param in a buffer
     * @param maxData the reader's limit on the data length (at most {@link Protocol#MAX_DATA_LEN})
     * @return the frame, or null when incomplete
     * @throws FrameException when the frame breaks the layout
     */
    public static ResponseFrame decode(ByteBuffer in, int maxData) throws FrameException {
        ByteBuffer b = in.slice().order(ByteOrder.BIG_ENDIAN);
        int len = Frames.checkLength(b, maxData);
        if (len < 0) {
            return null;
        }
        int dataLen = Bytes.u16(b, 6);
        if (dataLen != len - 28) {
            throw new FrameException(FrameException.Kind.LENGTH, "data_len " + dataLen + " disagrees with length " + len);
        }
        byte[] data = new byte[dataLen];
        b.get(32, data);
        ResponseFrame f = new ResponseFrame(b.get(4) & 0xFF, b.get(5) & 0xFF, b.getLong(8), b.getLong(16),
                Bytes.u32(b, 24), Bytes.u32(b, 28), data);
        in.position(in.position() + 4 + len);
        return f;
    }

    /** {@return the status, or {@code null} when this version does not know its code} */
    public Status knownStatus() {
        return Status.fromCode(status);
    }
}
