package io.ticketing;

import io.ticketing.protocol.Handshake;
import io.ticketing.protocol.Op;
import io.ticketing.protocol.Protocol;
import io.ticketing.protocol.RequestFrame;
import io.ticketing.protocol.ResponseFrame;
import io.ticketing.protocol.Status;
import java.io.DataInputStream;
import java.io.IOException;
import java.io.OutputStream;
import java.net.InetAddress;
import java.net.ServerSocket;
import java.net.Socket;
import java.nio.ByteBuffer;
import java.nio.charset.StandardCharsets;
import java.security.SecureRandom;
import java.time.Duration;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.HashSet;
import java.util.HexFormat;
import java.util.List;
import java.util.Set;
import java.util.concurrent.BlockingQueue;
import java.util.concurrent.CopyOnWriteArrayList;
import java.util.concurrent.LinkedBlockingQueue;
import java.util.concurrent.TimeUnit;

/**
 * A scriptable server that speaks the handshake and hands every request to the test: for the
 * failure paths a real single node cannot easily produce (GOAWAY, NOT_LEADER, a changed state id,
 * dropped answers, a frozen peer, malformed frames).
 */
final class FakeServer implements AutoCloseable {
    /** One request as received, with the connection it came on. */
    record Received(Conn conn, RequestFrame frame) {
        Op op() {
            return Op.fromCode(frame.op());
        }

        long id() {
            return frame.requestId();
        }
    }

    /** One accepted connection. */
    final class Conn {
        final Socket socket;
        final int index;
        final byte[] sessionId;
        final boolean resumed;
        private final OutputStream out;

        Conn(Socket socket, int index, byte[] sessionId, boolean resumed, OutputStream out) {
            this.socket = socket;
            this.index = index;
            this.sessionId = sessionId;
            this.resumed = resumed;
            this.out = out;
        }

        synchronized void send(ResponseFrame f) {
            sendRaw(f.encode());
        }

        synchronized void sendRaw(byte[] b) {
            try {
                out.write(b);
                out.flush();
            } catch (IOException ignored) {
                // the client went away
            }
        }

        void reply(RequestFrame req, Status s, long token, long lease, long detail) {
            send(new ResponseFrame(req.op(), s.code(), req.requestId(), token, lease, detail, new byte[0]));
        }

        void ok(RequestFrame req) {
            reply(req, Status.OK, 0, 0, 0);
        }

        void kill() {
            try {
                socket.setSoLinger(true, 0);
                socket.close();
            } catch (IOException ignored) {
                // gone
            }
        }
    }

    private final ServerSocket listener;
    /**
     * Set by {@link #close()}. Closing a ServerSocket does not stop an accept already under way at
     * once (the JDK interrupts the accepting thread with a signal), so a client reconnecting on the
     * RST of {@link #killAll()} could still be accepted and served after close() returned: it then
     * stayed connected to a "closed" node (seen about once in a hundred runs of a reconnect test).
     * Every connection checks this under {@code all}'s lock before it is served and registered.
     */
    private boolean closed;
    private final SecureRandom random = new SecureRandom();
    /** Sessions seen; share it between fakes to play a cluster that replicates sessions. */
    volatile Set<String> sessions = java.util.Collections.synchronizedSet(new HashSet<>());
    final BlockingQueue<Received> requests = new LinkedBlockingQueue<>();
    final BlockingQueue<Conn> connections = new LinkedBlockingQueue<>();
    final List<Conn> all = new CopyOnWriteArrayList<>();
    final List<String> hellos = new CopyOnWriteArrayList<>();
    final List<Long> helloTimes = new CopyOnWriteArrayList<>(); // System.nanoTime() of each HELLO

    // settings the test may change between connections
    volatile byte[] stateId = new byte[16];
    volatile long graceMs = 5000;
    volatile boolean resume = true;
    volatile byte[] token; // null: no auth
    volatile boolean forgeServerProof;
    volatile String notLeaderHint; // non-null: CHALLENGE NOT_LEADER with this hint
    final java.util.concurrent.atomic.AtomicInteger notLeaderNext = new java.util.concurrent.atomic.AtomicInteger(); // that many next connections: CHALLENGE NOT_LEADER, no hint
    volatile Status refuse; // non-null: CHALLENGE with this status (BUSY, UNSUPPORTED_VERSION...)
    volatile int refuseVersion = 1; // the version field of that CHALLENGE (the server's own version)
    volatile boolean autoPing = true; // answer PING and ACK by itself
    volatile boolean frozen; // accept and read, never answer anything

    FakeServer() throws IOException {
        listener = new ServerSocket(0, 50, InetAddress.getLoopbackAddress());
        random.nextBytes(stateId);
        Thread t = new Thread(this::acceptLoop, "fake-server-accept");
        t.setDaemon(true);
        t.start();
    }

    String endpoint() {
        return "127.0.0.1:" + listener.getLocalPort();
    }

    int port() {
        return listener.getLocalPort();
    }

    void newStateId() {
        byte[] s = new byte[16];
        random.nextBytes(s);
        stateId = s;
    }

    /** Waits for the next request (skipping PING/ACK answered automatically). */
    Received next() throws InterruptedException {
        return next(Duration.ofSeconds(5));
    }

