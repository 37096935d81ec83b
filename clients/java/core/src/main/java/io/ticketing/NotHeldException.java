package io.ticketing;

/**
 * The server answered {@code NOT_HELD} to a release or extend by key and token: that token does not
 * hold the key (it expired, was released, or never did). Nothing changed. Operations on a
 * {@link Lock} handle raise {@link LockLostException} instead.
 */
public class NotHeldException extends TicketingException {
    private static final long serialVersionUID = 1L;

    /**
     * Creates the exception.
     *
     * @param message a one-line description with its context
     */
    public NotHeldException(String message) {
        super(message);
    }

    /**
     * Creates the exception with a cause.
     *
     * @param message a one-line description with its context
     * @param cause the underlying failure
     */
    public NotHeldException(String message, Throwable cause) {
        super(message, cause);
    }
}
