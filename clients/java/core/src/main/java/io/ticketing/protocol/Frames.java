package io.ticketing.protocol;

import java.nio.ByteBuffer;

/** The framing rules shared by requests and responses. */
final class Frames {
    private Frames() {
    }

    /**
     * Checks the length field at offset 0 of {@code b}.
     *
     * @return the length, or -1 when {@code b} does not yet hold the whole frame
     */
    static int checkLength(ByteBuffer b, int maxVar) throws FrameException {
        if (b.remaining() < 4) {
            return -1;
        }
        long len = Bytes.u32(b, 0);
        if (len > 28L + maxVar) {
            throw new FrameException(FrameException.Kind.TOO_LARGE,
                    "frame length " + len + " above the limit " + (28L + maxVar));
        }
        if (len < 28) {
            throw new FrameException(FrameException.Kind.LENGTH, "frame length " + len + " below the header");
        }
        if (b.remaining() < 4 + len) {
            return -1;
        }
        return (int) len;
    }
}