    Received next(Duration timeout) throws InterruptedException {
        Received r = requests.poll(timeout.toMillis(), TimeUnit.MILLISECONDS);
        if (r == null) {
            throw new AssertionError("no request within " + timeout);
        }
        return r;
    }

    /** Waits for the next request with this op, failing on any other op in between. */
    Received expect(Op op) throws InterruptedException {
        Received r = next();
        if (r.op() != op) {
            throw new AssertionError("expected " + op + ", got " + r.op() + " id " + r.id());
        }
        return r;
    }

    /** Tells whether no request arrives within the time. */
    Received poll(Duration timeout) throws InterruptedException {
        return requests.poll(timeout.toMillis(), TimeUnit.MILLISECONDS);
    }

    private void acceptLoop() {
        int index = 0;
        while (!listener.isClosed()) {
            try {
                Socket s = listener.accept();
                if (isClosed()) {
                    reset(s);
                    return;
                }
                int i = index++;
                Thread t = new Thread(() -> serve(s, i), "fake-server-conn-" + i);
                t.setDaemon(true);
                t.start();
            } catch (IOException e) {
                return;
            }
        }
    }

    private void serve(Socket s, int index) {
        try (s) {
            s.setTcpNoDelay(true);
            DataInputStream in = new DataInputStream(s.getInputStream());
            OutputStream out = s.getOutputStream();
            byte[] hello = new byte[Protocol.HELLO];
            in.readFully(hello);
            Handshake.Hello h = Handshake.Hello.decode(hello);
            String sid = HexFormat.of().formatHex(h.sessionId());
            helloTimes.add(System.nanoTime());
            hellos.add(sid);
            if (frozen) {
                while (in.read() >= 0) {
                    // never answer
                }
                return;
            }
            Status refusal = refuse;
            if (refusal != null) {
                out.write(new Handshake.Challenge(refusal.code(), refuseVersion, 0, 0, new byte[32], new byte[0]).encode());
                out.flush();
                return;
            }
            String hintText = notLeaderNext.getAndUpdate(n -> Math.max(0, n - 1)) > 0 ? "" : notLeaderHint;
            if (hintText != null) {
                byte[] hint = hintText.getBytes(StandardCharsets.UTF_8);
                out.write(new Handshake.Challenge(Status.NOT_LEADER.code(), 1, 0, 0, new byte[32], hint).encode());
                out.flush();
                return;
            }
            byte[] nonce = new byte[32];
            byte[] tok = token;
            if (tok != null) {
                random.nextBytes(nonce);
            }
            out.write(new Handshake.Challenge(0, 1, tok != null ? 1 : 0, 0, nonce, new byte[0]).encode());
            out.flush();
            byte[] auth = new byte[Protocol.AUTH];
            in.readFully(auth);
            byte[] proof = Handshake.Auth.decode(auth).clientProof();
            if (tok != null && !Arrays.equals(proof, Handshake.clientProof(tok, h.sessionId(), h.clientNonce(), nonce))) {
                out.write(new Handshake.Welcome(Status.AUTH_FAILED.code(), 0, 0, 0, new byte[16], new byte[32]).encode());
                out.flush();
                return;
            }
            boolean resumed;
            resumed = !sessions.add(sid) && resume;
            Handshake.Welcome w0 = new Handshake.Welcome(0, resumed ? 1 : 0, 0, graceMs, stateId, new byte[32]);
            byte[] sp = tok == null ? new byte[32]
                    : Handshake.serverProof(tok, h.sessionId(), h.clientNonce(), nonce, w0.proofInput());
            if (forgeServerProof) {
                sp[0] ^= 1;
            }
            out.write(new Handshake.Welcome(0, resumed ? 1 : 0, 0, graceMs, stateId, sp).encode());
            out.flush();
            Conn c = new Conn(s, index, h.sessionId(), resumed, out);
            synchronized (all) {
                if (closed) {
                    c.kill();
                    return;
                }
                all.add(c);
            }
            connections.add(c);
            while (true) {
                byte[] len = new byte[4];
                in.readFully(len);
                int n = ByteBuffer.wrap(len).getInt();
                byte[] frame = new byte[4 + n];
                System.arraycopy(len, 0, frame, 0, 4);
                in.readFully(frame, 4, n);
                RequestFrame f = RequestFrame.decode(ByteBuffer.wrap(frame), Protocol.MAX_KEY_LEN);
                if (frozen) {
                    continue;
                }
                if (autoPing && (f.op() == Op.PING.code() || f.op() == Op.ACK.code())) {
                    c.ok(f);
                    continue;
                }
                requests.add(new Received(c, f));
            }
        } catch (Exception e) {
            // connection over
        }
    }

    private boolean isClosed() {
        synchronized (all) {
            return closed;
        }
    }

    private static void reset(Socket s) {
        try {
            s.setSoLinger(true, 0);
            s.close();
        } catch (IOException ignored) {
            // gone
        }
    }

    /** Kills every connection (RST). */
    void killAll() {
        for (Conn c : new ArrayList<>(all)) {
            c.kill();
        }
    }

    @Override
    public void close() throws IOException {
        synchronized (all) {
            closed = true;
        }
        listener.close();
        killAll();
    }
}
