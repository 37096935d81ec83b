package io.ticketing;

import static org.junit.jupiter.api.Assertions.assertEquals;

import java.nio.file.Files;
import java.nio.file.Path;
import org.junit.jupiter.api.Test;

/** The library's version (the Maven project version, filtered into a resource) is the repository's VERSION. */
class VersionTest {
    @Test
    void versionIsTheRepositorysVersion() throws Exception {
        String want = Files.readString(Path.of(System.getProperty("ticketing.repoRoot"), "VERSION")).strip();
        assertEquals(want, TicketingClient.version());
    }
}
