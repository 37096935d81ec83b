package io.ticketing;

/**
 * The base class of every error this client raises. Each subclass stands for one server status or
 * one client-side condition, so callers catch exactly what they can act on; messages are one line
 * and carry their context (key, token, timeout, endpoint).
 */
public class TicketingException extends RuntimeException {
    private static final long serialVersionUID = 1L;

    /**
     * Creates the exception.
     *
     * @param message a one-line description with its context
     */
    public TicketingException(String message) {
        super(message);
    }

    /**
     * Creates the exception with a cause.
     *
     * @param message a one-line description with its context
     * @param cause the underlying failure
     */
    public TicketingException(String message, Throwable cause) {
        super(message, cause);
    }
}
