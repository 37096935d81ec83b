package io.ticketing;

/**
 * No endpoint could be connected to: connections were refused, unreachable or timed out, or no
 * leader could be found.
 */
public class UnavailableException extends TicketingException {
    private static final long serialVersionUID = 1L;

    /**
     * Creates the exception.
     *
     * @param message a one-line description with its context
     */
    public UnavailableException(String message) {
        super(message);
    }

    /**
     * Creates the exception with a cause.
     *
     * @param message a one-line description with its context
     * @param cause the underlying failure
     */
    public UnavailableException(String message, Throwable cause) {
        super(message, cause);
    }
}
