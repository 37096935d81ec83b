package io.ticketing.conformance;

import io.ticketing.AcquireOptions;
import io.ticketing.AlreadyHeldException;
import io.ticketing.AuthFailedException;
import io.ticketing.BusyException;
import io.ticketing.CancelledException;
import io.ticketing.ClientOptions;
import io.ticketing.ClosedException;
import io.ticketing.ConnectionLostException;
import io.ticketing.InvalidArgumentException;
import io.ticketing.Lock;
import io.ticketing.LockInfo;
import io.ticketing.LockLostException;
import io.ticketing.LostReason;
import io.ticketing.NotAcquiredException;
import io.ticketing.NotHeldException;
import io.ticketing.RequestTimeoutException;
import io.ticketing.ServerRestartedException;
import io.ticketing.ShuttingDownException;
import io.ticketing.TicketingClient;
import io.ticketing.TlsException;
import io.ticketing.TlsOptions;
import io.ticketing.UnavailableException;
import io.ticketing.UnsupportedVersionException;
import java.io.BufferedReader;
import java.io.InputStreamReader;
import java.io.PrintStream;
import java.nio.charset.StandardCharsets;
import java.nio.file.Path;
import java.time.Duration;
import java.util.ArrayList;
import java.util.HexFormat;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.Optional;
import java.util.concurrent.CancellationException;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.CompletionException;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.ExecutionException;
import java.util.concurrent.ExecutorService;
import java.util.concurrent.Executors;

/**
 * The Java client's conformance driver (tests/conformance/DRIVER.md): JSON commands on stdin, one
 * per line, each run concurrently on the client's public API; replies and {@code lost} events on
 * stdout, one line each.
 */
public final class Driver {
    private final PrintStream out;
    private final ExecutorService pool = Executors.newCachedThreadPool(r -> {
        Thread t = new Thread(r, "driver-command");
        t.setDaemon(true);
        return t;
    });
    private final Map<String, TicketingClient> clients = new ConcurrentHashMap<>();
    private final Map<String, Lock> locks = new ConcurrentHashMap<>();
    /** Commands that "cancel" may withdraw, by command id. */
    private final Map<Long, Runnable> pending = new ConcurrentHashMap<>();

    private Driver(PrintStream out) {
        this.out = out;
    }

    /**
     * Runs the driver until {@code exit} or the end of stdin.
     *
     * @param args ignored
     * @throws Exception when stdin cannot be read
     */
    public static void main(String[] args) throws Exception {
        PrintStream out = new PrintStream(new java.io.FileOutputStream(java.io.FileDescriptor.out), false,
                StandardCharsets.UTF_8);
        new Driver(out).run(new BufferedReader(new InputStreamReader(System.in, StandardCharsets.UTF_8)));
        System.exit(0);
    }

    private void run(BufferedReader in) throws Exception {
        String line;
        while ((line = in.readLine()) != null) {
            if (line.isBlank()) {
                continue;
            }
            Map<String, Object> cmd;
            try {
                @SuppressWarnings("unchecked")
                Map<String, Object> m = (Map<String, Object>) Json.parse(line);
                cmd = m;
            } catch (RuntimeException e) {
                System.err.println("driver: unreadable command: " + line + ": " + e.getMessage());
                continue;
            }
            Object id = cmd.get("id");
            if ("exit".equals(cmd.get("op"))) {
                reply(id, Map.of());
                return;
            }
            pool.execute(() -> handle(id, cmd));
        }
        // stdin closed: let the commands in flight answer (bounded), then exit
        pool.shutdown();
        pool.awaitTermination(5, java.util.concurrent.TimeUnit.SECONDS);
    }

    private void handle(Object id, Map<String, Object> cmd) {
        try {
            Map<String, Object> result = dispatch(((Number) id).longValue(), cmd);
            reply(id, result);
        } catch (Throwable t) {
            fail(id, t);
        }
    }

    private synchronized void emit(Map<String, Object> msg) {
        out.println(Json.write(msg));
        out.flush();
    }

    private void reply(Object id, Map<String, Object> result) {
        Map<String, Object> m = new LinkedHashMap<>();
        m.put("id", id);
        m.put("ok", true);
        m.putAll(result);
        emit(m);
    }

    private void fail(Object id, Throwable t) {
        while ((t instanceof CompletionException || t instanceof ExecutionException) && t.getCause() != null) {
            t = t.getCause();
        }
        Map<String, Object> err = new LinkedHashMap<>();
        err.put("kind", kind(t));
        err.put("message", String.valueOf(t.getMessage()));
        if (t instanceof LockLostException l) {
            err.put("reason", reason(l.reason()));
        }
        if ("other".equals(err.get("kind"))) {
            t.printStackTrace();
        }
        Map<String, Object> m = new LinkedHashMap<>();
        m.put("id", id);
        m.put("ok", false);
        m.put("error", err);
        emit(m);
    }

