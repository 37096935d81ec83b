package io.ticketing.protocol;

/** A frame that breaks the layout of {@code PROTOCOL.md}; the connection that carried it cannot be trusted. */
public final class FrameException extends Exception {
    private static final long serialVersionUID = 1L;

    /** What is wrong with the frame. */
    public enum Kind {
        /** The length field, {@code key_len} or {@code data_len} disagrees with the layout. */
        LENGTH,
        /** The length field is above the reader's limit (detected from the first four bytes alone). */
        TOO_LARGE
    }

    /** What is wrong with the frame. */
    private final Kind kind;

    /**
     * Creates the exception.
     *
     * @param kind what is wrong
     * @param message a description for humans
     */
    public FrameException(Kind kind, String message) {
        super(message);
        this.kind = kind;
    }

    /** {@return what is wrong with the frame} */
    public Kind kind() {
        return kind;
    }
}
