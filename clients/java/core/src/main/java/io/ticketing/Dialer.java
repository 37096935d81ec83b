package io.ticketing;

import io.ticketing.protocol.BusyLimit;
import io.ticketing.protocol.Bytes;
import io.ticketing.protocol.FrameException;
import io.ticketing.protocol.Handshake;
import io.ticketing.protocol.InvalidField;
import io.ticketing.protocol.Protocol;
import io.ticketing.protocol.Status;
import java.io.BufferedInputStream;
import java.io.BufferedOutputStream;
import java.io.DataInputStream;
import java.io.EOFException;
import java.io.IOException;
import java.io.OutputStream;
import java.net.InetSocketAddress;
import java.net.Socket;
import java.net.SocketTimeoutException;
import java.nio.ByteBuffer;
import java.security.SecureRandom;
import java.time.Duration;
import java.util.concurrent.TimeUnit;
import java.util.function.Consumer;
import javax.net.ssl.SSLContext;
import javax.net.ssl.SSLException;
import javax.net.ssl.SSLParameters;
import javax.net.ssl.SSLSocket;

/** Opens one connection: TCP, TLS when configured, and the four-frame handshake. */
final class Dialer {
    private Dialer() {
    }

    /** A connection whose handshake succeeded. */
    record Dialed(Endpoint endpoint, Socket socket, DataInputStream in, OutputStream out, Handshake.Welcome welcome) {
        void close() {
            try {
                socket.close();
            } catch (IOException ignored) {
                // closing anyway
            }
        }
    }

    /** A CHALLENGE NOT_LEADER: the endpoint names the leader (or nobody, when {@code leader} is null). */
    static final class NotLeader extends TicketingException {
        private static final long serialVersionUID = 1L;
        final String leader;

        NotLeader(Endpoint endpoint, String leader) {
            super(endpoint + " is not the leader" + (leader == null ? " and knows none" : "; the leader is " + leader));
            this.leader = leader;
        }
    }

    /**
     * How long TLS and the protocol handshake may take once TCP is connected (docs/clients.md, the
     * connect timeout): a frozen node's kernel still accepts connections, and the next endpoint
     * should not wait for the whole connect timeout behind it.
     */
    static final Duration HANDSHAKE_WAIT = Duration.ofSeconds(2);

    /**
     * Connects to one endpoint within {@code timeout}; TLS and the handshake get at most
     * {@link #HANDSHAKE_WAIT} of it once TCP is connected.
     *
     * @param register told of the socket as soon as it exists, so that close() can abort the dial
     */
    static Dialed dial(Endpoint ep, ClientOptions opts, SSLContext ssl, byte[] sessionId, SecureRandom random,
            Duration timeout, Consumer<Socket> register) {
        long deadline = System.nanoTime() + timeout.toNanos();
        // Plain TCP: a channel's socket, so that the connection can read without blocking (a
        // caller reading its own answer must stay interruptible; see Connection).
        Socket socket;
        java.nio.channels.SocketChannel channel = null;
        if (ssl == null) {
            try {
                channel = java.nio.channels.SocketChannel.open();
            } catch (IOException e) {
                throw new UnavailableException("cannot connect to " + ep + ": " + e.getMessage(), e);
            }
            socket = channel.socket();
        } else {
            socket = new Socket();
        }
        register.accept(socket);
        boolean ok = false;
        ChannelStreams streams = null;
        try {
            try {
                socket.setTcpNoDelay(true);
                socket.setKeepAlive(true);
                if (channel != null) {
                    streams = ChannelStreams.connect(channel, new InetSocketAddress(ep.host(), ep.port()),
                            remainingMs(deadline, ep));
                } else {
                    socket.connect(new InetSocketAddress(ep.host(), ep.port()), remainingMs(deadline, ep));
                }
            } catch (SocketTimeoutException e) {
                throw new UnavailableException("connect to " + ep + " timed out after " + timeout.toMillis() + " ms");
            } catch (IOException e) {
                throw new UnavailableException("cannot connect to " + ep + ": " + e.getMessage(), e);
            }
            if (connectedToItself(socket)) {
                throw new UnavailableException("cannot connect to " + ep + ": nothing listens there (the connection"
                        + " reached itself)");
            }
            long handshakeWait = Math.min(HANDSHAKE_WAIT.toNanos(), timeout.toNanos());
            deadline = Math.min(deadline, System.nanoTime() + handshakeWait);
            Socket s = socket;
            if (ssl != null) {
                s = startTls(socket, ep, opts.tls(), ssl, deadline);
                register.accept(s);
            }
            Dialed d = handshake(ep, s, streams, opts, sessionId, random, deadline, handshakeWait);
            ok = true;
            return d;
        } finally {
            if (streams != null) {
                try {
                    streams.release();
                } catch (IOException ignored) {
                    // only the handshake's selector
                }
            }
            if (!ok) {
                try {
                    socket.close();
                } catch (IOException ignored) {
                    // failed anyway
                }
            }
        }
    }

