package io.ticketing.protocol;

/** The reason an {@code EXPIRED} push gives in its detail. Values are those of {@code protocol/constants.json}. */
public enum ExpiredReason {
    /** The lease ran out and the server reclaimed the lock. */
    LEASE(1),
    /** The server is stopping; the lock will not survive the stop. */
    STOPPING(2);

    private final int code;

    ExpiredReason(int code) {
        this.code = code;
    }

    /** {@return the value of the detail field} */
    public int code() {
        return code;
    }

    /**
     * Returns the reason with this code, or {@code null} when unknown (a client then treats the
     * lock as expired).
     *
     * @param code the detail value
     * @return the reason, or null
     */
    public static ExpiredReason fromCode(long code) {
        for (ExpiredReason r : values()) {
            if (r.code == code) {
                return r;
            }
        }
        return null;
    }
}
