package io.ticketing;

import io.ticketing.protocol.BusyLimit;
import java.util.Optional;

/** A server limit was reached ({@code BUSY}); retry later with backoff. {@link #limit()} says which. */
public class BusyException extends TicketingException {
    private static final long serialVersionUID = 1L;

    /** The limit that was reached, or null when its code is unknown. */
    private final BusyLimit limit;

    /**
     * Creates the exception.
     *
     * @param message a one-line description
     * @param limit the limit the server named, or null when this version does not know its code
     */
    public BusyException(String message, BusyLimit limit) {
        super(message);
        this.limit = limit;
    }

    /** {@return the limit that was reached, when its code is known} */
    public Optional<BusyLimit> limit() {
        return Optional.ofNullable(limit);
    }
}
