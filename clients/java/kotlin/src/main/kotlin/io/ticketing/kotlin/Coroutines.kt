/*
 * Kotlin coroutines for the Ticketing Java client: suspend functions over its CompletableFuture API,
 * and withLock, a scoped lock whose block is cancelled when the lock is lost.
 */
@file:JvmName("TicketingCoroutines")

package io.ticketing.kotlin

import io.ticketing.AcquireOptions
import io.ticketing.ClientOptions
import io.ticketing.Lock
import io.ticketing.LockInfo
import io.ticketing.LockLostException
import io.ticketing.LostReason
import io.ticketing.TicketingClient
import io.ticketing.internal.Bridge
import java.util.concurrent.CompletableFuture
import java.util.concurrent.CompletionException
import java.util.concurrent.CompletionStage
import java.util.concurrent.ExecutionException
import java.util.concurrent.Executor
import kotlin.coroutines.ContinuationInterceptor
import kotlin.coroutines.resume
import kotlin.coroutines.resumeWithException
import kotlin.time.Duration
import kotlin.time.Duration.Companion.milliseconds
import kotlin.time.Duration.Companion.nanoseconds
import kotlin.time.toJavaDuration
import kotlinx.coroutines.CancellableContinuation
import kotlinx.coroutines.CancellationException
import kotlinx.coroutines.CoroutineDispatcher
import kotlinx.coroutines.CoroutineScope
import kotlinx.coroutines.NonCancellable
import kotlinx.coroutines.cancel
import kotlinx.coroutines.coroutineScope
import kotlinx.coroutines.currentCoroutineContext
import kotlinx.coroutines.ensureActive
import kotlinx.coroutines.launch
import kotlinx.coroutines.suspendCancellableCoroutine
import kotlinx.coroutines.withContext

/**
 * Connects without blocking the calling thread; see [TicketingClient.connect]. Cancelling the
 * coroutine stops a connect that waits for a cluster to elect a leader; no client is left open.
 *
 * @param options the client's settings (default: `127.0.0.1:7070`, no token, no TLS)
 * @return the connected client
 */
suspend fun connectTicketing(options: ClientOptions = ClientOptions.create()): TicketingClient {
    val f = TicketingClient.connectAsync(options)
    try {
        return f.awaitResult()
    } catch (e: CancellationException) {
        // The coroutine was cancelled (a connect may wait out a cluster's election): stop the
        // connect, which closes a client that connects anyway, or close the one that came too late.
        if (!f.cancel(false)) {
            runCatching { f.getNow(null) }.getOrNull()?.close()
        }
        throw e
    }
}

/**
 * Acquires the lock on [key], suspending while it waits in the key's FIFO queue.
 *
 * Cancelling the coroutine withdraws the wait from the server (the rule `Mutex.lock` follows):
 * the acquire throws [CancellationException] and a grant that raced the cancellation is released,
 * so a cancelled acquire never leaves a lock held.
 *
 * @param key a non-empty key of at most 65,535 UTF-8 bytes
 * @param lease how long the lock is held unless released or extended (at least 1 ms)
 * @param waitTimeout how long to wait in the queue: [Duration.ZERO] tries once, [Duration.INFINITE] (the default) waits without limit
 * @param keepAlive extend the lock by its lease every lease/3 until it is released or lost
 * @param maxHold stop the keep-alive this long after the grant (null: no cap)
 * @param refuseHeld fail at once with [io.ticketing.AlreadyHeldException] when this client holds [key]
 * @return the held lock
 * @throws io.ticketing.NotAcquiredException when the wait timeout passed
 */
suspend fun TicketingClient.awaitAcquire(
    key: String,
    lease: Duration,
    waitTimeout: Duration = Duration.INFINITE,
    keepAlive: Boolean = false,
    maxHold: Duration? = null,
    refuseHeld: Boolean = false,
): Lock = acquireCancellably(bridge.acquire(this, key, options(lease, waitTimeout, keepAlive, maxHold, refuseHeld, true)))

/**
 * Acquires the lock on a binary [key]; see [awaitAcquire].
 */
suspend fun TicketingClient.awaitAcquire(
    key: ByteArray,
    lease: Duration,
    waitTimeout: Duration = Duration.INFINITE,
    keepAlive: Boolean = false,
    maxHold: Duration? = null,
    refuseHeld: Boolean = false,
): Lock = acquireCancellably(bridge.acquire(this, key, options(lease, waitTimeout, keepAlive, maxHold, refuseHeld, true)))

