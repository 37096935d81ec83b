package io.ticketing.kotlin

import io.ticketing.ClientOptions
import io.ticketing.InvalidArgumentException
import io.ticketing.LockLostException
import io.ticketing.LostReason
import io.ticketing.NotAcquiredException
import io.ticketing.TicketingClient
import java.io.DataInputStream
import java.net.InetAddress
import java.net.ServerSocket
import java.util.concurrent.Executors
import java.util.concurrent.atomic.AtomicInteger
import kotlin.time.Duration
import kotlin.time.Duration.Companion.milliseconds
import kotlin.time.Duration.Companion.seconds
import kotlin.time.TimeSource
import kotlinx.coroutines.CancellationException
import kotlinx.coroutines.CompletableDeferred
import kotlinx.coroutines.Dispatchers
import kotlinx.coroutines.TimeoutCancellationException
import kotlinx.coroutines.asCoroutineDispatcher
import kotlinx.coroutines.async
import kotlinx.coroutines.awaitAll
import kotlinx.coroutines.cancelAndJoin
import kotlinx.coroutines.delay
import kotlinx.coroutines.launch
import kotlinx.coroutines.runBlocking
import kotlinx.coroutines.withContext
import kotlinx.coroutines.withTimeout
import org.junit.jupiter.api.AfterAll
import org.junit.jupiter.api.Assertions.assertEquals
import org.junit.jupiter.api.Assertions.assertFalse
import org.junit.jupiter.api.Assertions.assertNull
import org.junit.jupiter.api.Assertions.assertTrue
import org.junit.jupiter.api.BeforeAll
import org.junit.jupiter.api.Test
import org.junit.jupiter.api.TestInstance
import org.junit.jupiter.api.Timeout
import org.junit.jupiter.api.assertThrows

@Timeout(60)
@TestInstance(TestInstance.Lifecycle.PER_CLASS)
class CoroutinesTest {
    private lateinit var server: TestServer
    private lateinit var client: TicketingClient
    private lateinit var observer: TicketingClient

    @BeforeAll
    fun start() = runBlocking {
        server = TestServer.start()
        client = connectTicketing(ClientOptions.builder().endpoints(server.endpoint).build())
        observer = connectTicketing(ClientOptions.builder().endpoints(server.endpoint).build())
    }

    @AfterAll
    fun stop() {
        client.close()
        observer.close()
        server.close()
    }

    /**
     * A connect to a cluster that is electing a leader keeps trying (docs/clients.md, rule 1);
     * cancelling the coroutine stops it: no more connection attempts afterwards.
     */
    @Test
    fun cancellingAConnectDuringAnElectionStopsIt() = runBlocking {
        val attempts = AtomicInteger()
        ServerSocket(0, 50, InetAddress.getLoopbackAddress()).use { ss ->
            val acceptor = Thread {
                while (!ss.isClosed) {
                    val s = runCatching { ss.accept() }.getOrNull() ?: break
                    attempts.incrementAndGet()
                    s.use {
                        // HELLO (56 bytes), then CHALLENGE NOT_LEADER (status 4) with no hint.
                        runCatching {
                            DataInputStream(it.getInputStream()).readFully(ByteArray(56))
                            val challenge = ByteArray(48)
                            challenge[3] = 44
                            challenge[4] = 0x02
                            challenge[5] = 4
                            challenge[6] = 1
                            it.getOutputStream().write(challenge)
                        }
                    }
                }
            }.apply { isDaemon = true; start() }
            val options = ClientOptions.builder().endpoints("127.0.0.1:${ss.localPort}")
                .requestTimeout(java.time.Duration.ofSeconds(30)).build()
            assertThrows<TimeoutCancellationException> {
                withTimeout(600.milliseconds) { connectTicketing(options) }
            }
            val tried = attempts.get()
            assertTrue(tried >= 2, "the connect tried $tried time(s) during the election; want it to keep trying")
            delay(500)
            assertTrue(attempts.get() <= tried + 1, "the connect went on after the cancellation: ${attempts.get()} attempts, $tried at the cancellation")
            ss.close()
            acceptor.join(2000)
        }
    }

    private suspend fun waiters(key: String, n: Long) {
        withTimeout(5.seconds) {
            while (observer.awaitInspect(key).waiters() != n) {
                delay(5)
            }
        }
    }

    @Test
    fun `withLock runs the block and releases`() = runBlocking {
        val token = client.withLock("kt-basic", lease = 5.seconds) { lock ->
            assertTrue(observer.awaitInspect("kt-basic").held())
            assertTrue(lock.awaitVerify())
            lock.token()
        }
        assertTrue(token > 0)
        assertFalse(observer.awaitInspect("kt-basic").held())
    }

    @Test
    fun `withLock cancels the block when the lock is lost and reports it`() = runBlocking {
        val start = TimeSource.Monotonic.markNow()
        val cancelledAt = CompletableDeferred<Duration>()
        val e = assertThrows<LockLostException> {
            client.withLock("kt-lost", lease = 300.milliseconds) {
                try {
                    delay(900)
                } catch (c: CancellationException) {
                    cancelledAt.complete(start.elapsedNow())
                    throw c
                }
            }
        }
        assertEquals(LostReason.EXPIRED, e.reason())
        val at = cancelledAt.await()
        assertTrue(at < 800.milliseconds, "block cancelled at $at, when the lock was lost")
        // The release of a lost lock answers at once and tells the server in the background.
        withTimeout(5.seconds) {
            while (observer.awaitInspect("kt-lost").held()) {
                delay(5)
            }
        }
    }