    /**
     * Whether {@code s} is connected to itself. A connect to a local port in the ephemeral range
     * that nothing listens on may be given that same port as its source, and TCP then connects the
     * socket to itself (a simultaneous open): the handshake would read its own HELLO back, and the
     * socket would hold the port a restarting server needs. Such a connect counts as refused.
     */
    static boolean connectedToItself(Socket s) {
        return s.getLocalPort() == s.getPort() && s.getLocalAddress().equals(s.getInetAddress());
    }

    private static int remainingMs(long deadline, Endpoint ep) {
        long ms = (deadline - System.nanoTime()) / 1_000_000;
        if (ms <= 0) {
            throw new UnavailableException("connect to " + ep + " timed out");
        }
        return (int) Math.min(Integer.MAX_VALUE, ms);
    }

    private static Socket startTls(Socket raw, Endpoint ep, TlsOptions tls, SSLContext ssl, long deadline) {
        String name = tls.serverName() != null ? tls.serverName() : ep.host();
        try {
            SSLSocket s = (SSLSocket) ssl.getSocketFactory().createSocket(raw, name, ep.port(), true);
            SSLParameters p = s.getSSLParameters();
            if (tls.verifyHostname()) {
                p.setEndpointIdentificationAlgorithm("HTTPS");
            }
            s.setSSLParameters(p);
            s.setUseClientMode(true);
            s.setSoTimeout(remainingMs(deadline, ep));
            s.startHandshake();
            return s;
        } catch (SocketTimeoutException e) {
            throw new TlsException("TLS handshake with " + ep + " timed out; is the server using TLS?", e);
        } catch (SSLException e) {
            throw new TlsException("TLS handshake with " + ep + " failed: " + e.getMessage()
                    + " (is the server using TLS, and is its certificate trusted?)", e);
        } catch (IOException e) {
            throw new TlsException("TLS handshake with " + ep + " failed: " + e.getMessage()
                    + " (is the server using TLS?)", e);
        }
    }

    private static Dialed handshake(Endpoint ep, Socket s, ChannelStreams streams, ClientOptions opts, byte[] sessionId,
            SecureRandom random, long deadline, long handshakeWait) {
        boolean tls = opts.tls() != null;
        boolean challenged = false; // a CHALLENGE came: the TLS session was accepted
        try {
            DataInputStream in;
            OutputStream out;
            if (streams != null) {
                streams.timeoutMs = remainingMs(deadline, ep);
                in = new DataInputStream(new BufferedInputStream(streams.in(), 64 * 1024));
                out = new BufferedOutputStream(streams.out(), 64 * 1024);
            } else {
                s.setSoTimeout(remainingMs(deadline, ep));
                in = new DataInputStream(new BufferedInputStream(s.getInputStream(), 64 * 1024));
                out = new BufferedOutputStream(s.getOutputStream(), 64 * 1024);
            }
            byte[] clientNonce = new byte[Protocol.NONCE];
            random.nextBytes(clientNonce);
            out.write(new Handshake.Hello(Protocol.VERSION, 0, sessionId, clientNonce).encode());
            out.flush();

            byte[] lenBuf = new byte[4];
            in.readFully(lenBuf);
            if (!tls && (lenBuf[0] == 0x15 || lenBuf[0] == 0x16)) {
                throw new TlsException("the server at " + ep + " answered with TLS; is the server using TLS? (set ClientOptions.tls)");
            }
            long len = ByteBuffer.wrap(lenBuf).getInt() & 0xFFFF_FFFFL;
            Handshake.Challenge.checkLength(len);
            byte[] frame = new byte[4 + (int) len];
            System.arraycopy(lenBuf, 0, frame, 0, 4);
            in.readFully(frame, 4, (int) len);
            Handshake.Challenge ch = Handshake.Challenge.decode(frame);
            challenged = true;
            if (ch.status() != Status.OK.code()) {
                throw challengeError(ep, ch);
            }
            byte[] token = opts.tokenBytes();
            if (token != null && !ch.authRequired()) {
                throw new AuthFailedException("the server at " + ep
                        + " does not require a token, but this client has one: refusing it (it cannot prove it holds the token)");
            }
            byte[] proof = token != null
                    ? Handshake.clientProof(token, sessionId, clientNonce, ch.serverNonce())
                    : new byte[Protocol.PROOF];
            out.write(new Handshake.Auth(proof).encode());
            out.flush();

            byte[] wframe = new byte[Protocol.WELCOME];
            in.readFully(wframe);
            Handshake.Welcome w = Handshake.Welcome.decode(wframe);
            if (w.status() != Status.OK.code()) {
                throw welcomeError(ep, w, token != null);
            }
            if (token != null) {
                byte[] expected = Handshake.serverProof(token, sessionId, clientNonce, ch.serverNonce(), w.proofInput());
                if (!Handshake.proofsEqual(expected, w.serverProof())) {
                    throw new AuthFailedException("the server at " + ep + " could not prove that it holds the token");
                }
            }
            if (streams != null) {
                streams.timeoutMs = 0;
            } else {
                s.setSoTimeout(0);
            }
            return new Dialed(ep, s, in, out, w);
        } catch (SocketTimeoutException e) {
            throw new UnavailableException("handshake with " + ep + " timed out: no answer within "
                    + TimeUnit.NANOSECONDS.toMillis(handshakeWait) + " ms of the TCP connection (is the server frozen, or not a"
                    + " Ticketing server" + (tls ? "" : ", or using TLS") + "?)");
        } catch (EOFException e) {
            if (tls && !challenged) {
                // With TLS 1.3 a refused client certificate shows only now, as the server closing.
                throw new TlsException("the server at " + ep + " closed the TLS connection during the handshake"
                        + " (does it require a client certificate?)", e);
            }
            throw new UnavailableException("connection to " + ep + " closed during the handshake"
                    + (tls || challenged ? "" : " (is the server using TLS?)"));
        } catch (SSLException e) {
            throw new TlsException("TLS failed with " + ep + ": " + e.getMessage(), e);
        } catch (IOException e) {
            if (tls && !challenged) {
                throw new TlsException("the TLS connection to " + ep + " failed during the handshake: " + e.getMessage()
                        + " (does the server require a client certificate?)", e);
            }
            throw new UnavailableException("handshake with " + ep + " failed: " + e.getMessage(), e);
        } catch (FrameException e) {
            throw new ProtocolException("malformed handshake frame from " + ep + ": " + e.getMessage()
                    + (tls ? "" : " (is the server using TLS?)"));
        }
    }

