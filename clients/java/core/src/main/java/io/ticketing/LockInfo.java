package io.ticketing;

import io.ticketing.protocol.InspectFlag;
import java.time.Duration;

/**
 * What the server says about a key ({@link TicketingClient#inspect(String)}): who holds it, for how
 * long, and how many wait. It changes nothing on the server.
 *
 * @param held somebody holds the key
 * @param token the holder's token, shown only to the holding session or to a request that carried
 *     that token; 0 otherwise
 * @param leaseLeft time left on the holder's lease
 * @param waiters acquires queued on the key
 * @param heldFor time since the lock was granted
 * @param lockDelayLeft time left of the lock-delay after an expiry (the key is unavailable until then),
 *     or of the server's start-up wait when {@link #startup()} is set
 * @param flags the raw flags word ({@link InspectFlag})
 */
public record LockInfo(boolean held, long token, Duration leaseLeft, long waiters, Duration heldFor,
        Duration lockDelayLeft, long flags) {

    /** {@return whether the token asked about is the holder's} */
    public boolean tokenMatches() {
        return InspectFlag.TOKEN_MATCH.isSet(flags);
    }

    /** {@return whether this client's session holds the key} */
    public boolean heldByThisSession() {
        return InspectFlag.SESSION.isSet(flags);
    }

    /** {@return whether the key waits for the server's storage before its next grant} */
    public boolean stalled() {
        return InspectFlag.STALLED.isSet(flags);
    }

    /**
     * {@return whether the server is in its start-up wait: nothing is granted before it ends, and
     * {@link #lockDelayLeft()} is the time left of it}
     */
    public boolean startup() {
        return InspectFlag.STARTUP.isSet(flags);
    }
}