    @Test
    fun `withLock with throwOnLost false lets the block finish`() = runBlocking {
        val result = client.withLock("kt-quiet", lease = 100.milliseconds, throwOnLost = false) { lock ->
            delay(300)
            lock.isLost
        }
        assertTrue(result)
    }

    @Test
    fun `cancelling the coroutine withdraws the wait`() = runBlocking {
        val held = observer.awaitAcquire("kt-cancel", 10.seconds)
        val job = launch(Dispatchers.Default) { client.awaitAcquire("kt-cancel", 10.seconds) }
        waiters("kt-cancel", 1)
        job.cancelAndJoin()
        waiters("kt-cancel", 0)
        held.awaitRelease()
        delay(100)
        assertFalse(observer.awaitInspect("kt-cancel").held(), "nobody was granted")
    }

    @Test
    fun `withTimeout around an acquire withdraws it`() = runBlocking {
        val held = observer.awaitAcquire("kt-timeout", 10.seconds)
        assertThrows<TimeoutCancellationException> {
            withTimeout(200.milliseconds) { client.awaitAcquire("kt-timeout", 10.seconds) }
        }
        waiters("kt-timeout", 0)
        held.awaitRelease()
    }

    @Test
    fun `try acquire returns null and wait timeouts raise`() = runBlocking {
        val held = observer.awaitAcquire("kt-try", 10.seconds)
        assertNull(client.awaitTryAcquire("kt-try", 1.seconds))
        assertThrows<NotAcquiredException> { client.awaitAcquire("kt-try", 1.seconds, waitTimeout = 100.milliseconds) }
        assertThrows<InvalidArgumentException> { client.awaitAcquire("kt-try", (-5).milliseconds) }
        assertThrows<InvalidArgumentException> { client.awaitAcquire("", 1.seconds) }
        held.awaitRelease()
        val lock = client.awaitTryAcquire("kt-try", 1.seconds)
        assertTrue(lock != null && lock.token() > held.token())
        lock!!.awaitRelease()
    }

    @Test
    fun `many coroutines on one client exclude each other`() = runBlocking(Dispatchers.Default) {
        val inside = AtomicInteger()
        val overlaps = AtomicInteger()
        (0 until 200).map { i ->
            async {
                client.withLock("kt-many-${i % 4}", lease = 10.seconds) {
                    if (i % 4 == 0 && inside.incrementAndGet() != 1) overlaps.incrementAndGet()
                    delay(1)
                    if (i % 4 == 0) inside.decrementAndGet()
                }
            }
        }.awaitAll()
        assertEquals(0, overlaps.get())
        assertFalse(observer.awaitInspect("kt-many-0").held())
    }

    /**
     * The client hands each answer to the coroutine's own dispatcher from the thread that read it:
     * the coroutine resumes on its dispatcher's thread after every call, never on a client thread.
     */
    @Test
    fun `a coroutine resumes on its own dispatcher`() {
        val pool = Executors.newSingleThreadExecutor { r -> Thread(r, "kt-own-dispatcher") }
        val held = runBlocking { observer.awaitAcquire("kt-own-held", 10.seconds) }
        try {
            runBlocking(pool.asCoroutineDispatcher()) {
                repeat(50) {
                    val lock = client.awaitAcquire("kt-own", 10.seconds)
                    assertTrue(Thread.currentThread().name.startsWith("kt-own-dispatcher"), Thread.currentThread().name)
                    lock.awaitRelease()
                    assertTrue(Thread.currentThread().name.startsWith("kt-own-dispatcher"), Thread.currentThread().name)
                    assertNull(client.awaitTryAcquire("kt-own-held", 10.seconds))
                    assertTrue(Thread.currentThread().name.startsWith("kt-own-dispatcher"), Thread.currentThread().name)
                }
            }
        } finally {
            runBlocking { held.awaitRelease() }
            pool.shutdown()
        }
    }

    /**
     * A coroutine whose dispatcher does not dispatch (Unconfined runs it wherever it is resumed)
     * resumes on the client's callback threads, as the public futures complete (or goes on in its
     * own thread when the answer came before it suspended): never on the thread that read the
     * answer (the reader, or another caller reading for everyone).
     */
    @Test
    fun `an unconfined coroutine never resumes on a client io thread`() = runBlocking {
        val caller = Thread.currentThread()
        fun assertOnCallbackThread() {
            val me = Thread.currentThread()
            assertTrue(me == caller || me.name.startsWith("ticketing-callback-"), "resumed on ${me.name}")
        }
        val held = observer.awaitAcquire("kt-unconfined-held", 10.seconds)
        try {
            withContext(Dispatchers.Unconfined) {
                repeat(50) {
                    val lock = client.awaitAcquire("kt-unconfined", 10.seconds)
                    assertOnCallbackThread()
                    lock.awaitRelease()
                    assertOnCallbackThread()
                    assertNull(client.awaitTryAcquire("kt-unconfined-held", 10.seconds))
                    assertOnCallbackThread()
                    client.withLock("kt-unconfined", 10.seconds) { assertOnCallbackThread() }
                    assertOnCallbackThread()
                }
            }
        } finally {
            held.awaitRelease()
        }
    }

    @Test
    fun `lost and extend suspend`() = runBlocking {
        val lock = client.awaitAcquire("kt-extend", 300.milliseconds)
        assertEquals(2.seconds, lock.awaitExtend(2.seconds))
        delay(500)
        assertFalse(lock.isLost)
        observer.awaitRelease("kt-extend", lock.token())
        assertThrows<LockLostException> { lock.awaitRelease() }
        assertEquals(LostReason.NOT_HELD, lock.awaitLost())
        assertTrue(client.awaitPing() >= Duration.ZERO)
    }
}
