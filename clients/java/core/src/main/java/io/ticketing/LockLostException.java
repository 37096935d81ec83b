package io.ticketing;

/**
 * An operation on a {@link Lock} that is lost, or a scoped use of a lock (try-with-resources,
 * Kotlin's {@code withLock}) during which the lock was lost. {@link #reason()} says why.
 */
public class LockLostException extends TicketingException {
    private static final long serialVersionUID = 1L;

    /** Why the lock was lost. */
    private final LostReason reason;

    /**
     * Creates the exception.
     *
     * @param message a one-line description with its context
     * @param reason why the lock was lost
     */
    public LockLostException(String message, LostReason reason) {
        super(message);
        this.reason = reason;
    }

    /** {@return why the lock was lost} */
    public LostReason reason() {
        return reason;
    }
}