    private static TicketingException challengeError(Endpoint ep, Handshake.Challenge ch) {
        String msg = Bytes.utf8(ch.data());
        Status s = Status.fromCode(ch.status());
        if (s == null) {
            return new ProtocolException("the server at " + ep + " refused the handshake with unknown status "
                    + ch.status() + (msg.isEmpty() ? "" : ": " + msg));
        }
        return switch (s) {
            case NOT_LEADER -> new NotLeader(ep, msg.isEmpty() ? null : msg);
            case UNSUPPORTED_VERSION -> new UnsupportedVersionException(versionMessage(ep, ch.version(), msg));
            case BUSY -> new BusyException("the server at " + ep + " is busy (" + limitName(ch.detail()) + ")"
                    + (msg.isEmpty() ? "" : ": " + msg), BusyLimit.fromCode(ch.detail()));
            case SHUTTING_DOWN -> new ShuttingDownException("the server at " + ep + " is shutting down");
            case INVALID -> new ProtocolException("the server at " + ep + " rejected HELLO ("
                    + fieldName(ch.detail()) + ")" + (msg.isEmpty() ? "" : ": " + msg));
            default -> new ProtocolException("the server at " + ep + " refused the handshake with status " + s
                    + (msg.isEmpty() ? "" : ": " + msg));
        };
    }

    private static TicketingException welcomeError(Endpoint ep, Handshake.Welcome w, boolean hasToken) {
        Status s = Status.fromCode(w.status());
        if (s == null) {
            return new ProtocolException("the server at " + ep + " refused the session with unknown status " + w.status());
        }
        return switch (s) {
            case AUTH_FAILED -> new AuthFailedException(hasToken
                    ? "the server at " + ep + " rejected the token"
                    : "the server at " + ep + " requires a token; none is configured");
            case BUSY -> new BusyException("the server at " + ep + " is busy (" + limitName(w.detail()) + ")",
                    BusyLimit.fromCode(w.detail()));
            case SHUTTING_DOWN -> new ShuttingDownException("the server at " + ep + " is shutting down");
            case NOT_LEADER -> new NotLeader(ep, null);
            case UNSUPPORTED_VERSION -> new UnsupportedVersionException("the server at " + ep
                    + " does not speak protocol version " + Protocol.VERSION);
            default -> new ProtocolException("the server at " + ep + " refused the session with status " + s);
        };
    }

    /**
     * The message of a CHALLENGE {@code UNSUPPORTED_VERSION}: it names the server's version (the
     * CHALLENGE's version field) and this client's; a server that names this client's own version
     * while refusing it is reported as such, not as "does not speak 1 (it speaks 1)".
     */
    static String versionMessage(Endpoint ep, int serverVersion, String msg) {
        String head = serverVersion == Protocol.VERSION
                ? "the server at " + ep + " refused protocol version " + Protocol.VERSION + ", although it names " + serverVersion + " as its own"
                : "the server at " + ep + " speaks protocol version " + serverVersion + ", this client " + Protocol.VERSION;
        return head + (msg.isEmpty() ? "" : ": " + msg);
    }

    static String limitName(long code) {
        BusyLimit l = BusyLimit.fromCode(code);
        return l == null ? "limit " + code : l.name();
    }

    static String fieldName(long code) {
        InvalidField f = InvalidField.fromCode(code);
        return f == null ? "field " + code : f.name();
    }
}
