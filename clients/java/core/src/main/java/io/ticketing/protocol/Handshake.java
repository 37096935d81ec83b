package io.ticketing.protocol;

import java.nio.ByteBuffer;
import java.nio.charset.StandardCharsets;
import java.security.InvalidKeyException;
import java.security.MessageDigest;
import java.security.NoSuchAlgorithmException;
import javax.crypto.Mac;
import javax.crypto.spec.SecretKeySpec;

/**
 * The four handshake frames (HELLO, CHALLENGE, AUTH, WELCOME) and the mutual authentication
 * proofs of {@code PROTOCOL.md}.
 */
public final class Handshake {
    private Handshake() {
    }

    private static final byte[] CLIENT_LABEL = "ticketing/1 client".getBytes(StandardCharsets.US_ASCII);
    private static final byte[] SERVER_LABEL = "ticketing/1 server".getBytes(StandardCharsets.US_ASCII);

    /**
     * HELLO (client to server), 56 bytes.
     *
     * @param version the protocol version ({@link Protocol#VERSION})
     * @param flags reserved, 0
     * @param sessionId the client's 16-byte session id
     * @param clientNonce 32 fresh random bytes
     */
    public record Hello(int version, int flags, byte[] sessionId, byte[] clientNonce) {
        /**
         * Creates the frame, checking the field sizes.
         *
         * @param version the protocol version ({@link Protocol#VERSION})
         * @param flags reserved, 0
         * @param sessionId the client's 16-byte session id
         * @param clientNonce 32 fresh random bytes
         */
        public Hello {
            Bytes.checkLen("session_id", sessionId, Protocol.SESSION_ID);
            Bytes.checkLen("client_nonce", clientNonce, Protocol.NONCE);
        }

        /** {@return the encoded frame} */
        public byte[] encode() {
            ByteBuffer b = ByteBuffer.allocate(Protocol.HELLO);
            b.putInt(Protocol.HELLO - 4).put((byte) Op.HELLO.code()).put((byte) version).putShort((short) flags);
            b.put(sessionId).put(clientNonce);
            return b.array();
        }

        /**
         * Decodes a whole HELLO frame.
         *
         * @param frame the frame, length field included
         * @return the fields
         * @throws FrameException when the size or op is wrong
         */
        public static Hello decode(byte[] frame) throws FrameException {
            ByteBuffer b = expect(frame, Op.HELLO, Protocol.HELLO);
            return new Hello(b.get(5) & 0xFF, Bytes.u16(b, 6), slice(b, 8, 16), slice(b, 24, 32));
        }
    }

    /**
     * CHALLENGE (server to client), 48 + n bytes.
     *
     * @param status {@link Status#code()}: OK, or an error after which the server closes
     * @param version the server's protocol version
     * @param flags bit 0: {@link Protocol#CHALLENGE_AUTH_REQUIRED}
     * @param detail INVALID: field code; BUSY: limit code; else 0
     * @param serverNonce 32 bytes (zero unless OK with auth required)
     * @param data NOT_LEADER: the leader's address (may be empty); errors: a message
     */
    public record Challenge(int status, int version, int flags, long detail, byte[] serverNonce, byte[] data) {
        /**
         * Creates the frame, checking the field sizes.
         *
         * @param status {@link Status#code()}: OK, or an error after which the server closes
         * @param version the server's protocol version
         * @param flags bit 0: {@link Protocol#CHALLENGE_AUTH_REQUIRED}
         * @param detail INVALID: field code; BUSY: limit code; else 0
         * @param serverNonce 32 bytes (zero unless OK with auth required)
         * @param data NOT_LEADER: the leader's address (may be empty); errors: a message
         */
        public Challenge {
            Bytes.checkLen("server_nonce", serverNonce, Protocol.NONCE);
            Bytes.checkU32("detail", detail);
            if (data == null) {
                data = new byte[0];
            }
            if (data.length > Protocol.MAX_CHALLENGE_DATA) {
                throw new IllegalArgumentException("challenge data longer than " + Protocol.MAX_CHALLENGE_DATA);
            }
        }

        /** {@return whether the server holds a token} */
        public boolean authRequired() {
            return (flags & Protocol.CHALLENGE_AUTH_REQUIRED) != 0;
        }

        /** {@return the encoded frame} */
        public byte[] encode() {
            ByteBuffer b = ByteBuffer.allocate(Protocol.CHALLENGE + data.length);
            b.putInt(Protocol.CHALLENGE - 4 + data.length).put((byte) Op.CHALLENGE.code()).put((byte) status)
                    .put((byte) version).put((byte) flags).putInt((int) detail).putShort((short) data.length)
                    .putShort((short) 0).put(serverNonce).put(data);
            return b.array();
        }

