package io.ticketing;

/**
 * An acquire with {@link AcquireOptions.Builder#refuseHeld(boolean) refuseHeld} found that this
 * client already holds the key; nothing was sent.
 */
public class AlreadyHeldException extends TicketingException {
    private static final long serialVersionUID = 1L;

    /**
     * Creates the exception.
     *
     * @param message a one-line description with its context
     */
    public AlreadyHeldException(String message) {
        super(message);
    }

    /**
     * Creates the exception with a cause.
     *
     * @param message a one-line description with its context
     * @param cause the underlying failure
     */
    public AlreadyHeldException(String message, Throwable cause) {
        super(message, cause);
    }
}
