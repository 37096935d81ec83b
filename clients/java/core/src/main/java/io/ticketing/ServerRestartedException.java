package io.ticketing;

/**
 * The server's lock state changed (a restarted single node: a different state id) while this call
 * was in flight. Every lock the client held is lost; queued acquires are not re-queued.
 */
public class ServerRestartedException extends TicketingException {
    private static final long serialVersionUID = 1L;

    /**
     * Creates the exception.
     *
     * @param message a one-line description with its context
     */
    public ServerRestartedException(String message) {
        super(message);
    }

    /**
     * Creates the exception with a cause.
     *
     * @param message a one-line description with its context
     * @param cause the underlying failure
     */
    public ServerRestartedException(String message, Throwable cause) {
        super(message, cause);
    }
}
