package io.ticketing.protocol;

import java.nio.ByteBuffer;
import java.nio.charset.CharacterCodingException;
import java.nio.charset.CodingErrorAction;
import java.nio.charset.StandardCharsets;
import java.util.HexFormat;

/** Small helpers for the byte strings of the protocol. */
public final class Bytes {
    private Bytes() {
    }

    /**
     * Renders a key for messages: as text when it is valid UTF-8 without control characters, else
     * as hex prefixed with {@code 0x}.
     *
     * @param key the key bytes
     * @return a printable form
     */
    public static String printable(byte[] key) {
        try {
            String s = StandardCharsets.UTF_8.newDecoder()
                    .onMalformedInput(CodingErrorAction.REPORT)
                    .onUnmappableCharacter(CodingErrorAction.REPORT)
                    .decode(ByteBuffer.wrap(key))
                    .toString();
            for (int i = 0; i < s.length(); i++) {
                if (Character.isISOControl(s.charAt(i))) {
                    return "0x" + HexFormat.of().formatHex(key);
                }
            }
            return s;
        } catch (CharacterCodingException e) {
            return "0x" + HexFormat.of().formatHex(key);
        }
    }

    /** How many bytes of a key a message shows at most (as the Go client does). */
    public static final int MAX_KEY_IN_MESSAGE = 64;

    /**
     * Renders a key for error messages: {@link #printable(byte[])}, but a key longer than
     * {@value #MAX_KEY_IN_MESSAGE} bytes is cut to that many (never inside a UTF-8 character) and
     * followed by its length, as in {@code kkkk…(300 bytes)}: a message never echoes a long key.
     *
     * @param key the key bytes
     * @return a printable form of at most about {@value #MAX_KEY_IN_MESSAGE} bytes of the key
     */
    public static String forMessage(byte[] key) {
        if (key.length <= MAX_KEY_IN_MESSAGE) {
            return printable(key);
        }
        int cut = MAX_KEY_IN_MESSAGE;
        if (validUtf8(key)) {
            while (cut > MAX_KEY_IN_MESSAGE - 3 && (key[cut] & 0xC0) == 0x80) {
                cut--; // do not split a character
            }
        }
        byte[] prefix = java.util.Arrays.copyOf(key, cut);
        String shown = validUtf8(key) ? printable(prefix) : "0x" + HexFormat.of().formatHex(prefix);
        return shown + "\u2026(" + key.length + " bytes)";
    }

    private static boolean validUtf8(byte[] b) {
        try {
            StandardCharsets.UTF_8.newDecoder()
                    .onMalformedInput(CodingErrorAction.REPORT)
                    .onUnmappableCharacter(CodingErrorAction.REPORT)
                    .decode(ByteBuffer.wrap(b));
            return true;
        } catch (CharacterCodingException e) {
            return false;
        }
    }

    /**
     * Puts a message on one line: line breaks become "; " (a server's or peer's text inside a
     * client's message).
     *
     * @param s the text
     * @return the text on one line
     */
    public static String oneLine(String s) {
        if (s.indexOf('\n') < 0 && s.indexOf('\r') < 0) {
            return s;
        }
        StringBuilder b = new StringBuilder();
        for (String part : s.split("[\r\n]+")) {
            if (part.isEmpty()) {
                continue;
            }
            if (b.length() > 0) {
                b.append("; ");
            }
            b.append(part);
        }
        return b.toString();
    }

    /**
     * Decodes UTF-8 leniently (malformed bytes become U+FFFD); for messages and addresses.
     *
     * @param b the bytes
     * @return the text
     */
    public static String utf8(byte[] b) {
        return new String(b, StandardCharsets.UTF_8);
    }

    static int u16(ByteBuffer b, int off) {
        return b.getShort(off) & 0xFFFF;
    }

    static long u32(ByteBuffer b, int off) {
        return b.getInt(off) & 0xFFFF_FFFFL;
    }

    static void checkU32(String field, long v) {
        if (v < 0 || v > 0xFFFF_FFFFL) {
            throw new IllegalArgumentException(field + " must fit in 32 unsigned bits: " + v);
        }
    }

    static void checkLen(String field, byte[] b, int n) {
        if (b == null || b.length != n) {
            throw new IllegalArgumentException(field + " must be " + n + " bytes");
        }
    }
}
