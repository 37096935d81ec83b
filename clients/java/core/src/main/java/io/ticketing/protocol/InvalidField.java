package io.ticketing.protocol;

/** The field an {@code INVALID} answer names in its detail. Values are those of {@code protocol/constants.json}. */
public enum InvalidField {
    /** Frame length inconsistent with its layout or above the ceiling; the connection closes. */
    LENGTH(1),
    /** Unknown operation. */
    OP(2),
    /** Reserved flags are not zero. */
    FLAGS(3),
    /** Key empty or longer than the server's maximum key length. */
    KEY(4),
    /** {@code lease_ms} outside the server's range. */
    LEASE(5),
    /** Reserved; never sent in version 1. */
    WAIT(6),
    /** Token is zero. */
    TOKEN(7),
    /** Request id zero, already used on this connection, or a retry that differs from its original. */
    REQUEST_ID(8),
    /** Reserved; a handshake frame with a bad layout closes the connection without an answer. */
    HANDSHAKE(9),
    /** HELLO's session id is all zero. */
    SESSION(10);

    private final int code;

    InvalidField(int code) {
        this.code = code;
    }

    /** {@return the value of the detail field} */
    public int code() {
        return code;
    }

    /**
     * Returns the field with this code, or {@code null} when unknown.
     *
     * @param code the detail value
     * @return the field, or null
     */
    public static InvalidField fromCode(long code) {
        for (InvalidField f : values()) {
            if (f.code == code) {
                return f;
            }
        }
        return null;
    }
}