    static String kind(Throwable t) {
        if (t instanceof NotAcquiredException) {
            return "not_acquired";
        }
        if (t instanceof CancelledException || t instanceof CancellationException) {
            return "cancelled";
        }
        if (t instanceof NotHeldException) {
            return "not_held";
        }
        if (t instanceof LockLostException) {
            return "lock_lost";
        }
        if (t instanceof InvalidArgumentException || t instanceof NumberFormatException) {
            return "invalid_argument";
        }
        if (t instanceof AlreadyHeldException) {
            return "already_held";
        }
        if (t instanceof AuthFailedException) {
            return "auth_failed";
        }
        if (t instanceof UnsupportedVersionException) {
            return "unsupported_version";
        }
        if (t instanceof UnavailableException) {
            return "unavailable";
        }
        if (t instanceof TlsException) {
            return "tls";
        }
        if (t instanceof RequestTimeoutException) {
            return "timeout";
        }
        if (t instanceof ConnectionLostException) {
            return "connection_lost";
        }
        if (t instanceof ServerRestartedException) {
            return "server_restarted";
        }
        if (t instanceof BusyException) {
            return "busy";
        }
        if (t instanceof ShuttingDownException) {
            return "shutting_down";
        }
        if (t instanceof ClosedException) {
            return "closed";
        }
        return "other";
    }

    static String reason(LostReason r) {
        return switch (r) {
            case EXPIRED -> "expired";
            case NOT_HELD -> "not_held";
            case SERVER_RESTARTED -> "server_restarted";
            case SERVER_STOPPING -> "server_stopping";
        };
    }

    private Map<String, Object> dispatch(long id, Map<String, Object> c) throws Exception {
        String op = (String) c.get("op");
        switch (op) {
            case "hello":
                return Map.of("language", "java", "client_version", TicketingClient.version(), "features", List.of("locks", "cancel",
                        "keepalive", "with_lock", "verify", "refuse_held", "tls", "mtls", "request_timeout",
                        "lost_events", "connect_election"));
            case "connect":
                return connect(c);
            case "close": {
                TicketingClient cl = clients.remove(str(c, "client"));
                if (cl != null) {
                    cl.close();
                }
                return Map.of();
            }
            case "acquire":
                return acquire(id, c);
            case "try_acquire": {
                Optional<Lock> l = await(id, client(c).tryAcquireAsync(key(c), AcquireOptions.of(ms(c, "lease_ms"), Duration.ZERO)));
                if (l.isEmpty()) {
                    return Map.of("acquired", false);
                }
                track(str(c, "lock"), l.get());
                return Map.of("acquired", true, "token", Long.toUnsignedString(l.get().token()));
            }
            case "cancel": {
                Runnable cancel = pending.get(((Number) c.get("target")).longValue());
                if (cancel != null) {
                    cancel.run();
                }
                return Map.of();
            }
            case "release":
                lock(c).release();
                return Map.of();
            case "extend":
                return Map.of("lease_ms", lock(c).extend(ms(c, "lease_ms")).toMillis());
            case "lock_state": {
                Lock l = lock(c);
                Map<String, Object> m = new LinkedHashMap<>();
                m.put("lost", l.isLost());
                l.lostReason().ifPresent(r -> m.put("reason", reason(r)));
                m.put("token", Long.toUnsignedString(l.token()));
                m.put("deadline_in_ms", l.timeLeft().toNanos() / 1e6);
                return m;
            }
            case "verify":
                return Map.of("held", lock(c).verify());
            case "release_token":
                client(c).release(str(c, "key"), Long.parseUnsignedLong(str(c, "token")));
                return Map.of();
            case "inspect": {
                LockInfo i = client(c).inspect(str(c, "key"));
                return Map.of("held", i.held(), "waiters", i.waiters(), "lease_left_ms", i.leaseLeft().toMillis());
            }
            case "ping":
                client(c).ping();
                return Map.of();
            case "with_lock": {
                long hold = ((Number) c.get("hold_ms")).longValue();
                try (Lock l = client(c).acquire(key(c), AcquireOptions.builder(ms(c, "lease_ms")).build())) {
                    Thread.sleep(hold);
                    l.token();
                }
                return Map.of();
            }
            case "reset": {
                List<Thread> closers = new ArrayList<>();
                for (TicketingClient cl : clients.values()) {
                    Thread t = new Thread(cl::close);
                    t.start();
                    closers.add(t);
                }
                for (Thread t : closers) {
                    t.join(10_000);
                }
                clients.clear();
                locks.clear();
                pending.clear();
                return Map.of();
            }
            default:
                throw new IllegalArgumentException("unknown op " + op);
        }
    }

