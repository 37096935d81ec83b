package io.ticketing.protocol;

import static org.junit.jupiter.api.Assertions.assertArrayEquals;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertNull;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;
import static org.junit.jupiter.api.Assertions.fail;

import com.google.gson.JsonElement;
import com.google.gson.JsonObject;
import java.nio.ByteBuffer;
import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.HexFormat;
import java.util.List;
import java.util.stream.Stream;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.params.ParameterizedTest;
import org.junit.jupiter.params.provider.Arguments;
import org.junit.jupiter.params.provider.MethodSource;

/** Every vector of protocol/vectors.json, encoded and decoded byte for byte. */
class VectorsTest {
    private static final JsonObject VECTORS = ProtocolFiles.read("vectors.json");
    private static final HexFormat HEX = HexFormat.of();

    private static Stream<Arguments> list(String name) {
        List<Arguments> out = new ArrayList<>();
        for (JsonElement e : VECTORS.getAsJsonArray(name)) {
            JsonObject o = e.getAsJsonObject();
            out.add(Arguments.of(o.get("name").getAsString(), o));
        }
        if (out.isEmpty()) {
            throw new IllegalStateException("no vectors in " + name);
        }
        return out.stream();
    }

    static Stream<Arguments> requests() {
        return list("requests");
    }

    static Stream<Arguments> responses() {
        return list("responses");
    }

    static Stream<Arguments> handshake() {
        return list("handshake");
    }

    static Stream<Arguments> auth() {
        return list("auth");
    }

    static Stream<Arguments> malformed() {
        return list("malformed");
    }

    /** An op name of constants.json, or a raw byte written "0x7f" for codes no table has. */
    private static int op(String name) {
        if (name.startsWith("0x")) {
            return Integer.parseInt(name.substring(2), 16);
        }
        return Op.valueOf(name).code();
    }

    private static long u64(JsonObject f, String name) {
        return Long.parseUnsignedLong(f.get(name).getAsString());
    }

    private static byte[] hex(JsonObject o, String name) {
        return HEX.parseHex(o.get(name).getAsString());
    }

    @ParameterizedTest(name = "{0}")
    @MethodSource("requests")
    void request(String name, JsonObject v) throws FrameException {
        JsonObject f = v.getAsJsonObject("fields");
        byte[] wire = hex(v, "hex");
        RequestFrame expected = new RequestFrame(op(f.get("op").getAsString()), f.get("flags").getAsInt(),
                u64(f, "id"), u64(f, "token"), f.get("lease_ms").getAsLong(), f.get("wait_ms").getAsLong(),
                hex(f, "key_hex"));
        assertEquals(HEX.formatHex(wire), HEX.formatHex(expected.encode()), "encode");

        ByteBuffer in = ByteBuffer.wrap(wire);
        RequestFrame got = RequestFrame.decode(in, Protocol.MAX_KEY_LEN);
        assertFalse(in.hasRemaining(), "decode consumes the whole frame");
        assertEquals(expected.op(), got.op());
        assertEquals(expected.flags(), got.flags());
        assertEquals(expected.requestId(), got.requestId());
        assertEquals(expected.token(), got.token());
        assertEquals(expected.leaseMs(), got.leaseMs());
        assertEquals(expected.waitMs(), got.waitMs());
        assertArrayEquals(expected.key(), got.key());
        assertSplitDecodes(wire, b -> RequestFrame.decode(b, Protocol.MAX_KEY_LEN) != null);
    }

    @ParameterizedTest(name = "{0}")
    @MethodSource("responses")
    void response(String name, JsonObject v) throws FrameException {
        JsonObject f = v.getAsJsonObject("fields");
        byte[] wire = hex(v, "hex");
        ResponseFrame expected = new ResponseFrame(op(f.get("op").getAsString()),
                Status.valueOf(f.get("status").getAsString()).code(), u64(f, "id"), u64(f, "token"),
                f.get("lease_ms").getAsLong(), f.get("detail").getAsLong(), hex(f, "data_hex"));
        assertEquals(HEX.formatHex(wire), HEX.formatHex(expected.encode()), "encode");

        ByteBuffer in = ByteBuffer.wrap(wire);
        ResponseFrame got = ResponseFrame.decode(in, Protocol.MAX_DATA_LEN);
        assertFalse(in.hasRemaining(), "decode consumes the whole frame");
        assertEquals(expected.op(), got.op());
        assertEquals(expected.status(), got.status());
        assertEquals(expected.requestId(), got.requestId());
        assertEquals(expected.token(), got.token());
        assertEquals(expected.leaseMs(), got.leaseMs());
        assertEquals(expected.detail(), got.detail());
        assertArrayEquals(expected.data(), got.data());
        assertSplitDecodes(wire, b -> ResponseFrame.decode(b, Protocol.MAX_DATA_LEN) != null);
    }

