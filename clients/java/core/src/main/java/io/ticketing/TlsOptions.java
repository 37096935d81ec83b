package io.ticketing;

import java.nio.file.Path;
import javax.net.ssl.SSLContext;

/**
 * TLS settings: which servers to trust, an optional client certificate (mutual TLS), and the name
 * to verify. Files are PEM: a CA bundle, a certificate chain, and an unencrypted PKCS#8 ({@code
 * BEGIN PRIVATE KEY}), PKCS#1 ({@code BEGIN RSA PRIVATE KEY}) or SEC1 ({@code BEGIN EC PRIVATE
 * KEY}) key. For keystores or hardware keys pass a ready {@link SSLContext} instead.
 *
 * <pre>{@code
 * TlsOptions tls = TlsOptions.builder()
 *         .trustCertificates(Path.of("ca.pem"))                         // else the JDK's trust store
 *         .clientCertificate(Path.of("client.pem"), Path.of("client-key.pem")) // mutual TLS
 *         .build();
 * }</pre>
 */
public final class TlsOptions {
    /** Default hostname verification: on. */
    public static final boolean DEFAULT_VERIFY_HOSTNAME = true;

    private final Path trustCertificates;
    private final Path clientCertificate;
    private final Path clientKey;
    private final String serverName;
    private final SSLContext sslContext;
    private final boolean verifyHostname;

    private TlsOptions(Builder b) {
        this.trustCertificates = b.trustCertificates;
        this.clientCertificate = b.clientCertificate;
        this.clientKey = b.clientKey;
        this.serverName = b.serverName;
        this.sslContext = b.sslContext;
        this.verifyHostname = b.verifyHostname;
    }

    /** {@return TLS settings that trust the JDK's default CAs and verify the endpoint's host name} */
    public static TlsOptions create() {
        return builder().build();
    }

    /** {@return a builder} */
    public static Builder builder() {
        return new Builder();
    }

    /** {@return the CA bundle to trust, or null for the JDK's default trust store} */
    public Path trustCertificates() {
        return trustCertificates;
    }

    /** {@return the client certificate chain (mutual TLS), or null} */
    public Path clientCertificate() {
        return clientCertificate;
    }

    /** {@return the client private key (mutual TLS), or null} */
    public Path clientKey() {
        return clientKey;
    }

    /** {@return the name sent as SNI and verified against the certificate, or null for the endpoint's host} */
    public String serverName() {
        return serverName;
    }

    /** {@return the ready SSL context, or null when the files above are used} */
    public SSLContext sslContext() {
        return sslContext;
    }

    /** {@return whether the server certificate's name is verified} */
    public boolean verifyHostname() {
        return verifyHostname;
    }

    /** Builds {@link TlsOptions}. */
    public static final class Builder {
        private Path trustCertificates;
        private Path clientCertificate;
        private Path clientKey;
        private String serverName;
        private SSLContext sslContext;
        private boolean verifyHostname = DEFAULT_VERIFY_HOSTNAME;

        private Builder() {
        }

        /**
         * Trusts the CA certificates in this PEM file instead of the JDK's trust store.
         *
         * @param caPem a PEM file with one or more certificates
         * @return this builder
         */
        public Builder trustCertificates(Path caPem) {
            this.trustCertificates = caPem;
            return this;
        }

        /**
         * Presents this certificate to servers that require one (mutual TLS).
         *
         * @param certificatePem a PEM file with the certificate chain, leaf first
         * @param keyPem a PEM file with the unencrypted private key
         * @return this builder
         */
        public Builder clientCertificate(Path certificatePem, Path keyPem) {
            if ((certificatePem == null) != (keyPem == null)) {
                throw new InvalidArgumentException("a client certificate needs both the certificate and the key");
            }
            this.clientCertificate = certificatePem;
            this.clientKey = keyPem;
            return this;
        }

        /**
         * Sets the name sent as SNI and verified against the server's certificate. Default: the
         * endpoint's host.
         *
         * @param serverName a DNS name or IP address
         * @return this builder
         */
        public Builder serverName(String serverName) {
            this.serverName = serverName;
            return this;
        }

        /**
         * Uses this SSL context instead of the PEM files.
         *
         * @param sslContext an initialised context
         * @return this builder
         */
        public Builder sslContext(SSLContext sslContext) {
            this.sslContext = sslContext;
            return this;
        }

        /**
         * Turns hostname verification on or off. Default on; turn it off only for tests.
         *
         * @param verify whether to verify
         * @return this builder
         */
        public Builder verifyHostname(boolean verify) {
            this.verifyHostname = verify;
            return this;
        }

        /** {@return the settings} */
        public TlsOptions build() {
            return new TlsOptions(this);
        }
    }
}