        /**
         * Checks a CHALLENGE length field before its body is read.
         *
         * @param length the value of the length field
         * @throws FrameException when no CHALLENGE can have it
         */
        public static void checkLength(long length) throws FrameException {
            if (length < Protocol.CHALLENGE - 4 || length > Protocol.CHALLENGE - 4 + Protocol.MAX_CHALLENGE_DATA) {
                throw new FrameException(FrameException.Kind.LENGTH, "CHALLENGE length " + length + " out of range");
            }
        }

        /**
         * Decodes a whole CHALLENGE frame.
         *
         * @param frame the frame, length field included
         * @return the fields
         * @throws FrameException when the size, op or data length is wrong
         */
        public static Challenge decode(byte[] frame) throws FrameException {
            if (frame.length < Protocol.CHALLENGE) {
                throw new FrameException(FrameException.Kind.LENGTH, "CHALLENGE shorter than " + Protocol.CHALLENGE);
            }
            ByteBuffer b = ByteBuffer.wrap(frame);
            int n = Bytes.u16(b, 12);
            if (n > Protocol.MAX_CHALLENGE_DATA) {
                throw new FrameException(FrameException.Kind.LENGTH, "CHALLENGE data_len " + n + " above the limit");
            }
            expect(frame, Op.CHALLENGE, Protocol.CHALLENGE + n);
            return new Challenge(b.get(5) & 0xFF, b.get(6) & 0xFF, b.get(7) & 0xFF, Bytes.u32(b, 8),
                    slice(b, 16, 32), slice(b, 48, n));
        }
    }

    /**
     * AUTH (client to server), 40 bytes.
     *
     * @param clientProof the client proof, all zero when the server requires no token
     */
    public record Auth(byte[] clientProof) {
        /**
         * Creates the frame, checking the proof size.
         *
         * @param clientProof the client proof, all zero when the server requires no token
         */
        public Auth {
            Bytes.checkLen("client_proof", clientProof, Protocol.PROOF);
        }

        /** {@return the encoded frame} */
        public byte[] encode() {
            ByteBuffer b = ByteBuffer.allocate(Protocol.AUTH);
            b.putInt(Protocol.AUTH - 4).put((byte) Op.AUTH.code()).put(new byte[3]).put(clientProof);
            return b.array();
        }

        /**
         * Decodes a whole AUTH frame.
         *
         * @param frame the frame, length field included
         * @return the fields
         * @throws FrameException when the size or op is wrong
         */
        public static Auth decode(byte[] frame) throws FrameException {
            ByteBuffer b = expect(frame, Op.AUTH, Protocol.AUTH);
            return new Auth(slice(b, 8, 32));
        }
    }

    /**
     * WELCOME (server to client), 64 bytes.
     *
     * @param status {@link Status#code()}: OK, or an error after which the server closes
     * @param flags bit 0: {@link Protocol#WELCOME_RESUMED}
     * @param detail BUSY: limit code; else 0
     * @param sessionGraceMs how long the server keeps the session after its connection drops
     * @param stateId the lock state this server serves (zero unless OK)
     * @param serverProof the server proof (zero without auth or unless OK)
     */
    public record Welcome(int status, int flags, long detail, long sessionGraceMs, byte[] stateId, byte[] serverProof) {
        /**
         * Creates the frame, checking the field sizes.
         *
         * @param status {@link Status#code()}: OK, or an error after which the server closes
         * @param flags bit 0: {@link Protocol#WELCOME_RESUMED}
         * @param detail BUSY: limit code; else 0
         * @param sessionGraceMs how long the server keeps the session after its connection drops
         * @param stateId the lock state this server serves (zero unless OK)
         * @param serverProof the server proof (zero without auth or unless OK)
         */
        public Welcome {
            Bytes.checkLen("state_id", stateId, Protocol.STATE_ID);
            Bytes.checkLen("server_proof", serverProof, Protocol.PROOF);
            Bytes.checkU32("detail", detail);
            Bytes.checkU32("session_grace_ms", sessionGraceMs);
        }

        /** {@return whether the session named in HELLO was resumed} */
        public boolean resumed() {
            return (flags & Protocol.WELCOME_RESUMED) != 0;
        }

        /** {@return the encoded frame} */
        public byte[] encode() {
            ByteBuffer b = ByteBuffer.allocate(Protocol.WELCOME);
            b.putInt(Protocol.WELCOME - 4).put((byte) Op.WELCOME.code());
            b.put(proofInput());
            b.put(serverProof);
            return b.array();
        }