/**
 * Tries to acquire the lock on [key] within [waitTimeout] (default: a single try): `null` when it
 * is not acquired. Cancellation withdraws the wait, as for [awaitAcquire].
 *
 * @return the held lock, or null
 */
suspend fun TicketingClient.awaitTryAcquire(
    key: String,
    lease: Duration,
    waitTimeout: Duration = Duration.ZERO,
    keepAlive: Boolean = false,
    maxHold: Duration? = null,
): Lock? = try {
    awaitAcquire(key, lease, waitTimeout, keepAlive, maxHold)
} catch (e: io.ticketing.NotAcquiredException) {
    null
}

/**
 * Runs [block] while holding the lock on [key], then releases it, even when the block fails or is
 * cancelled.
 *
 * When the lock is lost while the block runs (expired, released by another token, server
 * restarted or stopping), the block is cancelled at once and `withLock` throws
 * [LockLostException] naming the reason, after telling the server. Pass `throwOnLost = false` to
 * let the block run to its end instead (check [Lock.isLost] yourself): the one opt-out.
 *
 * ```
 * client.withLock("daily-batch", lease = 30.seconds, keepAlive = true) { lock ->
 *     runBatch(fencingToken = lock.token())
 * }
 * ```
 *
 * @return the block's result
 * @throws LockLostException when the lock was lost during the block
 */
suspend fun <T> TicketingClient.withLock(
    key: String,
    lease: Duration,
    waitTimeout: Duration = Duration.INFINITE,
    keepAlive: Boolean = false,
    maxHold: Duration? = null,
    throwOnLost: Boolean = true,
    block: suspend CoroutineScope.(Lock) -> T,
): T {
    val lock = acquireCancellably(bridge.acquire(this, key, options(lease, waitTimeout, keepAlive, maxHold, false, throwOnLost)))
    val outcome: Result<T> = try {
        Result.success(
            coroutineScope {
                val watcher = if (throwOnLost) {
                    launch {
                        val reason = lock.awaitLost()
                        this@coroutineScope.cancel(LockLostCancellation(reason))
                    }
                } else {
                    null
                }
                try {
                    block(lock)
                } finally {
                    watcher?.cancel()
                }
            },
        )
    } catch (e: Throwable) {
        Result.failure(e)
    }
    val releaseError: Throwable? = withContext(NonCancellable) {
        try {
            lock.awaitRelease()
            null
        } catch (t: Throwable) {
            t
        }
    }
    val lost = lock.lostReason().orElse(null)
    if (lost != null && throwOnLost) {
        currentCoroutineContext().ensureActive() // the caller's own cancellation wins
        val e = LockLostException("${lock.describeForKotlin()} was lost while withLock ran: $lost", lost)
        outcome.exceptionOrNull()?.takeIf { it !is CancellationException }?.let(e::addSuppressed)
        throw e
    }
    val value = outcome.getOrThrow()
    if (releaseError != null && releaseError !is LockLostException) {
        throw releaseError
    }
    return value
}

/** The cancellation cause [withLock] gives its block when the lock is lost. */
class LockLostCancellation(
    /** Why the lock was lost. */
    val reason: LostReason,
) : CancellationException("lock lost: $reason")

/** Releases the lock, suspending until the server answered; see [Lock.release]. */
suspend fun Lock.awaitRelease() {
    bridge.release(this).awaitFromIo(this)
}

/**
 * Sets the lease to [lease] from now; see [Lock.extend].
 *
 * @return the lease the server granted
 */
suspend fun Lock.awaitExtend(lease: Duration): Duration =
    extendAsync(lease.toJavaLease()).awaitResult().toKotlinMillis()

/** Asks the server whether this lock still holds its key; see [Lock.verify]. */
suspend fun Lock.awaitVerify(): Boolean = verifyAsync().awaitResult()

/** Suspends until the lock is lost and returns why; never returns for a lock released first. */
suspend fun Lock.awaitLost(): LostReason = lost().awaitStage()

/** Releases the lock on [key] held by [token], from any session; see [TicketingClient.release]. */
suspend fun TicketingClient.awaitRelease(key: String, token: Long) {
    releaseAsync(key, token).awaitResult()
}

/** Asks the server about [key] (and whether [token] holds it); see [TicketingClient.inspect]. */
suspend fun TicketingClient.awaitInspect(key: String, token: Long = 0): LockInfo = inspectAsync(key, token).awaitResult()

/** Pings the server; returns the round-trip time. */
suspend fun TicketingClient.awaitPing(): Duration = pingAsync().awaitResult().toNanos().nanoseconds

private fun Lock.describeForKotlin(): String = "lock on ${key()} (token ${java.lang.Long.toUnsignedString(token())})"

