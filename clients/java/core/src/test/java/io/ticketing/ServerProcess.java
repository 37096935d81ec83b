package io.ticketing;

import java.io.BufferedReader;
import java.io.File;
import java.io.IOException;
import java.io.InputStreamReader;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.HashMap;
import java.util.Map;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.TimeUnit;
import java.util.regex.Matcher;
import java.util.regex.Pattern;

/**
 * The real server binary, started by the test on 127.0.0.1 with a free port and a fresh data
 * directory, stopped by its PID. The binary is {@code $TICKETING_BIN}, else one built once per test
 * run from the repository root.
 */
final class ServerProcess implements AutoCloseable {
    private static final Pattern LISTENING = Pattern.compile("addr=\"?([0-9.:\\[\\]a-f]+):(\\d+)");
    private static Path built;

    private final Map<String, String> env;
    private final Path dataDir;
    private Process process;
    private int port;
    final StringBuffer log = new StringBuffer();

    private ServerProcess(Map<String, String> env, Path dataDir) {
        this.env = env;
        this.dataDir = dataDir;
    }

    /** Starts a server with these extra environment variables. */
    static ServerProcess start(Map<String, String> extraEnv) throws Exception {
        Map<String, String> env = new HashMap<>();
        env.put("TICKETING_STARTUP_GRACE", "0");
        env.putAll(extraEnv);
        ServerProcess s = new ServerProcess(env, Files.createTempDirectory("ticketing-java-data"));
        s.launch("127.0.0.1:0");
        return s;
    }

    static ServerProcess start() throws Exception {
        return start(Map.of());
    }

    static synchronized Path binary() throws Exception {
        String bin = System.getenv("TICKETING_BIN");
        if (bin != null && !bin.isEmpty()) {
            return Path.of(bin);
        }
        if (built == null) {
            Path root = Path.of(System.getProperty("ticketing.repoRoot", "../../..")).toAbsolutePath().normalize();
            Path dir = Files.createTempDirectory("ticketing-java-bin");
            Path out = dir.resolve("ticketing");
            Process p = new ProcessBuilder("go", "build", "-o", out.toString(), "./cmd/ticketing")
                    .directory(root.toFile()).inheritIO().start();
            if (!p.waitFor(300, TimeUnit.SECONDS) || p.exitValue() != 0) {
                throw new IllegalStateException("go build ./cmd/ticketing failed in " + root);
            }
            built = out;
        }
        return built;
    }

    private void launch(String addr) throws Exception {
        ProcessBuilder pb = new ProcessBuilder(binary().toString(), "server");
        pb.environment().putAll(env);
        pb.environment().put("TICKETING_ADDR", addr);
        pb.environment().put("TICKETING_DATA_DIR", dataDir.toString());
        pb.redirectOutput(ProcessBuilder.Redirect.DISCARD);
        process = pb.start();
        CompletableFuture<Integer> listening = new CompletableFuture<>();
        Thread t = new Thread(() -> {
            try (BufferedReader r = new BufferedReader(new InputStreamReader(process.getErrorStream(), StandardCharsets.UTF_8))) {
                String line;
                while ((line = r.readLine()) != null) {
                    log.append(line).append('\n');
                    if (!listening.isDone() && line.contains("msg=listening")) {
                        Matcher m = LISTENING.matcher(line);
                        if (m.find()) {
                            listening.complete(Integer.parseInt(m.group(2)));
                        }
                    }
                }
            } catch (IOException ignored) {
                // the process ended
            }
            listening.completeExceptionally(new IllegalStateException("server exited before listening:\n" + log));
        }, "server-stderr");
        t.setDaemon(true);
        t.start();
        port = listening.get(30, TimeUnit.SECONDS);
    }

    String endpoint() {
        return "127.0.0.1:" + port;
    }

    int port() {
        return port;
    }

    long pid() {
        return process.pid();
    }

    boolean isAlive() {
        return process.isAlive();
    }

    /** SIGTERM: a graceful stop. */
    void terminate() {
        process.destroy();
    }

    /** SIGKILL, waiting for the process to end. */
    void kill() throws InterruptedException {
        process.destroyForcibly();
        process.waitFor(10, TimeUnit.SECONDS);
    }

    boolean waitFor(long ms) throws InterruptedException {
        return process.waitFor(ms, TimeUnit.MILLISECONDS);
    }

    /** Starts the server again on the same port and data directory (a new state id). */
    void restart() throws Exception {
        if (process.isAlive()) {
            kill();
        }
        launch("127.0.0.1:" + port);
    }

    @Override
    public void close() throws java.io.IOException {
        if (process != null && process.isAlive()) {
            process.destroyForcibly();
            try {
                process.waitFor(10, TimeUnit.SECONDS);
            } catch (InterruptedException e) {
                Thread.currentThread().interrupt();
            }
        }
        deleteTree(dataDir.toFile());
    }

    private static void deleteTree(File f) {
        File[] children = f.listFiles();
        if (children != null) {
            for (File c : children) {
                deleteTree(c);
            }
        }
        f.delete();
    }
}
