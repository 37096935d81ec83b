package io.ticketing;

import java.io.ByteArrayInputStream;
import java.io.ByteArrayOutputStream;
import java.io.IOException;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.security.GeneralSecurityException;
import java.security.KeyFactory;
import java.security.KeyStore;
import java.security.PrivateKey;
import java.security.cert.Certificate;
import java.security.cert.CertificateFactory;
import java.security.spec.PKCS8EncodedKeySpec;
import java.util.Base64;
import java.util.Collection;
import java.util.regex.Matcher;
import java.util.regex.Pattern;
import javax.net.ssl.KeyManagerFactory;
import javax.net.ssl.SSLContext;
import javax.net.ssl.TrustManagerFactory;

/** Builds an {@link SSLContext} from PEM files, with the JDK alone. */
final class Pem {
    private Pem() {
    }

    private static final Pattern KEY = Pattern.compile(
            "-----BEGIN ([A-Z ]*)PRIVATE KEY-----([A-Za-z0-9+/=\\s]+)-----END \\1PRIVATE KEY-----");
    // DER encodings of the algorithm identifiers used to wrap PKCS#1 and SEC1 keys in PKCS#8.
    private static final byte[] RSA_ALG = {0x30, 0x0d, 0x06, 0x09, 0x2a, (byte) 0x86, 0x48, (byte) 0x86, (byte) 0xf7,
        0x0d, 0x01, 0x01, 0x01, 0x05, 0x00};
    private static final byte[] EC_OID = {0x06, 0x07, 0x2a, (byte) 0x86, 0x48, (byte) 0xce, 0x3d, 0x02, 0x01};

    static SSLContext context(TlsOptions tls) {
        if (tls.sslContext() != null) {
            return tls.sslContext();
        }
        try {
            TrustManagerFactory tmf = TrustManagerFactory.getInstance(TrustManagerFactory.getDefaultAlgorithm());
            if (tls.trustCertificates() != null) {
                KeyStore trust = KeyStore.getInstance(KeyStore.getDefaultType());
                trust.load(null, null);
                int i = 0;
                for (Certificate c : certificates(tls.trustCertificates())) {
                    trust.setCertificateEntry("ca" + i++, c);
                }
                tmf.init(trust);
            } else {
                tmf.init((KeyStore) null);
            }
            KeyManagerFactory kmf = null;
            if (tls.clientCertificate() != null) {
                Collection<? extends Certificate> chain = certificates(tls.clientCertificate());
                PrivateKey key = privateKey(tls.clientKey());
                KeyStore ks = KeyStore.getInstance(KeyStore.getDefaultType());
                ks.load(null, null);
                char[] pw = new char[0];
                ks.setKeyEntry("client", key, pw, chain.toArray(new Certificate[0]));
                kmf = KeyManagerFactory.getInstance(KeyManagerFactory.getDefaultAlgorithm());
                kmf.init(ks, pw);
            }
            SSLContext ctx = SSLContext.getInstance("TLS");
            ctx.init(kmf == null ? null : kmf.getKeyManagers(), tmf.getTrustManagers(), null);
            return ctx;
        } catch (IOException | GeneralSecurityException e) {
            throw new TlsException("cannot load the TLS settings: " + e.getMessage(), e);
        }
    }

    private static Collection<? extends Certificate> certificates(Path pem) throws IOException, GeneralSecurityException {
        byte[] bytes = Files.readAllBytes(pem);
        Collection<? extends Certificate> certs = CertificateFactory.getInstance("X.509")
                .generateCertificates(new ByteArrayInputStream(bytes));
        if (certs.isEmpty()) {
            throw new TlsException("no certificate in " + pem);
        }
        return certs;
    }

