package io.ticketing;

/**
 * The TLS handshake failed, or the TLS settings could not be loaded. Speaking TLS to a plaintext
 * server (or plaintext to a TLS server) ends here, and the message says so.
 */
public class TlsException extends TicketingException {
    private static final long serialVersionUID = 1L;

    /**
     * Creates the exception.
     *
     * @param message a one-line description with its context
     */
    public TlsException(String message) {
        super(message);
    }

    /**
     * Creates the exception with a cause.
     *
     * @param message a one-line description with its context
     * @param cause the underlying failure
     */
    public TlsException(String message, Throwable cause) {
        super(message, cause);
    }
}
