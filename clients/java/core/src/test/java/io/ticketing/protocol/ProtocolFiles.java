package io.ticketing.protocol;

import com.google.gson.JsonObject;
import com.google.gson.JsonParser;
import java.io.IOException;
import java.io.UncheckedIOException;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;

/** Reads the language-neutral files in the repository's protocol/ folder at test time. */
final class ProtocolFiles {
    private ProtocolFiles() {
    }

    static Path protocolDir() {
        String root = System.getProperty("ticketing.repoRoot");
        Path dir = root != null ? Path.of(root, "protocol") : Path.of("../../../protocol");
        if (!Files.isRegularFile(dir.resolve("vectors.json"))) {
            throw new IllegalStateException("protocol/vectors.json not found under " + dir.toAbsolutePath());
        }
        return dir;
    }

    static JsonObject read(String name) {
        try {
            return JsonParser.parseString(Files.readString(protocolDir().resolve(name), StandardCharsets.UTF_8))
                    .getAsJsonObject();
        } catch (IOException e) {
            throw new UncheckedIOException(e);
        }
    }
}
