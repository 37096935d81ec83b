package io.ticketing.internal;

import io.ticketing.AcquireOptions;
import io.ticketing.Lock;
import io.ticketing.TicketingClient;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.Executor;

/**
 * Not part of the API (no compatibility promise, left out of the Javadoc): what the
 * {@code ticketing-kotlin} module needs from the client beyond its public API. Its suspend functions
 * resume the caller's coroutine through the coroutine's own dispatcher, so the hop the public
 * futures make to the client's callback threads (there so that dependent stages never run on the
 * I/O threads) is one thread switch per call for nothing: these futures complete in the thread
 * that handles the answer instead, and the Kotlin module only ever dispatches from there.
 */
public final class Bridge {
    /** The operations, implemented in {@code io.ticketing} (installed when its classes load). */
    public interface Ops {
        /**
         * As {@link TicketingClient#acquireAsync(String, AcquireOptions)}, the future completed in
         * the thread that handles the answer (an I/O thread): its dependents must not block.
         *
         * @param client the client
         * @param key the key
         * @param options the options
         * @return the lock's future
         */
        CompletableFuture<Lock> acquire(TicketingClient client, String key, AcquireOptions options);

        /**
         * As {@link TicketingClient#acquireAsync(byte[], AcquireOptions)}, completed as
         * {@link #acquire(TicketingClient, String, AcquireOptions)} is.
         *
         * @param client the client
         * @param key the key's bytes
         * @param options the options
         * @return the lock's future
         */
        CompletableFuture<Lock> acquire(TicketingClient client, byte[] key, AcquireOptions options);

        /**
         * As {@link Lock#releaseAsync()}, the future completed in the thread that handles the
         * answer (an I/O thread): its dependents must not block.
         *
         * @param lock the lock
         * @return the release's future
         */
        CompletableFuture<Void> release(Lock lock);

        /**
         * The client's callback threads (where the public futures complete), for a completion
         * that must not run on an I/O thread.
         *
         * @param client the client
         * @return its callback executor
         */
        Executor callbacks(TicketingClient client);

        /**
         * The callback threads of the client that granted {@code lock}.
         *
         * @param lock the lock
         * @return its client's callback executor
         */
        Executor callbacks(Lock lock);
    }

    private static volatile Ops ops;

    private Bridge() {
    }

    /**
     * Called once, by {@code io.ticketing} when its client class loads.
     *
     * @param o the implementation
     */
    public static void install(Ops o) {
        synchronized (Bridge.class) {
            if (ops != null) {
                throw new IllegalStateException("io.ticketing.internal.Bridge is installed already");
            }
            ops = o;
        }
    }

    /** {@return the operations} */
    public static Ops ops() {
        Ops o = ops;
        if (o == null) {
            try {
                // Loading the client class installs them.
                Class.forName("io.ticketing.TicketingClient", true, Bridge.class.getClassLoader());
            } catch (ClassNotFoundException e) {
                throw new IllegalStateException(e);
            }
            o = ops;
        }
        return o;
    }
}
