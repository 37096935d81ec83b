package io.ticketing;

import java.nio.charset.StandardCharsets;
import java.time.Duration;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.List;
import java.util.Objects;

/**
 * Immutable settings of a {@link TicketingClient}, made with {@link #builder()}. Every setting has a
 * documented default ({@code DEFAULT_*}); {@code ClientOptions.create()} is a client for a single
 * node on {@code 127.0.0.1:7070} without auth or TLS.
 *
 * <pre>{@code
 * ClientOptions options = ClientOptions.builder()
 *         .endpoints("10.0.0.1:7070", "10.0.0.2:7070", "10.0.0.3:7070")
 *         .token(System.getenv("TICKETING_TOKEN"))
 *         .requestTimeout(Duration.ofSeconds(5))
 *         .build();
 * }</pre>
 */
public final class ClientOptions {
    /** Default endpoint: {@value}. */
    public static final String DEFAULT_ENDPOINT = "127.0.0.1:7070";
    /** Default connect timeout (TCP, TLS and handshake, per endpoint): 5 s. */
    public static final Duration DEFAULT_CONNECT_TIMEOUT = Duration.ofSeconds(5);
    /** Default request timeout (every answer, except the time an acquire spends queued): 10 s. */
    public static final Duration DEFAULT_REQUEST_TIMEOUT = Duration.ofSeconds(10);
    /** Default heartbeat interval (PING after this long without receiving anything): 2 s. */
    public static final Duration DEFAULT_HEARTBEAT_INTERVAL = Duration.ofSeconds(2);
    /** Default first reconnect backoff: 50 ms, doubling each round. */
    public static final Duration DEFAULT_RECONNECT_BACKOFF_MIN = Duration.ofMillis(50);
    /** Default largest reconnect backoff: 2 s. */
    public static final Duration DEFAULT_RECONNECT_BACKOFF_MAX = Duration.ofSeconds(2);
    /** Default cleanup timeout (how long a cancelled blocking acquire waits for its withdrawal): 5 s. */
    public static final Duration DEFAULT_CLEANUP_TIMEOUT = Duration.ofSeconds(5);
    /** Default for {@link Builder#releaseOnClose(boolean)}: false (closing does not release locks). */
    public static final boolean DEFAULT_RELEASE_ON_CLOSE = false;

    private final List<String> endpoints;
    private final byte[] token;
    private final TlsOptions tls;
    private final Duration connectTimeout;
    private final Duration requestTimeout;
    private final Duration heartbeatInterval;
    private final Duration reconnectBackoffMin;
    private final Duration reconnectBackoffMax;
    private final Duration cleanupTimeout;
    private final boolean releaseOnClose;

    private ClientOptions(Builder b) {
        this.endpoints = List.copyOf(b.endpoints);
        this.token = b.token == null ? null : b.token.clone();
        this.tls = b.tls;
        this.connectTimeout = b.connectTimeout;
        this.requestTimeout = b.requestTimeout;
        this.heartbeatInterval = b.heartbeatInterval;
        this.reconnectBackoffMin = b.reconnectBackoffMin;
        this.reconnectBackoffMax = b.reconnectBackoffMax;
        this.cleanupTimeout = b.cleanupTimeout;
        this.releaseOnClose = b.releaseOnClose;
    }

    /** {@return options with every default} */
    public static ClientOptions create() {
        return builder().build();
    }

    /** {@return a builder with every default} */
    public static Builder builder() {
        return new Builder();
    }

    /** {@return a builder initialised with these options} */
    public Builder mutate() {
        Builder b = new Builder();
        b.endpoints = new ArrayList<>(endpoints);
        b.token = token;
        b.tls = tls;
        b.connectTimeout = connectTimeout;
        b.requestTimeout = requestTimeout;
        b.heartbeatInterval = heartbeatInterval;
        b.reconnectBackoffMin = reconnectBackoffMin;
        b.reconnectBackoffMax = reconnectBackoffMax;
        b.cleanupTimeout = cleanupTimeout;
        b.releaseOnClose = releaseOnClose;
        return b;
    }

