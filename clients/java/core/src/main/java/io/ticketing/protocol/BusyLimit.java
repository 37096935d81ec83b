package io.ticketing.protocol;

/** The limit a {@code BUSY} answer names in its detail. Values are those of {@code protocol/constants.json}. */
public enum BusyLimit {
    /** Too many connections (CHALLENGE status BUSY, then close). */
    CONNECTIONS(1),
    /** The key's queue is full. */
    WAITERS_PER_KEY(2),
    /** The server's total number of queued acquires is reached. */
    WAITERS_TOTAL(3),
    /** The server's number of distinct keys is reached. */
    LOCKS(4),
    /** The session has too many queued acquires or stored outcomes. */
    INFLIGHT(5),
    /** Tokens or the restart horizon cannot be made durable now. */
    STORAGE(6),
    /** Too many sessions (WELCOME status BUSY, then close). */
    SESSIONS(7);

    private final int code;

    BusyLimit(int code) {
        this.code = code;
    }

    /** {@return the value of the detail field} */
    public int code() {
        return code;
    }

    /**
     * Returns the limit with this code, or {@code null} when unknown.
     *
     * @param code the detail value
     * @return the limit, or null
     */
    public static BusyLimit fromCode(long code) {
        for (BusyLimit l : values()) {
            if (l.code == code) {
                return l;
            }
        }
        return null;
    }
}
