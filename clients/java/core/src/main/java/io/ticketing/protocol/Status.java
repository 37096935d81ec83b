package io.ticketing.protocol;

/** Response status codes (offset 5 of a response). The values are those of {@code protocol/constants.json}. */
public enum Status {
    /** Done. */
    OK(0),
    /** The wait timeout passed (or a wait of 0 found the key taken); nothing is held. */
    TIMED_OUT(1),
    /** The token is not the key's current holder (or a retried ACQUIRE holds nothing); nothing changed. */
    NOT_HELD(2),
    /** Bad request; detail is the field code; do not retry unchanged. */
    INVALID(3),
    /** This node is not the leader; data is the leader's address (may be empty). */
    NOT_LEADER(4),
    /** A server limit was reached; detail is the limit code. */
    BUSY(5),
    /** The server is stopping. */
    SHUTTING_DOWN(6),
    /** The handshake proof did not verify; the connection closes. */
    AUTH_FAILED(7),
    /** The server does not speak the client's version; the connection closes. */
    UNSUPPORTED_VERSION(8),
    /** The ACQUIRE was withdrawn by CANCEL; nothing is held. */
    CANCELLED(9);

    private final int code;

    Status(int code) {
        this.code = code;
    }

    /** {@return the byte sent on the wire} */
    public int code() {
        return code;
    }

    /**
     * Returns the status with this code, or {@code null} for a code this version does not know
     * (a client treats it as an error carrying its number).
     *
     * @param code the byte read from the wire
     * @return the status, or null
     */
    public static Status fromCode(int code) {
        for (Status s : values()) {
            if (s.code == code) {
                return s;
            }
        }
        return null;
    }
}
