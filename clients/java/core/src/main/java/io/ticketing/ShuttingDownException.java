package io.ticketing;

/**
 * The server is stopping ({@code SHUTTING_DOWN}); queued acquires are answered with it.
 */
public class ShuttingDownException extends TicketingException {
    private static final long serialVersionUID = 1L;

    /**
     * Creates the exception.
     *
     * @param message a one-line description with its context
     */
    public ShuttingDownException(String message) {
        super(message);
    }

    /**
     * Creates the exception with a cause.
     *
     * @param message a one-line description with its context
     * @param cause the underlying failure
     */
    public ShuttingDownException(String message, Throwable cause) {
        super(message, cause);
    }
}
