package io.ticketing;

/**
 * The call was cancelled by its caller (an interrupted thread, a cancelled future or coroutine), or
 * the server answered {@code CANCELLED}. A cancelled acquire never leaves a lock held: the client
 * withdraws the wait and releases a grant that raced the cancellation.
 */
public class CancelledException extends TicketingException {
    private static final long serialVersionUID = 1L;

    /**
     * Creates the exception.
     *
     * @param message a one-line description with its context
     */
    public CancelledException(String message) {
        super(message);
    }

    /**
     * Creates the exception with a cause.
     *
     * @param message a one-line description with its context
     * @param cause the underlying failure
     */
    public CancelledException(String message, Throwable cause) {
        super(message, cause);
    }
}
