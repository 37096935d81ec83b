package io.ticketing;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.io.File;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.List;
import java.util.concurrent.TimeUnit;
import javax.tools.JavaCompiler;
import javax.tools.ToolProvider;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.Timeout;

/** The README's example, compiled and run exactly as written there, against a real server. */
@Timeout(120)
class ReadmeExampleTest {
    @Test
    void readmeExampleRunsAsWritten(@org.junit.jupiter.api.io.TempDir Path dir) throws Exception {
        String readme = Files.readString(Path.of(System.getProperty("ticketing.repoRoot"), "clients/java/README.md"));
        int start = readme.indexOf("<!-- example:start");
        int end = readme.indexOf("<!-- example:end -->");
        assertTrue(start >= 0 && end > start, "README has the example markers");
        String block = readme.substring(start, end);
        String code = block.substring(block.indexOf("```java") + 7, block.lastIndexOf("```"));
        assertTrue(code.contains("class Example"));

        Path src = dir.resolve("Example.java");
        Files.writeString(src, code, StandardCharsets.UTF_8);
        String cp = System.getProperty("java.class.path");
        JavaCompiler javac = ToolProvider.getSystemJavaCompiler();
        assertEquals(0, javac.run(null, null, null, "-d", dir.toString(), "-cp", cp, src.toString()), "compiles");

        try (ServerProcess server = ServerProcess.start()) {
            ProcessBuilder pb = new ProcessBuilder(Path.of(System.getProperty("java.home"), "bin", "java").toString(),
                    "-cp", dir + File.pathSeparator + cp, "Example");
            pb.environment().put("TICKETING_ENDPOINT", server.endpoint());
            pb.redirectErrorStream(true);
            Process p = pb.start();
            String out = new String(p.getInputStream().readAllBytes(), StandardCharsets.UTF_8);
            assertTrue(p.waitFor(60, TimeUnit.SECONDS));
            assertEquals(0, p.exitValue(), out);
            assertTrue(out.matches("(?s)holding report-2024 with fencing token [1-9][0-9]*\\s*"), out);
            try (TicketingClient c = TicketingClient.connect(ClientOptions.builder().endpoints(server.endpoint()).build())) {
                assertEquals(List.of(false), List.of(c.inspect("report-2024").held()), "released by the example");
            }
        }
    }
}
