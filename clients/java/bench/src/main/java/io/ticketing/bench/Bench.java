package io.ticketing.bench;

import io.ticketing.ClientOptions;
import io.ticketing.Lock;
import io.ticketing.TicketingClient;
import java.time.Duration;
import java.util.Locale;
import java.util.Optional;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.atomic.AtomicLongArray;

/**
 * The Java client's benchmark program (the bench harness's program contract): one client object, N
 * concurrent callers, each acquiring its own key ({@code bench-<caller>}, try-once, lease 10 s) and
 * releasing it, in a loop. 1 s of warm-up, then S seconds counted; one JSON line at the end.
 *
 * <pre>
 * --api threads   N platform threads calling the blocking API (tryAcquire, release)
 * --api async     N CompletableFuture chains (tryAcquireAsync, then releaseAsync, then the next)
 * --api kotlin    N coroutines on the Kotlin API (awaitTryAcquire, awaitRelease), see KotlinBench.kt
 * </pre>
 */
public final class Bench {
    static final Duration LEASE = Duration.ofSeconds(10);
    /** Slots 16 longs apart: each caller's counters on its own cache line. */
    static final int STRIDE = 16;

    private Bench() {
    }

    /** The counters every runner updates: pairs at [i*STRIDE], errors at [i*STRIDE+1]. */
    public static final class Counters {
        final AtomicLongArray a;
        final int n;
        public volatile boolean running = true;

        public Counters(int n) {
            this.n = n;
            this.a = new AtomicLongArray(n * STRIDE);
        }

        public void pair(int i) {
            a.lazySet(i * STRIDE, a.get(i * STRIDE) + 1);
        }

        public void error(int i) {
            a.lazySet(i * STRIDE + 1, a.get(i * STRIDE + 1) + 1);
        }

        long sum(int off) {
            long s = 0;
            for (int i = 0; i < n; i++) {
                s += a.get(i * STRIDE + off);
            }
            return s;
        }
    }

    public static void main(String[] args) throws Exception {
        String addr = null;
        String api = "threads";
        int callers = 1;
        double seconds = 5;
        double warmup = 1;
        for (int i = 0; i < args.length; i++) {
            switch (args[i]) {
                case "--addr" -> addr = args[++i];
                case "--callers" -> callers = Integer.parseInt(args[++i]);
                case "--seconds" -> seconds = Double.parseDouble(args[++i]);
                case "--api" -> api = args[++i];
                case "--warmup" -> warmup = Double.parseDouble(args[++i]); // not in the contract: for studies
                default -> {
                    System.err.println("bench: unknown argument " + args[i]);
                    System.exit(2);
                }
            }
        }
        if (addr == null || callers < 1 || seconds <= 0) {
            System.err.println("usage: bench --addr HOST:PORT --callers N --seconds S [--api threads|async|kotlin]");
            System.exit(2);
        }
        ClientOptions opts = ClientOptions.builder().endpoints(addr).build();
        Counters c = new Counters(callers);
        long pairs;
        long errors;
        double elapsed;
        try (TicketingClient client = TicketingClient.connect(opts)) {
            Runnable stop;
            switch (api) {
                case "threads" -> stop = threads(client, callers, c);
                case "async" -> stop = async(client, callers, c);
                case "kotlin" -> stop = kotlin(client, callers, c);
                default -> {
                    System.err.println("bench: unknown --api " + api + " (threads, async, kotlin)");
                    System.exit(2);
                    return;
                }
            }
            Thread.sleep((long) (warmup * 1000));
            long p0 = c.sum(0);
            long e0 = c.sum(1);
            long t0 = System.nanoTime();
            long cpu0 = cpuNanos();
            Thread.sleep((long) (seconds * 1000));
            long p1 = c.sum(0);
            long e1 = c.sum(1);
            long t1 = System.nanoTime();
            long cpu1 = cpuNanos();
            if (System.getenv("BENCH_CPU") != null) { // for studies: the JVM's CPU per pair while counted
                System.err.println(String.format(Locale.ROOT, "cpu_us_per_pair %.2f",
                        (cpu1 - cpu0) / 1e3 / Math.max(1, p1 - p0)));
            }
            c.running = false;
            stop.run();
            pairs = p1 - p0;
            errors = e1 - e0;
            elapsed = (t1 - t0) / 1e9;
        }
        System.out.println(String.format(Locale.ROOT, "{\"pairs_per_sec\": %.1f, \"errors\": %d}", pairs / elapsed, errors));
        System.out.flush();
        System.exit(errors * 100 > pairs + errors ? 1 : 0);
    }

    private static long cpuNanos() {
        java.lang.management.OperatingSystemMXBean os = java.lang.management.ManagementFactory.getOperatingSystemMXBean();
        return os instanceof com.sun.management.OperatingSystemMXBean s ? s.getProcessCpuTime() : 0;
    }

    /** N platform threads on the blocking API. */
    static Runnable threads(TicketingClient client, int n, Counters c) {
        Thread[] ts = new Thread[n];
        for (int i = 0; i < n; i++) {
            int me = i;
            String key = "bench-" + i;
            ts[i] = new Thread(() -> {
                while (c.running) {
                    try {
                        Optional<Lock> l = client.tryAcquire(key, LEASE);
                        if (l.isPresent()) {
                            l.get().release();
                            c.pair(me);
                        } else {
                            c.error(me);
                        }
                    } catch (RuntimeException e) {
                        c.error(me);
                    }
                }
            }, "bench-" + i);
            ts[i].setDaemon(true);
            ts[i].start();
        }
        return () -> {
            for (Thread t : ts) {
                try {
                    t.join(5000);
                } catch (InterruptedException e) {
                    Thread.currentThread().interrupt();
                }
            }
        };
    }

    /** N CompletableFuture chains: tryAcquireAsync, then releaseAsync, then the next pair. */
    static Runnable async(TicketingClient client, int n, Counters c) {
        CompletableFuture<?>[] done = new CompletableFuture<?>[n];
        for (int i = 0; i < n; i++) {
            CompletableFuture<Void> d = new CompletableFuture<>();
            done[i] = d;
            chain(client, "bench-" + i, i, c, d);
        }
        return () -> {
            try {
                CompletableFuture.allOf(done).get(5, java.util.concurrent.TimeUnit.SECONDS);
            } catch (Exception ignored) {
                // a chain stuck on a request: its timeout ends it; the figures are taken already
            }
        };
    }

    private static void chain(TicketingClient client, String key, int me, Counters c, CompletableFuture<Void> done) {
        if (!c.running) {
            done.complete(null);
            return;
        }
        client.tryAcquireAsync(key, LEASE)
                .thenCompose(l -> l.isPresent()
                        ? l.get().releaseAsync().thenApply(v -> Boolean.TRUE)
                        : CompletableFuture.completedFuture(Boolean.FALSE))
                .whenComplete((ok, e) -> {
                    if (e == null && ok) {
                        c.pair(me);
                    } else {
                        c.error(me);
                    }
                    chain(client, key, me, c, done);
                });
    }

    /** N coroutines, in KotlinBench.kt (found by reflection: javac never needs the Kotlin classes). */
    static Runnable kotlin(TicketingClient client, int n, Counters c) throws ReflectiveOperationException {
        Class<?> k = Class.forName("io.ticketing.bench.KotlinBench");
        Object stop = k.getMethod("start", TicketingClient.class, int.class, Counters.class).invoke(null, client, n, c);
        return (Runnable) stop;
    }
}