    private Map<String, Object> connect(Map<String, Object> c) {
        ClientOptions.Builder b = ClientOptions.builder();
        @SuppressWarnings("unchecked")
        List<String> eps = (List<String>) c.get("endpoints");
        b.endpoints(eps);
        if (c.get("token") != null) {
            b.token(str(c, "token"));
        }
        if (c.get("request_timeout_ms") != null) {
            b.requestTimeout(ms(c, "request_timeout_ms"));
        }
        if (c.get("heartbeat_ms") != null) {
            b.heartbeatInterval(ms(c, "heartbeat_ms"));
        }
        if (c.get("dial_timeout_ms") != null) {
            b.connectTimeout(ms(c, "dial_timeout_ms"));
        }
        @SuppressWarnings("unchecked")
        Map<String, Object> tls = (Map<String, Object>) c.get("tls");
        if (tls != null) {
            TlsOptions.Builder t = TlsOptions.builder();
            if (tls.get("ca") != null) {
                t.trustCertificates(Path.of((String) tls.get("ca")));
            }
            if (tls.get("cert") != null && tls.get("key") != null) {
                t.clientCertificate(Path.of((String) tls.get("cert")), Path.of((String) tls.get("key")));
            }
            if (tls.get("server_name") != null) {
                t.serverName((String) tls.get("server_name"));
            }
            b.tls(t.build());
        }
        TicketingClient cl = TicketingClient.connect(b.build());
        TicketingClient old = clients.put(str(c, "client"), cl);
        if (old != null) {
            old.close();
        }
        return Map.of("session_id", cl.sessionId());
    }

    private Map<String, Object> acquire(long id, Map<String, Object> c) throws Exception {
        Object wait = c.get("wait_ms");
        AcquireOptions.Builder o = AcquireOptions.builder(ms(c, "lease_ms"))
                .waitTimeout(wait == null ? AcquireOptions.WAIT_FOREVER : Duration.ofMillis(((Number) wait).longValue()))
                .keepAlive(Boolean.TRUE.equals(c.get("keepalive")))
                .refuseHeld(Boolean.TRUE.equals(c.get("refuse_held")));
        // The blocking call, cancelled by interrupting this thread: an interrupted acquire returns
        // once the server has withdrawn the wait (README "Cancellation"), which is what the scenarios
        // check right after the answer. A cancelled future would return before that.
        Interruptible call = new Interruptible(Thread.currentThread());
        pending.put(id, call::interrupt);
        Lock l;
        try {
            l = client(c).acquire(key(c), o.build());
        } finally {
            pending.remove(id);
            call.finish();
        }
        track(str(c, "lock"), l);
        return Map.of("token", Long.toUnsignedString(l.token()), "lease_ms", l.lease().toMillis());
    }

    /** A command thread that may be interrupted only while it runs the command. */
    private static final class Interruptible {
        private final Thread thread;
        private boolean finished;

        Interruptible(Thread thread) {
            this.thread = thread;
        }

        synchronized void interrupt() {
            if (!finished) {
                thread.interrupt();
            }
        }

        /** Ends the window and clears an interrupt that arrived in it, so the pool thread is clean. */
        synchronized void finish() {
            finished = true;
            Thread.interrupted();
        }
    }

    private <T> T await(long id, CompletableFuture<T> f) throws Exception {
        pending.put(id, () -> f.cancel(true));
        try {
            return f.get();
        } finally {
            pending.remove(id);
        }
    }

    private void track(String name, Lock l) {
        locks.put(name, l);
        l.onLost(r -> {
            Map<String, Object> m = new LinkedHashMap<>();
            m.put("event", "lost");
            m.put("lock", name);
            m.put("reason", reason(r));
            emit(m);
        });
    }

    private TicketingClient client(Map<String, Object> c) {
        TicketingClient cl = clients.get(str(c, "client"));
        if (cl == null) {
            throw new ClosedException("no client named " + c.get("client"));
        }
        return cl;
    }

    private Lock lock(Map<String, Object> c) {
        Lock l = locks.get(str(c, "lock"));
        if (l == null) {
            throw new IllegalArgumentException("no lock named " + c.get("lock"));
        }
        return l;
    }

    private static String str(Map<String, Object> c, String k) {
        Object v = c.get(k);
        return v == null ? null : v.toString();
    }

    private static Duration ms(Map<String, Object> c, String k) {
        Object v = c.get(k);
        if (!(v instanceof Number n)) {
            throw new InvalidArgumentException(k + " must be a number of milliseconds, got " + v);
        }
        return Duration.ofMillis(n.longValue());
    }

    /** The key as the client API takes it: a string, or bytes for {@code key_hex}. */
    private static byte[] keyBytes(Map<String, Object> c) {
        if (c.get("key_hex") != null) {
            return HexFormat.of().parseHex(str(c, "key_hex"));
        }
        String k = str(c, "key");
        return k == null ? null : k.getBytes(StandardCharsets.UTF_8);
    }

    private static byte[] key(Map<String, Object> c) {
        byte[] k = keyBytes(c);
        if (k == null) {
            throw new InvalidArgumentException("key must be a non-empty string, got null");
        }
        return k;
    }
}
