package io.ticketing.protocol;

/** Operation codes (offset 4 of every frame). The values are those of {@code protocol/constants.json}. */
public enum Op {
    /** Client to server, first frame: version, session id, client nonce. */
    HELLO(0x01),
    /** Server to client: status, server version, flags, detail, server nonce, data. */
    CHALLENGE(0x02),
    /** Client to server: the client proof. */
    AUTH(0x03),
    /** Server to client: status, resumed flag, session grace, state id, server proof. */
    WELCOME(0x04),
    /** Take a key for {@code lease_ms}, waiting up to {@code wait_ms} in the key's FIFO queue. */
    ACQUIRE(0x10),
    /** Release a key held with a token. */
    RELEASE(0x11),
    /** Set the lease of a key held with a token to {@code lease_ms} from now. */
    EXTEND(0x12),
    /** Withdraw this session's ACQUIRE whose request id is in the token field. */
    CANCEL(0x13),
    /** Liveness; answered OK. */
    PING(0x14),
    /** Report a key's state; the holder's token only to its holder. */
    INSPECT(0x15),
    /** The lowest request id still awaited: the server may drop stored outcomes below it. */
    ACK(0x16),
    /** Server push: the lock on a key (data) with a token is lost; detail is the reason. */
    EXPIRED(0x20),
    /** Server push: this node is going away; data is the leader's address. */
    GOAWAY(0x21);

    private final int code;

    Op(int code) {
        this.code = code;
    }

    /** {@return the byte sent on the wire} */
    public int code() {
        return code;
    }

    /**
     * Returns the op with this code, or {@code null} for a code this version does not know.
     *
     * @param code the byte read from the wire (0..255)
     * @return the op, or null
     */
    public static Op fromCode(int code) {
        for (Op op : values()) {
            if (op.code == code) {
                return op;
            }
        }
        return null;
    }
}
