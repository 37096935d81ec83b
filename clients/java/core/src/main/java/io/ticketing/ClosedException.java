package io.ticketing;

/**
 * The client was closed before or while this call ran.
 */
public class ClosedException extends TicketingException {
    private static final long serialVersionUID = 1L;

    /**
     * Creates the exception.
     *
     * @param message a one-line description with its context
     */
    public ClosedException(String message) {
        super(message);
    }

    /**
     * Creates the exception with a cause.
     *
     * @param message a one-line description with its context
     * @param cause the underlying failure
     */
    public ClosedException(String message, Throwable cause) {
        super(message, cause);
    }
}
