package io.ticketing;

import io.ticketing.protocol.Op;
import io.ticketing.protocol.RequestFrame;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.ScheduledFuture;

/**
 * One request and its life in the engine. Every mutable field is guarded by the engine's lock
 * ({@code Engine.mu}); {@link #answer} and {@link #settled} are completed outside it.
 */
final class Req {
    final Op op;
    final byte[] key;
    final long token;
    final long leaseMs;
    final long waitMs;
    final boolean internal;
    /**
     * About a lock granted by the server's current lock state (a lock handle's release, extend or
     * verify, the release of a raced grant): meaningless to a restarted server, so such a request
     * not yet sent when the state id changes fails (or, internal, is dropped) instead of going to
     * the new server.
     */
    boolean ofLock;

    /** Completes once: with the answer, or exceptionally when the request failed or was abandoned. */
    final CompletableFuture<io.ticketing.protocol.ResponseFrame> answer = new CompletableFuture<>();
    /** Completes when the server holds nothing more for this request (after any clean-up). */
    final CompletableFuture<Void> settled = new CompletableFuture<>();

    /** Its caller blocks on the answer in {@link Engine#await} (and reads for it): no nudge of the reader. */
    boolean awaited;
    long id; // 0 until the frame is queued for the wire
    long firstSent; // Engine.clock when first queued for the wire; a re-send never changes it
    long generation; // the engine's state generation when first sent
    ScheduledFuture<?> timer; // a timeout of its own (one that is not the request timeout from when it was set)
    // In the engine's list of request timeouts (Engine.armRequestTimeoutLocked), guarded by mu:
    long timeoutAt; // System.nanoTime() when it times out
    Req timeoutPrev;
    Req timeoutNext;
    boolean inTimeouts;
    boolean done; // answer completed (or about to be)
    boolean abandoned; // an ACQUIRE whose caller gave up: withdraw it, release any grant
    boolean cancelSent; // the CANCEL for an abandoned ACQUIRE is on its way
    boolean notRun; // answered NOT_LEADER: never run; send again after the reconnect

    Req(Op op, byte[] key, long token, long leaseMs, long waitMs, boolean internal) {
        this.op = op;
        this.key = key == null ? new byte[0] : key;
        this.token = token;
        this.leaseMs = leaseMs;
        this.waitMs = waitMs;
        this.internal = internal;
    }

    /** A request about a granted lock ({@link #ofLock}). */
    static Req ofLock(Op op, byte[] key, long token, long leaseMs, boolean internal) {
        Req r = new Req(op, key, token, leaseMs, 0, internal);
        r.ofLock = true;
        return r;
    }

    byte[] encode() {
        return new RequestFrame(op.code(), 0, id, token, leaseMs, waitMs, key).encode();
    }

    void cancelTimer() {
        if (timer != null) {
            timer.cancel(false);
            timer = null;
        }
    }
}
