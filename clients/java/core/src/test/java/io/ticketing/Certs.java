package io.ticketing;

import java.nio.file.Files;
import java.nio.file.Path;
import java.util.List;
import java.util.concurrent.TimeUnit;

/** Test certificates made at test time with the openssl CLI (no private key is committed). */
final class Certs {
    final Path dir;
    final Path ca;
    final Path serverCert;
    final Path serverKey;
    final Path clientCert;
    final Path clientKey; // SEC1 ("EC PRIVATE KEY"), to exercise that reader too

    private Certs(Path dir) {
        this.dir = dir;
        this.ca = dir.resolve("ca.pem");
        this.serverCert = dir.resolve("server.pem");
        this.serverKey = dir.resolve("server.key");
        this.clientCert = dir.resolve("client.pem");
        this.clientKey = dir.resolve("client-sec1.key");
    }

    static Certs make(Path d) throws Exception {
        Certs c = new Certs(d);
        Files.writeString(d.resolve("server.ext"), "subjectAltName=IP:127.0.0.1,DNS:localhost\n");
        Files.writeString(d.resolve("client.ext"), "extendedKeyUsage=clientAuth\n");
        run(d, "openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
                "-keyout", "ca.key", "-out", "ca.pem", "-days", "2", "-subj", "/CN=ticketing-test-ca");
        for (String who : new String[] {"server", "client"}) {
            run(d, "openssl", "req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
                    "-keyout", who + ".key", "-out", who + ".csr", "-subj", "/CN=" + who);
            run(d, "openssl", "x509", "-req", "-in", who + ".csr", "-CA", "ca.pem", "-CAkey", "ca.key",
                    "-CAcreateserial", "-out", who + ".pem", "-days", "2", "-extfile", who + ".ext");
        }
        run(d, "openssl", "ec", "-in", "client.key", "-out", "client-sec1.key");
        return c;
    }

    static void run(Path dir, String... cmd) throws Exception {
        Process p = new ProcessBuilder(List.of(cmd)).directory(dir.toFile()).redirectErrorStream(true).start();
        String out = new String(p.getInputStream().readAllBytes());
        if (!p.waitFor(60, TimeUnit.SECONDS) || p.exitValue() != 0) {
            throw new IllegalStateException(String.join(" ", cmd) + " failed: " + out);
        }
    }
}
