package io.ticketing.bench

import io.ticketing.TicketingClient
import io.ticketing.kotlin.awaitRelease
import io.ticketing.kotlin.awaitTryAcquire
import kotlin.time.Duration.Companion.seconds
import kotlinx.coroutines.CoroutineScope
import kotlinx.coroutines.Dispatchers
import kotlinx.coroutines.SupervisorJob
import kotlinx.coroutines.joinAll
import kotlinx.coroutines.launch
import kotlinx.coroutines.runBlocking
import kotlinx.coroutines.withTimeoutOrNull

/** --api kotlin: N coroutines on Dispatchers.Default, each awaitTryAcquire then awaitRelease, in a loop. */
object KotlinBench {
    @JvmStatic
    fun start(client: TicketingClient, n: Int, c: Bench.Counters): Runnable {
        val scope = CoroutineScope(SupervisorJob() + Dispatchers.Default)
        val jobs = (0 until n).map { me ->
            val key = "bench-$me"
            scope.launch {
                while (c.running) {
                    try {
                        val lock = client.awaitTryAcquire(key, 10.seconds)
                        if (lock != null) {
                            lock.awaitRelease()
                            c.pair(me)
                        } else {
                            c.error(me)
                        }
                    } catch (e: io.ticketing.TicketingException) {
                        c.error(me)
                    }
                }
            }
        }
        return Runnable { runBlocking { withTimeoutOrNull(5_000) { jobs.joinAll() } } }
    }
}
