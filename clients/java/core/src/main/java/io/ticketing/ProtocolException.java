package io.ticketing;

/**
 * The server broke the protocol, or answered with a status this client does not know; the message
 * carries the status number.
 */
public class ProtocolException extends TicketingException {
    private static final long serialVersionUID = 1L;

    /**
     * Creates the exception.
     *
     * @param message a one-line description with its context
     */
    public ProtocolException(String message) {
        super(message);
    }

    /**
     * Creates the exception with a cause.
     *
     * @param message a one-line description with its context
     * @param cause the underlying failure
     */
    public ProtocolException(String message, Throwable cause) {
        super(message, cause);
    }
}
