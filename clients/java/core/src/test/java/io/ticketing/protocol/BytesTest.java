package io.ticketing.protocol;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.nio.charset.StandardCharsets;
import org.junit.jupiter.api.Test;

/** How keys and server texts appear in messages (docs/clients.md, rule 6). */
class BytesTest {
    @Test
    void shortKeysAreShownWhole() {
        assertEquals("order-1", Bytes.forMessage("order-1".getBytes(StandardCharsets.UTF_8)));
        assertEquals("k".repeat(64), Bytes.forMessage("k".repeat(64).getBytes(StandardCharsets.UTF_8)));
        assertEquals("0x00ff", Bytes.forMessage(new byte[] {0, (byte) 0xff}));
    }

    @Test
    void longKeysAreCutTo64BytesWithTheirLength() {
        String s = Bytes.forMessage("k".repeat(5000).getBytes(StandardCharsets.UTF_8));
        assertEquals("k".repeat(64) + "\u2026(5000 bytes)", s);
    }

    @Test
    void aCutNeverSplitsACharacter() {
        // 63 ASCII bytes, then 'é' (2 bytes) straddling the 64-byte mark.
        byte[] key = ("a".repeat(63) + "\u00e9" + "b".repeat(100)).getBytes(StandardCharsets.UTF_8);
        String s = Bytes.forMessage(key);
        assertEquals("a".repeat(63) + "\u2026(" + key.length + " bytes)", s);
        assertFalse(s.contains("\ufffd"), s);
    }

    @Test
    void longBinaryKeysAreCutInHex() {
        byte[] key = new byte[300];
        key[0] = (byte) 0xff; // not UTF-8
        String s = Bytes.forMessage(key);
        assertTrue(s.startsWith("0xff00"), s);
        assertEquals(2 + 128 + "\u2026(300 bytes)".length(), s.length(), s);
    }

    @Test
    void oneLine() {
        assertEquals("a; b; c", Bytes.oneLine("a\nb\r\n\nc"));
        assertEquals("plain", Bytes.oneLine("plain"));
    }
}
