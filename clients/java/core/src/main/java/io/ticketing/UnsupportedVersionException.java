package io.ticketing;

/**
 * The server does not speak this client's protocol version ({@code UNSUPPORTED_VERSION}).
 */
public class UnsupportedVersionException extends TicketingException {
    private static final long serialVersionUID = 1L;

    /**
     * Creates the exception.
     *
     * @param message a one-line description with its context
     */
    public UnsupportedVersionException(String message) {
        super(message);
    }

    /**
     * Creates the exception with a cause.
     *
     * @param message a one-line description with its context
     * @param cause the underlying failure
     */
    public UnsupportedVersionException(String message, Throwable cause) {
        super(message, cause);
    }
}