        /** {@return {@code WELCOME[5..31]}: the 27 bytes the server proof covers} */
        public byte[] proofInput() {
            ByteBuffer b = ByteBuffer.allocate(27);
            b.put((byte) status).put((byte) flags).put((byte) 0).putInt((int) detail).putInt((int) sessionGraceMs)
                    .put(stateId);
            return b.array();
        }

        /**
         * Decodes a whole WELCOME frame.
         *
         * @param frame the frame, length field included
         * @return the fields
         * @throws FrameException when the size or op is wrong
         */
        public static Welcome decode(byte[] frame) throws FrameException {
            ByteBuffer b = expect(frame, Op.WELCOME, Protocol.WELCOME);
            return new Welcome(b.get(5) & 0xFF, b.get(6) & 0xFF, Bytes.u32(b, 8), Bytes.u32(b, 12),
                    slice(b, 16, 16), slice(b, 32, 32));
        }
    }

    /**
     * Computes {@code client_proof = HMAC-SHA256(token, "ticketing/1 client" || session_id ||
     * client_nonce || server_nonce)}.
     *
     * @param token the shared token's bytes (UTF-8 of the configured token)
     * @param sessionId the session id sent in HELLO
     * @param clientNonce the nonce sent in HELLO
     * @param serverNonce the nonce read from CHALLENGE
     * @return the 32-byte proof
     */
    public static byte[] clientProof(byte[] token, byte[] sessionId, byte[] clientNonce, byte[] serverNonce) {
        Mac mac = hmac(token);
        mac.update(CLIENT_LABEL);
        mac.update(sessionId);
        mac.update(clientNonce);
        mac.update(serverNonce);
        return mac.doFinal();
    }

    /**
     * Computes {@code server_proof = HMAC-SHA256(token, "ticketing/1 server" || session_id ||
     * client_nonce || server_nonce || WELCOME[5..31])}.
     *
     * @param token the shared token's bytes
     * @param sessionId the session id sent in HELLO
     * @param clientNonce the nonce sent in HELLO
     * @param serverNonce the nonce read from CHALLENGE
     * @param welcomeProofInput {@link Welcome#proofInput()} of the WELCOME received
     * @return the 32-byte proof
     */
    public static byte[] serverProof(byte[] token, byte[] sessionId, byte[] clientNonce, byte[] serverNonce,
            byte[] welcomeProofInput) {
        Mac mac = hmac(token);
        mac.update(SERVER_LABEL);
        mac.update(sessionId);
        mac.update(clientNonce);
        mac.update(serverNonce);
        mac.update(welcomeProofInput);
        return mac.doFinal();
    }

    /**
     * Compares two proofs in constant time.
     *
     * @param a one proof
     * @param b the other
     * @return true when equal
     */
    public static boolean proofsEqual(byte[] a, byte[] b) {
        return MessageDigest.isEqual(a, b);
    }

    private static Mac hmac(byte[] token) {
        try {
            Mac mac = Mac.getInstance("HmacSHA256");
            // An empty token is a valid (if unwise) shared secret; SecretKeySpec refuses empty keys.
            mac.init(token.length == 0 ? new EmptyKey() : new SecretKeySpec(token, "HmacSHA256"));
            return mac;
        } catch (NoSuchAlgorithmException | InvalidKeyException e) {
            throw new IllegalStateException("HmacSHA256 is not available", e);
        }
    }

    private static final class EmptyKey implements javax.crypto.SecretKey {
        private static final long serialVersionUID = 1L;

        @Override
        public String getAlgorithm() {
            return "HmacSHA256";
        }

        @Override
        public String getFormat() {
            return "RAW";
        }

        @Override
        public byte[] getEncoded() {
            return new byte[0];
        }
    }

    private static ByteBuffer expect(byte[] frame, Op op, int size) throws FrameException {
        if (frame.length != size) {
            throw new FrameException(FrameException.Kind.LENGTH,
                    op + " frame is " + frame.length + " bytes, expected " + size);
        }
        ByteBuffer b = ByteBuffer.wrap(frame);
        if (Bytes.u32(b, 0) != size - 4) {
            throw new FrameException(FrameException.Kind.LENGTH, op + " length field " + Bytes.u32(b, 0));
        }
        if ((b.get(4) & 0xFF) != op.code()) {
            throw new FrameException(FrameException.Kind.LENGTH,
                    "expected " + op + ", got op 0x" + Integer.toHexString(b.get(4) & 0xFF));
        }
        return b;
    }

    private static byte[] slice(ByteBuffer b, int off, int n) {
        byte[] out = new byte[n];
        b.get(off, out);
        return out;
    }
}