    @ParameterizedTest(name = "{0}")
    @MethodSource("handshake")
    void handshakeFrame(String name, JsonObject v) throws FrameException {
        byte[] wire = hex(v, "hex");
        String status = v.get("status").getAsString();
        int statusCode = status.isEmpty() ? 0 : Status.valueOf(status).code();
        int version = v.get("version").getAsInt();
        int flags = v.get("flags").getAsInt();
        long detail = v.get("detail").getAsLong();
        switch (Op.valueOf(v.get("op").getAsString())) {
            case HELLO -> {
                Handshake.Hello h = new Handshake.Hello(version, flags, hex(v, "session_id_hex"), hex(v, "nonce_hex"));
                assertArrayEquals(wire, h.encode());
                Handshake.Hello d = Handshake.Hello.decode(wire);
                assertEquals(version, d.version());
                assertEquals(flags, d.flags());
                assertArrayEquals(h.sessionId(), d.sessionId());
                assertArrayEquals(h.clientNonce(), d.clientNonce());
            }
            case CHALLENGE -> {
                byte[] nonce = orZero(hex(v, "nonce_hex"), Protocol.NONCE);
                Handshake.Challenge c = new Handshake.Challenge(statusCode, version, flags, detail, nonce,
                        hex(v, "data_hex"));
                assertArrayEquals(wire, c.encode());
                Handshake.Challenge.checkLength(wire.length - 4);
                Handshake.Challenge d = Handshake.Challenge.decode(wire);
                assertEquals(statusCode, d.status());
                assertEquals(version, d.version());
                assertEquals(flags, d.flags());
                assertEquals(detail, d.detail());
                assertEquals((flags & 1) != 0, d.authRequired());
                assertArrayEquals(nonce, d.serverNonce());
                assertArrayEquals(c.data(), d.data());
            }
            case AUTH -> {
                byte[] proof = orZero(hex(v, "proof_hex"), Protocol.PROOF);
                assertArrayEquals(wire, new Handshake.Auth(proof).encode());
                assertArrayEquals(proof, Handshake.Auth.decode(wire).clientProof());
            }
            case WELCOME -> {
                byte[] state = orZero(hex(v, "state_id_hex"), Protocol.STATE_ID);
                byte[] proof = orZero(hex(v, "proof_hex"), Protocol.PROOF);
                long grace = v.get("session_grace_ms").getAsLong();
                Handshake.Welcome w = new Handshake.Welcome(statusCode, flags, detail, grace, state, proof);
                assertArrayEquals(wire, w.encode());
                Handshake.Welcome d = Handshake.Welcome.decode(wire);
                assertEquals(statusCode, d.status());
                assertEquals(flags, d.flags());
                assertEquals((flags & 1) != 0, d.resumed());
                assertEquals(detail, d.detail());
                assertEquals(grace, d.sessionGraceMs());
                assertArrayEquals(state, d.stateId());
                assertArrayEquals(proof, d.serverProof());
            }
            default -> fail("unexpected handshake op in " + name);
        }
    }

    private static byte[] orZero(byte[] b, int n) {
        return b.length == 0 ? new byte[n] : b;
    }

