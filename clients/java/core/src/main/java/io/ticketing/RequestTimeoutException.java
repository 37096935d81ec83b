package io.ticketing;

/**
 * A request was not answered within the request timeout (a frozen or half-open server). The time
 * an acquire spends queued behind other holders does not count: it is bounded by its wait timeout.
 */
public class RequestTimeoutException extends TicketingException {
    private static final long serialVersionUID = 1L;

    /**
     * Creates the exception.
     *
     * @param message a one-line description with its context
     */
    public RequestTimeoutException(String message) {
        super(message);
    }

    /**
     * Creates the exception with a cause.
     *
     * @param message a one-line description with its context
     * @param cause the underlying failure
     */
    public RequestTimeoutException(String message, Throwable cause) {
        super(message, cause);
    }
}