    /** {@return the endpoints ({@code host:port}), tried in order} */
    public List<String> endpoints() {
        return endpoints;
    }

    /** {@return whether a shared token is set} */
    public boolean hasToken() {
        return token != null;
    }

    byte[] tokenBytes() {
        return token;
    }

    /** {@return the TLS settings, or null when TLS is off} */
    public TlsOptions tls() {
        return tls;
    }

    /** {@return the connect timeout} */
    public Duration connectTimeout() {
        return connectTimeout;
    }

    /** {@return the request timeout} */
    public Duration requestTimeout() {
        return requestTimeout;
    }

    /** {@return the heartbeat interval ({@link Duration#ZERO}: no heartbeat)} */
    public Duration heartbeatInterval() {
        return heartbeatInterval;
    }

    /** {@return the first reconnect backoff} */
    public Duration reconnectBackoffMin() {
        return reconnectBackoffMin;
    }

    /** {@return the largest reconnect backoff} */
    public Duration reconnectBackoffMax() {
        return reconnectBackoffMax;
    }

    /** {@return the cleanup timeout} */
    public Duration cleanupTimeout() {
        return cleanupTimeout;
    }

    /** {@return whether closing the client releases the locks it still holds} */
    public boolean releaseOnClose() {
        return releaseOnClose;
    }

    @Override
    public String toString() {
        return "ClientOptions{endpoints=" + endpoints + ", token=" + (token == null ? "none" : "set")
                + ", tls=" + (tls == null ? "off" : "on") + ", connectTimeout=" + connectTimeout
                + ", requestTimeout=" + requestTimeout + ", heartbeatInterval=" + heartbeatInterval
                + ", releaseOnClose=" + releaseOnClose + "}";
    }

    /** Builds {@link ClientOptions}; every setter checks its argument at once. */
    public static final class Builder {
        private List<String> endpoints = new ArrayList<>(List.of(DEFAULT_ENDPOINT));
        private byte[] token;
        private TlsOptions tls;
        private Duration connectTimeout = DEFAULT_CONNECT_TIMEOUT;
        private Duration requestTimeout = DEFAULT_REQUEST_TIMEOUT;
        private Duration heartbeatInterval = DEFAULT_HEARTBEAT_INTERVAL;
        private Duration reconnectBackoffMin = DEFAULT_RECONNECT_BACKOFF_MIN;
        private Duration reconnectBackoffMax = DEFAULT_RECONNECT_BACKOFF_MAX;
        private Duration cleanupTimeout = DEFAULT_CLEANUP_TIMEOUT;
        private boolean releaseOnClose = DEFAULT_RELEASE_ON_CLOSE;

        private Builder() {
        }

        /**
         * Sets the endpoints, tried in order (the leader hint of a cluster first, when known).
         * Default: {@value ClientOptions#DEFAULT_ENDPOINT}.
         *
         * @param endpoints {@code host:port} strings; IPv6 hosts in brackets ({@code [::1]:7070})
         * @return this builder
         * @throws InvalidArgumentException when the list is empty or an endpoint is malformed
         */
        public Builder endpoints(String... endpoints) {
            return endpoints(endpoints == null ? null : Arrays.asList(endpoints));
        }

        /**
         * Sets the endpoints; see {@link #endpoints(String...)}.
         *
         * @param endpoints {@code host:port} strings
         * @return this builder
         */
        public Builder endpoints(List<String> endpoints) {
            if (endpoints == null || endpoints.isEmpty()) {
                throw new InvalidArgumentException("endpoints must name at least one host:port");
            }
            for (String e : endpoints) {
                Endpoint.parse(e);
            }
            this.endpoints = new ArrayList<>(endpoints);
            return this;
        }

        /**
         * Sets the shared auth token (its UTF-8 bytes are the HMAC key). With a token the client
         * refuses a server that does not require one. Default: none.
         *
         * @param token the token, or null for none
         * @return this builder
         */
        public Builder token(String token) {
            this.token = token == null ? null : token.getBytes(StandardCharsets.UTF_8);
            return this;
        }

