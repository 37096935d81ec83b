package io.ticketing.protocol;

/** Bits of the flags word in an {@code INSPECT} answer's data. Values are those of {@code protocol/constants.json}. */
public enum InspectFlag {
    /** Somebody holds the key. */
    HELD(0x1),
    /** The request's token is the holder's token. */
    TOKEN_MATCH(0x2),
    /** The asking session holds the key. */
    SESSION(0x4),
    /** The key waits for storage before its next grant. */
    STALLED(0x8),
    /**
     * The server is in its start-up wait: nothing is granted before it ends; set for every key, and
     * the lock-delay field is the time left.
     */
    STARTUP(0x10);

    private final int bit;

    InspectFlag(int bit) {
        this.bit = bit;
    }

    /** {@return this flag's bit} */
    public int bit() {
        return bit;
    }

    /**
     * Tells whether this flag is set in a flags word.
     *
     * @param flags the flags word
     * @return true when set
     */
    public boolean isSet(long flags) {
        return (flags & bit) != 0;
    }
}
