package io.ticketing.protocol;

/**
 * Sizes, limits and client rules of protocol version 1 ({@code PROTOCOL.md}); each value is checked
 * against {@code protocol/constants.json} by this library's tests.
 */
public final class Protocol {
    private Protocol() {
    }

    /** The protocol version sent in HELLO. */
    public static final int VERSION = 1;
    /** Size of the header of every frame after the handshake, length field included. */
    public static final int HEADER = 32;
    /** Size of a HELLO frame. */
    public static final int HELLO = 56;
    /** Size of a CHALLENGE frame without its data. */
    public static final int CHALLENGE = 48;
    /** Size of an AUTH frame. */
    public static final int AUTH = 40;
    /** Size of a WELCOME frame. */
    public static final int WELCOME = 64;
    /** Size of a session id. */
    public static final int SESSION_ID = 16;
    /** Size of a state id. */
    public static final int STATE_ID = 16;
    /** Size of a nonce. */
    public static final int NONCE = 32;
    /** Size of an authentication proof (HMAC-SHA256). */
    public static final int PROOF = 32;
    /** Size of the data of an INSPECT answer. */
    public static final int INSPECT_DATA = 12;
    /** Largest data of a CHALLENGE. */
    public static final int MAX_CHALLENGE_DATA = 1024;
    /** Largest key the format can carry (servers limit keys further, 256 bytes by default). */
    public static final int MAX_KEY_LEN = 65535;
    /** Largest data of a response. */
    public static final int MAX_DATA_LEN = 65535;
    /** {@code wait_ms} meaning "wait without limit". */
    public static final long WAIT_FOREVER = 0xFFFF_FFFFL;
    /** CHALLENGE flag bit: the server holds a token. */
    public static final int CHALLENGE_AUTH_REQUIRED = 1;
    /** WELCOME flag bit: the session named in HELLO was live and is resumed. */
    public static final int WELCOME_RESUMED = 1;
    /** A client sends ACK at least once per this many answers. */
    public static final int ACK_EVERY = 1024;
    /** Bound on the rate error of each clock, in parts per million (ρ = 0.001). */
    public static final int CLOCK_RATE_BOUND_PPM = 1000;
    /** Largest margin the lost signal fires before the local deadline, in milliseconds. */
    public static final int LOST_MARGIN_MS = 5;
    /**
     * Longest time between two checks of a held lock's deadline against the suspend-counting clock,
     * in milliseconds: the runtime's timers stop while the host is suspended.
     */
    public static final int LOST_CHECK_MS = 250;
}
