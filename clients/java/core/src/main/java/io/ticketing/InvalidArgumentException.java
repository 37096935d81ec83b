package io.ticketing;

import io.ticketing.protocol.InvalidField;
import java.util.Optional;

/**
 * An argument was rejected: by the client before anything was sent (an empty key, a lease below
 * 1 ms, a negative wait...), or by the server ({@code INVALID}, with the field it names).
 */
public class InvalidArgumentException extends TicketingException {
    private static final long serialVersionUID = 1L;

    /** The field the server named, or null when the client refused the argument itself. */
    private final InvalidField field;

    /**
     * Creates the exception for a check made by the client.
     *
     * @param message a one-line description naming the argument
     */
    public InvalidArgumentException(String message) {
        this(message, null);
    }

    /**
     * Creates the exception for an {@code INVALID} answer.
     *
     * @param message a one-line description
     * @param field the field the server named, or null
     */
    public InvalidArgumentException(String message, InvalidField field) {
        super(message);
        this.field = field;
    }

    /** {@return the field the server named, when the server rejected the request} */
    public Optional<InvalidField> field() {
        return Optional.ofNullable(field);
    }
}
