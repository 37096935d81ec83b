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