    @ParameterizedTest(name = "{0}")
    @MethodSource("auth")
    void authProofs(String name, JsonObject v) {
        byte[] token = v.get("token_utf8").getAsString().getBytes(StandardCharsets.UTF_8);
        byte[] session = hex(v, "session_id_hex");
        byte[] cn = hex(v, "client_nonce_hex");
        byte[] sn = hex(v, "server_nonce_hex");
        byte[] client = Handshake.clientProof(token, session, cn, sn);
        assertEquals(v.get("client_proof_hex").getAsString(), HEX.formatHex(client));
        Handshake.Welcome w = new Handshake.Welcome(Status.OK.code(), v.get("welcome_flags").getAsInt(), 0,
                v.get("session_grace_ms").getAsLong(), hex(v, "state_id_hex"), new byte[32]);
        byte[] server = Handshake.serverProof(token, session, cn, sn, w.proofInput());
        assertEquals(v.get("server_proof_hex").getAsString(), HEX.formatHex(server));
        assertTrue(Handshake.proofsEqual(server, hex(v, "server_proof_hex")));
        server[31] ^= 1;
        assertFalse(Handshake.proofsEqual(server, hex(v, "server_proof_hex")));
    }

    @ParameterizedTest(name = "{0}")
    @MethodSource("malformed")
    void malformedFrame(String name, JsonObject v) {
        byte[] wire = hex(v, "hex");
        int maxVar = v.get("max_var").getAsInt();
        boolean request = v.get("kind").getAsString().equals("request");
        String error = v.get("error").getAsString();
        ByteBuffer in = ByteBuffer.wrap(wire);
        Decoder d = request ? b -> RequestFrame.decode(b, maxVar) != null : b -> ResponseFrame.decode(b, maxVar) != null;
        switch (error) {
            case "short" -> {
                assertDoesNotDecode(d, in);
                assertEquals(0, in.position(), "an incomplete frame consumes nothing");
            }
            case "length" -> assertEquals(FrameException.Kind.LENGTH, assertThrows(FrameException.class, () -> d.decode(in)).kind());
            case "too_large" -> {
                assertEquals(FrameException.Kind.TOO_LARGE, assertThrows(FrameException.class, () -> d.decode(in)).kind());
                // detected from the length field alone
                ByteBuffer first4 = ByteBuffer.wrap(wire, 0, 4);
                assertEquals(FrameException.Kind.TOO_LARGE,
                        assertThrows(FrameException.class, () -> d.decode(first4)).kind());
            }
            default -> fail("unknown error kind " + error);
        }
    }

    @Test
    void vectorListsAreAllPresent() {
        for (String name : new String[] {"requests", "responses", "handshake", "auth", "malformed"}) {
            assertTrue(VECTORS.getAsJsonArray(name).size() > 0, name);
        }
    }

    @Test
    void truncatedHandshakeFramesAreRejected() {
        byte[] welcome = new Handshake.Welcome(0, 0, 0, 5000, new byte[16], new byte[32]).encode();
        byte[] cut = java.util.Arrays.copyOf(welcome, 60);
        assertThrows(FrameException.class, () -> Handshake.Welcome.decode(cut));
        byte[] challenge = new Handshake.Challenge(0, 1, 0, 0, new byte[32], new byte[] {1, 2}).encode();
        challenge[13] = 3; // data_len disagrees with the frame
        assertThrows(FrameException.class, () -> Handshake.Challenge.decode(challenge));
        assertThrows(FrameException.class, () -> Handshake.Challenge.checkLength(44 + 1025));
        assertThrows(FrameException.class, () -> Handshake.Challenge.checkLength(43));
    }

    private interface Decoder {
        boolean decode(ByteBuffer b) throws FrameException;
    }

    private static void assertDoesNotDecode(Decoder d, ByteBuffer in) {
        try {
            assertFalse(d.decode(in), "an incomplete frame decodes to nothing");
        } catch (FrameException e) {
            fail("an incomplete frame is not an error: " + e.getMessage());
        }
    }

    /** A frame fed one byte at a time decodes only when its last byte arrives. */
    private static void assertSplitDecodes(byte[] wire, Decoder d) throws FrameException {
        for (int n = 0; n < wire.length; n++) {
            ByteBuffer part = ByteBuffer.wrap(wire, 0, n).slice();
            assertFalse(d.decode(part), "decoded from " + n + " of " + wire.length + " bytes");
            assertEquals(0, part.position());
        }
        assertTrue(d.decode(ByteBuffer.wrap(wire)));
    }
}