    static PrivateKey privateKey(Path pem) throws IOException, GeneralSecurityException {
        String text = Files.readString(pem, StandardCharsets.US_ASCII);
        Matcher m = KEY.matcher(text);
        if (!m.find()) {
            throw new TlsException("no unencrypted private key in " + pem
                    + " (expected BEGIN PRIVATE KEY; convert with: openssl pkcs8 -topk8 -nocrypt)");
        }
        byte[] der = Base64.getMimeDecoder().decode(m.group(2));
        String kind = m.group(1).trim();
        byte[] pkcs8;
        switch (kind) {
            case "" -> pkcs8 = der;
            case "RSA" -> pkcs8 = wrap(RSA_ALG, der);
            case "EC" -> pkcs8 = wrap(ecAlgorithm(der), der);
            default -> throw new TlsException("unsupported private key type \"" + kind + "\" in " + pem
                    + " (convert with: openssl pkcs8 -topk8 -nocrypt)");
        }
        GeneralSecurityException last = null;
        for (String alg : new String[] {"RSA", "EC", "Ed25519", "Ed448", "RSASSA-PSS"}) {
            try {
                return KeyFactory.getInstance(alg).generatePrivate(new PKCS8EncodedKeySpec(pkcs8));
            } catch (GeneralSecurityException e) {
                last = e;
            }
        }
        throw new TlsException("cannot read the private key in " + pem, last);
    }

    /** Wraps a PKCS#1 or SEC1 key in a PKCS#8 PrivateKeyInfo. */
    private static byte[] wrap(byte[] algorithm, byte[] key) {
        ByteArrayOutputStream body = new ByteArrayOutputStream();
        body.writeBytes(new byte[] {0x02, 0x01, 0x00});
        body.writeBytes(algorithm);
        body.writeBytes(tlv(0x04, key));
        return tlv(0x30, body.toByteArray());
    }

    /** The AlgorithmIdentifier of a SEC1 key: id-ecPublicKey with the curve named inside the key. */
    private static byte[] ecAlgorithm(byte[] sec1) {
        // ECPrivateKey ::= SEQUENCE { INTEGER 1, OCTET STRING, [0] OID OPTIONAL, [1] BIT STRING OPTIONAL }
        int[] pos = {0};
        expectTag(sec1, pos, 0x30);
        readLength(sec1, pos);
        while (pos[0] < sec1.length) {
            int tag = sec1[pos[0]++] & 0xFF;
            int len = readLength(sec1, pos);
            if (tag == 0xA0) {
                byte[] oid = java.util.Arrays.copyOfRange(sec1, pos[0], pos[0] + len);
                ByteArrayOutputStream alg = new ByteArrayOutputStream();
                alg.writeBytes(EC_OID);
                alg.writeBytes(oid);
                return tlv(0x30, alg.toByteArray());
            }
            pos[0] += len;
        }
        throw new TlsException("EC private key without its curve; convert with: openssl pkcs8 -topk8 -nocrypt");
    }

    private static void expectTag(byte[] b, int[] pos, int tag) {
        if (pos[0] >= b.length || (b[pos[0]++] & 0xFF) != tag) {
            throw new TlsException("malformed private key");
        }
    }

    private static int readLength(byte[] b, int[] pos) {
        if (pos[0] >= b.length) {
            throw new TlsException("malformed private key");
        }
        int first = b[pos[0]++] & 0xFF;
        if (first < 0x80) {
            return first;
        }
        int n = first & 0x7F;
        if (n > 3 || pos[0] + n > b.length) {
            throw new TlsException("malformed private key");
        }
        int len = 0;
        for (int i = 0; i < n; i++) {
            len = (len << 8) | (b[pos[0]++] & 0xFF);
        }
        return len;
    }

    private static byte[] tlv(int tag, byte[] value) {
        ByteArrayOutputStream out = new ByteArrayOutputStream();
        out.write(tag);
        int len = value.length;
        if (len < 0x80) {
            out.write(len);
        } else if (len < 0x100) {
            out.write(0x81);
            out.write(len);
        } else if (len < 0x10000) {
            out.write(0x82);
            out.write(len >> 8);
            out.write(len);
        } else {
            out.write(0x83);
            out.write(len >> 16);
            out.write(len >> 8);
            out.write(len);
        }
        out.writeBytes(value);
        return out.toByteArray();
    }
}