private fun options(
    lease: Duration,
    waitTimeout: Duration,
    keepAlive: Boolean,
    maxHold: Duration?,
    refuseHeld: Boolean,
    throwOnLost: Boolean,
): AcquireOptions = AcquireOptions.builder(lease.toJavaLease())
    .waitTimeout(if (waitTimeout.isInfinite() && waitTimeout.isPositive()) AcquireOptions.WAIT_FOREVER else waitTimeout.toJavaLease())
    .keepAlive(keepAlive)
    .maxHold(maxHold?.toJavaLease())
    .refuseHeld(refuseHeld)
    .throwOnLost(throwOnLost)
    .build()

/** Converts for the core's own checks (which reject negative or out-of-range values with a clear message). */
private fun Duration.toJavaLease(): java.time.Duration = when {
    isInfinite() && isPositive() -> java.time.Duration.ofMillis(Long.MAX_VALUE)
    isInfinite() -> java.time.Duration.ofMillis(Long.MIN_VALUE)
    else -> toJavaDuration()
}

private fun java.time.Duration.toKotlinMillis(): Duration = toMillis().milliseconds

private fun unwrap(t: Throwable): Throwable {
    var e = t
    while ((e is CompletionException || e is ExecutionException) && e.cause != null) {
        e = e.cause!!
    }
    return e
}

/**
 * The client's futures that complete in the thread handling the answer (one of the client's I/O
 * threads): a coroutine awaiting one is resumed from there through its own dispatcher, one thread
 * hand-off per call instead of two (I/O thread -> callback thread -> dispatcher). See [resumeOffIo].
 */
private val bridge: Bridge.Ops = Bridge.ops()

/**
 * Resumes [this] continuation from a thread that may be one of the client's I/O threads. When the
 * coroutine's dispatcher dispatches from here, the I/O thread only hands the resumption to it (the
 * user's code runs on the user's dispatcher); when it would not (no dispatcher,
 * `Dispatchers.Unconfined`, a dispatcher that runs in place), the resumption goes through the
 * client's callback threads first, as the public futures do, so no user code ever runs on an I/O
 * thread.
 */
private inline fun CancellableContinuation<*>.resumeOffIo(callbacks: () -> Executor, crossinline resume: () -> Unit) {
    val dispatcher = context[ContinuationInterceptor] as? CoroutineDispatcher
    if (dispatcher != null && dispatcher.isDispatchNeeded(context)) {
        resume()
    } else {
        callbacks().execute { resume() }
    }
}

/**
 * Awaits an acquire's future from [bridge]; cancelling the coroutine cancels the future (a
 * withdrawal), and a lock that arrives too late is released.
 */
private suspend fun TicketingClient.acquireCancellably(f: CompletableFuture<Lock>): Lock = suspendCancellableCoroutine { cont ->
    val resume = { lock: Lock?, err: Throwable? ->
        if (err == null) {
            cont.resume(lock!!) { _, l, _ -> l.releaseAsync() }
        } else {
            cont.resumeWithException(unwrap(err))
        }
    }
    if (f.isDone) {
        // Failed at once (an invalid argument, a closed client): resumed in this thread.
        f.whenComplete { lock, err -> resume(lock, err) }
    } else {
        cont.invokeOnCancellation { f.cancel(false) }
        f.whenComplete { lock, err -> cont.resumeOffIo({ bridge.callbacks(this) }) { resume(lock, err) } }
    }
}

/** Awaits a future from [bridge] about [lock] without cancelling it when the coroutine is cancelled. */
private suspend fun <T> CompletableFuture<T>.awaitFromIo(lock: Lock): T = suspendCancellableCoroutine { cont ->
    val resume = { v: T, err: Throwable? ->
        if (err == null) cont.resume(v) else cont.resumeWithException(unwrap(err))
    }
    if (isDone) {
        // Done at once (a lock already known lost, or released): resumed in this thread.
        whenComplete { v, err -> resume(v, err) }
    } else {
        whenComplete { v, err -> cont.resumeOffIo({ bridge.callbacks(lock) }) { resume(v, err) } }
    }
}

/** Awaits a future without cancelling it when the coroutine is cancelled (the request still completes). */
private suspend fun <T> CompletableFuture<T>.awaitResult(): T = awaitStage()

private suspend fun <T> CompletionStage<T>.awaitStage(): T = suspendCancellableCoroutine { cont ->
    whenComplete { v, err ->
        if (err == null) cont.resume(v) else cont.resumeWithException(unwrap(err))
    }
}
