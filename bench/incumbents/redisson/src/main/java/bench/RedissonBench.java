package bench;

import java.util.Locale;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicLongArray;
import org.redisson.Redisson;
import org.redisson.api.RLock;
import org.redisson.api.RedissonClient;
import org.redisson.config.Config;

/**
 * The bench harness's incumbent for Java: Redisson's RLock, as its docs show it, against Redis.
 * One RedissonClient (its default connection pool), N platform threads, each with its own RLock on
 * its own key ("bench-<caller>"): tryLock(0, 10, SECONDS) (try once, lease 10 s), then unlock(), in
 * a loop. 1 s of warm-up, then S seconds counted; one JSON line at the end.
 */
public final class RedissonBench {
    private static final int STRIDE = 16;

    private RedissonBench() {
    }

    public static void main(String[] args) throws Exception {
        String addr = null;
        int callers = 1;
        double seconds = 5;
        double warmup = 1;
        for (int i = 0; i < args.length; i++) {
            switch (args[i]) {
                case "--addr" -> addr = args[++i];
                case "--callers" -> callers = Integer.parseInt(args[++i]);
                case "--seconds" -> seconds = Double.parseDouble(args[++i]);
                case "--warmup" -> warmup = Double.parseDouble(args[++i]); // not in the contract: for studies
                case "--api" -> i++; // one API here (threads)
                default -> {
                    System.err.println("redisson-bench: unknown argument " + args[i]);
                    System.exit(2);
                }
            }
        }
        if (addr == null || callers < 1 || seconds <= 0) {
            System.err.println("usage: redisson-bench --addr HOST:PORT --callers N --seconds S");
            System.exit(2);
        }
        Config config = new Config();
        config.useSingleServer().setAddress("redis://" + addr);
        RedissonClient redisson = Redisson.create(config);
        AtomicLongArray counts = new AtomicLongArray(callers * STRIDE);
        int n = callers;
        java.util.concurrent.atomic.AtomicBoolean running = new java.util.concurrent.atomic.AtomicBoolean(true);
        Thread[] ts = new Thread[n];
        for (int i = 0; i < n; i++) {
            int me = i;
            RLock lock = redisson.getLock("bench-" + i);
            ts[i] = new Thread(() -> {
                while (running.get()) {
                    try {
                        if (lock.tryLock(0, 10, TimeUnit.SECONDS)) {
                            lock.unlock();
                            counts.lazySet(me * STRIDE, counts.get(me * STRIDE) + 1);
                        } else {
                            counts.lazySet(me * STRIDE + 1, counts.get(me * STRIDE + 1) + 1);
                        }
                    } catch (InterruptedException e) {
                        return;
                    } catch (RuntimeException e) {
                        counts.lazySet(me * STRIDE + 1, counts.get(me * STRIDE + 1) + 1);
                    }
                }
            }, "bench-" + i);
            ts[i].setDaemon(true);
            ts[i].start();
        }
        Thread.sleep((long) (warmup * 1000));
        long p0 = sum(counts, n, 0);
        long e0 = sum(counts, n, 1);
        long t0 = System.nanoTime();
        Thread.sleep((long) (seconds * 1000));
        long p1 = sum(counts, n, 0);
        long e1 = sum(counts, n, 1);
        long t1 = System.nanoTime();
        running.set(false);
        for (Thread t : ts) {
            t.join(5000);
        }
        redisson.shutdown();
        long pairs = p1 - p0;
        long errors = e1 - e0;
        System.out.println(String.format(Locale.ROOT, "{\"pairs_per_sec\": %.1f, \"errors\": %d}",
                pairs / ((t1 - t0) / 1e9), errors));
        System.out.flush();
        System.exit(errors * 100 > pairs + errors ? 1 : 0);
    }

    private static long sum(AtomicLongArray a, int n, int off) {
        long s = 0;
        for (int i = 0; i < n; i++) {
            s += a.get(i * STRIDE + off);
        }
        return s;
    }
}