        /**
         * Sets the shared auth token as raw bytes. Default: none.
         *
         * @param token the token, or null for none
         * @return this builder
         */
        public Builder token(byte[] token) {
            this.token = token == null ? null : token.clone();
            return this;
        }

        /**
         * Turns TLS on with these settings. Default: off (null).
         *
         * @param tls the TLS settings, or null for plaintext
         * @return this builder
         */
        public Builder tls(TlsOptions tls) {
            this.tls = tls;
            return this;
        }

        /**
         * Sets how long connecting to one endpoint may take: TCP, TLS and the handshake; once TCP is
         * connected, TLS and the handshake get at most 2 s of it (a frozen node's kernel still
         * accepts connections). Default 5 s.
         *
         * @param timeout a positive duration
         * @return this builder
         */
        public Builder connectTimeout(Duration timeout) {
            this.connectTimeout = positive("connectTimeout", timeout);
            return this;
        }

        /**
         * Sets how long any request may wait for its answer, except the time an acquire spends
         * queued (bounded by its wait timeout and the heartbeat instead); waiting for a reconnect
         * counts: a call whose timeout passes while the client reconnects fails
         * {@link RequestTimeoutException} naming the last connect error. A caller that wants to fail
         * fast while the server is down sets a short one. Default 10 s.
         *
         * @param timeout a positive duration
         * @return this builder
         */
        public Builder requestTimeout(Duration timeout) {
            this.requestTimeout = positive("requestTimeout", timeout);
            return this;
        }

        /**
         * Sets the heartbeat: after this long without receiving anything the client sends PING
         * (after min(interval, 250 ms) while any request waits for an answer, a queued acquire
         * included), and a PING unanswered within min(interval, 750 ms) gives the connection up:
         * the client reconnects and resumes the session, the calls in flight keep waiting, and the
         * node just left is neither dialled nor followed as a leader hint for 2 s (unless it is the
         * only endpoint), then tried last. Default 2 s; {@link Duration#ZERO} turns it off.
         *
         * @param interval a duration, zero for none
         * @return this builder
         */
        public Builder heartbeatInterval(Duration interval) {
            if (interval == null || interval.isNegative()) {
                throw new InvalidArgumentException("heartbeatInterval must be zero or positive, got " + interval);
            }
            this.heartbeatInterval = interval;
            return this;
        }

        /**
         * Sets the reconnect backoff: the first pause between reconnect rounds, doubling up to
         * {@code max}, with jitter. Defaults 50 ms and 2 s.
         *
         * @param min the first pause
         * @param max the largest pause
         * @return this builder
         */
        public Builder reconnectBackoff(Duration min, Duration max) {
            positive("reconnectBackoff min", min);
            positive("reconnectBackoff max", max);
            if (max.compareTo(min) < 0) {
                throw new InvalidArgumentException("reconnectBackoff max " + max + " is below min " + min);
            }
            this.reconnectBackoffMin = min;
            this.reconnectBackoffMax = max;
            return this;
        }

        /**
         * Sets how long a cancelled blocking acquire waits for its withdrawal (the CANCEL answer
         * and the release of a grant that raced it) before it returns; the clean-up then finishes in
         * the background. Also bounds the clean-up {@link TicketingClient#close()} does. Default 5 s.
         *
         * @param timeout a positive duration
         * @return this builder
         */
        public Builder cleanupTimeout(Duration timeout) {
            this.cleanupTimeout = positive("cleanupTimeout", timeout);
            return this;
        }

        /**
         * Makes {@link TicketingClient#close()} release every lock still held (bounded by the
         * request timeout). Default false: the server keeps the locks until their leases end.
         *
         * @param release whether to release on close
         * @return this builder
         */
        public Builder releaseOnClose(boolean release) {
            this.releaseOnClose = release;
            return this;
        }

        /** {@return the options} */
        public ClientOptions build() {
            return new ClientOptions(this);
        }

        private static Duration positive(String name, Duration d) {
            if (d == null || d.isNegative() || d.isZero()) {
                throw new InvalidArgumentException(name + " must be a positive duration, got " + d);
            }
            Objects.requireNonNull(d);
            return d;
        }
    }
}
