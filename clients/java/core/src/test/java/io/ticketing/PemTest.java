package io.ticketing;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertThrows;

import java.nio.file.Files;
import java.nio.file.Path;
import java.security.PrivateKey;
import org.junit.jupiter.api.Test;

/** PEM private keys in the three unencrypted forms openssl writes, read with the JDK alone. */
class PemTest {
    @Test
    void readsPkcs8Pkcs1AndSec1Keys(@org.junit.jupiter.api.io.TempDir Path d) throws Exception {
        Certs.run(d, "openssl", "genpkey", "-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-out", "ec8.pem");
        Certs.run(d, "openssl", "ec", "-in", "ec8.pem", "-out", "sec1.pem");
        Certs.run(d, "openssl", "genpkey", "-algorithm", "RSA", "-pkeyopt", "rsa_keygen_bits:1024", "-out", "rsa8.pem");
        Certs.run(d, "openssl", "rsa", "-in", "rsa8.pem", "-traditional", "-out", "rsa1.pem");
        Certs.run(d, "openssl", "genpkey", "-algorithm", "ED25519", "-out", "ed.pem");
        assertEquals("EC", key(d, "ec8.pem").getAlgorithm());
        assertEquals("EC", key(d, "sec1.pem").getAlgorithm());
        assertEquals("RSA", key(d, "rsa8.pem").getAlgorithm());
        assertEquals("RSA", key(d, "rsa1.pem").getAlgorithm());
        assertEquals(key(d, "ec8.pem").getEncoded().length > 0, key(d, "sec1.pem").getEncoded().length > 0);
        key(d, "ed.pem");
        Files.writeString(d.resolve("junk.pem"), "not a key");
        assertThrows(TlsException.class, () -> key(d, "junk.pem"));
        Files.writeString(d.resolve("bad.pem"), "-----BEGIN EC PRIVATE KEY-----\nAAAA\n-----END EC PRIVATE KEY-----\n");
        assertThrows(TlsException.class, () -> key(d, "bad.pem"));
    }

    @Test
    void missingFilesAreTlsErrors() {
        TlsOptions tls = TlsOptions.builder().trustCertificates(Path.of("/nonexistent/ca.pem")).build();
        TlsException e = assertThrows(TlsException.class, () -> Pem.context(tls));
        assertEquals(true, e.getMessage().contains("/nonexistent/ca.pem"), e.getMessage());
    }

    private static PrivateKey key(Path d, String name) throws Exception {
        return Pem.privateKey(d.resolve(name));
    }
}
