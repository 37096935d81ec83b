package io.ticketing.kotlin

import java.nio.file.Files
import java.nio.file.Path
import java.util.concurrent.CompletableFuture
import java.util.concurrent.TimeUnit

/** The real server binary on 127.0.0.1 with a free port ($TICKETING_BIN, else built from the repository). */
class TestServer private constructor(private val process: Process, val endpoint: String, private val dataDir: Path) :
    AutoCloseable {
    companion object {
        private var built: Path? = null

        @Synchronized
        private fun binary(): Path {
            System.getenv("TICKETING_BIN")?.takeIf { it.isNotEmpty() }?.let { return Path.of(it) }
            built?.let { return it }
            val root = Path.of(System.getProperty("ticketing.repoRoot", "../../..")).toAbsolutePath().normalize()
            val out = Files.createTempDirectory("ticketing-kotlin-bin").resolve("ticketing")
            val p = ProcessBuilder("go", "build", "-o", out.toString(), "./cmd/ticketing").directory(root.toFile())
                .inheritIO().start()
            check(p.waitFor(300, TimeUnit.SECONDS) && p.exitValue() == 0) { "go build ./cmd/ticketing failed" }
            built = out
            return out
        }

        fun start(): TestServer {
            val dataDir = Files.createTempDirectory("ticketing-kotlin-data")
            val pb = ProcessBuilder(binary().toString(), "server")
            pb.environment()["TICKETING_ADDR"] = "127.0.0.1:0"
            pb.environment()["TICKETING_DATA_DIR"] = dataDir.toString()
            pb.environment()["TICKETING_STARTUP_GRACE"] = "0"
            pb.redirectOutput(ProcessBuilder.Redirect.DISCARD)
            val p = pb.start()
            val addr = CompletableFuture<String>()
            Thread {
                p.errorStream.bufferedReader().forEachLine { line ->
                    if (!addr.isDone && line.contains("msg=listening")) {
                        Regex("addr=\"?([0-9.]+:[0-9]+)").find(line)?.let { addr.complete(it.groupValues[1]) }
                    }
                }
                addr.completeExceptionally(IllegalStateException("server exited before listening"))
            }.apply { isDaemon = true }.start()
            return TestServer(p, addr.get(30, TimeUnit.SECONDS), dataDir)
        }
    }

    override fun close() {
        process.destroyForcibly()
        process.waitFor(10, TimeUnit.SECONDS)
        dataDir.toFile().deleteRecursively()
    }
}
