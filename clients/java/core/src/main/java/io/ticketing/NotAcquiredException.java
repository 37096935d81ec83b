package io.ticketing;

/**
 * The lock was not acquired: the wait timeout passed, or a try (wait 0) found the key taken
 * (status {@code TIMED_OUT}). Nothing is held. {@link TicketingClient#tryAcquire} returns an empty
 * {@code Optional} instead of raising it.
 */
public class NotAcquiredException extends TicketingException {
    private static final long serialVersionUID = 1L;

    /**
     * Creates the exception.
     *
     * @param message a one-line description with its context
     */
    public NotAcquiredException(String message) {
        super(message);
    }

    /**
     * Creates the exception with a cause.
     *
     * @param message a one-line description with its context
     * @param cause the underlying failure
     */
    public NotAcquiredException(String message, Throwable cause) {
        super(message, cause);
    }
}
