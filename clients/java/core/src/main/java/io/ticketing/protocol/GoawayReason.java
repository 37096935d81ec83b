package io.ticketing.protocol;

/** The reason a {@code GOAWAY} push gives in its detail. Values are those of {@code protocol/constants.json}. */
public enum GoawayReason {
    /** This node is no longer the leader. */
    LEADERSHIP(1),
    /** This cluster node is stopping for maintenance. */
    STOPPING(2);

    private final int code;

    GoawayReason(int code) {
        this.code = code;
    }

    /** {@return the value of the detail field} */
    public int code() {
        return code;
    }

    /**
     * Returns the reason with this code, or {@code null} when unknown.
     *
     * @param code the detail value
     * @return the reason, or null
     */
    public static GoawayReason fromCode(long code) {
        for (GoawayReason r : values()) {
            if (r.code == code) {
                return r;
            }
        }
        return null;
    }
}
