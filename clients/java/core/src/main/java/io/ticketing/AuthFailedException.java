package io.ticketing;

/**
 * Authentication failed: the server rejected the token, requires a token the client lacks, does not
 * require the token the client holds, or could not prove that it holds the token. Retrying with
 * the same token does not help.
 */
public class AuthFailedException extends TicketingException {
    private static final long serialVersionUID = 1L;

    /**
     * Creates the exception.
     *
     * @param message a one-line description with its context
     */
    public AuthFailedException(String message) {
        super(message);
    }

    /**
     * Creates the exception with a cause.
     *
     * @param message a one-line description with its context
     * @param cause the underlying failure
     */
    public AuthFailedException(String message, Throwable cause) {
        super(message, cause);
    }
}
