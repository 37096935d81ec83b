package io.ticketing;

/** Why a held lock was lost; the same names in every Ticketing client. */
public enum LostReason {
    /** The lease ran out: the local deadline passed, or the server sent {@code EXPIRED} (reason LEASE). */
    EXPIRED("expired"),
    /** The server answered {@code NOT_HELD} to an extend or release of the lock. */
    NOT_HELD("not held"),
    /** The client reconnected to a server with a different state id: its locks are gone. */
    SERVER_RESTARTED("server restarted"),
    /** The server is stopping and told the holder ({@code EXPIRED} reason STOPPING). */
    SERVER_STOPPING("server stopping");

    private final String text;

    LostReason(String text) {
        this.text = text;
    }

    /** Returns the reason as the clients' shared text ("expired", "not held", ...). */
    @Override
    public String toString() {
        return text;
    }
}
