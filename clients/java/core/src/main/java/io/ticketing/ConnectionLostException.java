package io.ticketing;

/**
 * The connection dropped and the session could not be resumed, so the answer to this call is
 * unknown. An acquire that fails this way is withdrawn on the next connection, and any grant for it
 * is released.
 */
public class ConnectionLostException extends TicketingException {
    private static final long serialVersionUID = 1L;

    /**
     * Creates the exception.
     *
     * @param message a one-line description with its context
     */
    public ConnectionLostException(String message) {
        super(message);
    }

    /**
     * Creates the exception with a cause.
     *
     * @param message a one-line description with its context
     * @param cause the underlying failure
     */
    public ConnectionLostException(String message, Throwable cause) {
        super(message, cause);
    }
}
