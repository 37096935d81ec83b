/*
 * The connection: endpoint rounds with backoff, non-blocking TCP connect, TLS, the protocol
 * handshake (HELLO / CHALLENGE / AUTH / WELCOME), and the socket reads and writes. The session
 * rules that follow a WELCOME live in async.c (tk__on_ready).
 */
#include <arpa/inet.h>
#include <errno.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <openssl/err.h>
#include <openssl/rand.h>
#include <openssl/x509v3.h>

#include "internal.h"

#define READ_CHUNK 16384
#define MAX_READS_PER_CALL 16 /* bounded work per readiness event */
#define MAX_HINT_HOPS 8       /* consecutive leader hints followed without backoff */

/* ---- a socket BIO that never raises SIGPIPE (send with MSG_NOSIGNAL) ------------------------ */

static int bio_fd(BIO *b) { return (int)(intptr_t)BIO_get_data(b); }

static int bio_write(BIO *b, const char *buf, int len)
{
    BIO_clear_retry_flags(b);
    ssize_t n = send(bio_fd(b), buf, (size_t)len, MSG_NOSIGNAL);
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR))
        BIO_set_retry_write(b);
    return (int)n;
}

static int bio_read(BIO *b, char *buf, int len)
{
    BIO_clear_retry_flags(b);
    ssize_t n = recv(bio_fd(b), buf, (size_t)len, 0);
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR))
        BIO_set_retry_read(b);
    return (int)n;
}

static int bio_puts(BIO *b, const char *s) { return bio_write(b, s, (int)strlen(s)); }

static long bio_ctrl(BIO *b, int cmd, long num, void *ptr)
{
    (void)b;
    (void)num;
    (void)ptr;
    switch (cmd) {
    case BIO_CTRL_FLUSH:
    case BIO_CTRL_DUP:
        return 1;
    default:
        return 0;
    }
}

static int bio_create(BIO *b)
{
    BIO_set_init(b, 1);
    return 1;
}

static int bio_destroy(BIO *b)
{
    (void)b;
    return 1;
}

/* ---- setup -------------------------------------------------------------------------------- */

static void ssl_errors(char *out, size_t cap)
{
    unsigned long e, last = 0;
    out[0] = '\0';
    while ((e = ERR_get_error()) != 0)
        last = e;
    if (last) {
        ERR_error_string_n(last, out, cap);
    }
}

tk_err tk__conn_setup(tk_async *ac, const tk_options *o, tk_error *err)
{
    ac->fd = -1;
    ac->cur_ep = 0;
    if (!o || !o->tls)
        return TK_OK;
    ac->tls = true;
    if (o->tls_server_name && !(ac->tls_server_name = strdup(o->tls_server_name)))
        return tk__seterr(err, TK_ERR_NO_MEMORY, "out of memory");
    ERR_clear_error();
    SSL_CTX *ctx = SSL_CTX_new(TLS_client_method());
    char why[200];
    if (!ctx) {
        ssl_errors(why, sizeof why);
        return tk__seterr(err, TK_ERR_TLS, "TLS: cannot create a context: %s", why);
    }
    ac->ssl_ctx = ctx;
    SSL_CTX_set_min_proto_version(ctx, TLS1_2_VERSION);
    SSL_CTX_set_verify(ctx, SSL_VERIFY_PEER, NULL);
    SSL_CTX_set_mode(ctx, SSL_MODE_ENABLE_PARTIAL_WRITE | SSL_MODE_ACCEPT_MOVING_WRITE_BUFFER);
    int ok = o->tls_ca_file ? SSL_CTX_load_verify_locations(ctx, o->tls_ca_file, NULL)
                            : SSL_CTX_set_default_verify_paths(ctx);
    if (ok != 1) {
        ssl_errors(why, sizeof why);
        return tk__seterr(err, TK_ERR_TLS, "TLS: cannot load the CA %s: %s",
                          o->tls_ca_file ? o->tls_ca_file : "(system default)", why);
    }
    if ((o->tls_cert_file == NULL) != (o->tls_key_file == NULL))
        return tk__seterr(err, TK_ERR_INVALID_ARGUMENT, "TLS: a client certificate needs both tls_cert_file and tls_key_file");
    if (o->tls_cert_file) {
        if (SSL_CTX_use_certificate_chain_file(ctx, o->tls_cert_file) != 1) {
            ssl_errors(why, sizeof why);
            return tk__seterr(err, TK_ERR_TLS, "TLS: cannot load the client certificate %s: %s", o->tls_cert_file, why);
        }
        if (SSL_CTX_use_PrivateKey_file(ctx, o->tls_key_file, SSL_FILETYPE_PEM) != 1 || SSL_CTX_check_private_key(ctx) != 1) {
            ssl_errors(why, sizeof why);
            return tk__seterr(err, TK_ERR_TLS, "TLS: cannot use the client key %s: %s", o->tls_key_file, why);
        }
    }
    BIO_METHOD *m = BIO_meth_new(BIO_TYPE_SOURCE_SINK | BIO_TYPE_DESCRIPTOR, "ticketing socket");
    if (!m || !BIO_meth_set_write(m, bio_write) || !BIO_meth_set_read(m, bio_read) || !BIO_meth_set_puts(m, bio_puts) ||
        !BIO_meth_set_ctrl(m, bio_ctrl) || !BIO_meth_set_create(m, bio_create) || !BIO_meth_set_destroy(m, bio_destroy)) {
        BIO_meth_free(m);
        return tk__seterr(err, TK_ERR_NO_MEMORY, "TLS: cannot create the socket BIO");
    }
    ac->bio_method = m;
    return TK_OK;
}

/* ---- endpoints ---------------------------------------------------------------------------- */

/* Splits "host:port" / "[v6]:port" into host and port. Returns 0, or -1 when malformed. */

int tk__split_hostport(const char *addr, char *host, size_t hcap, char *port, size_t pcap)
{
    const char *colon, *hs, *he;
    if (addr[0] == '[') {
        he = strchr(addr, ']');
        if (!he || he[1] != ':')
            return -1;
        hs = addr + 1;
        colon = he + 1;
    } else {
        colon = strrchr(addr, ':');
        if (!colon || memchr(addr, ':', (size_t)(colon - addr)))
            return -1;
        hs = addr;
        he = colon;
    }
    size_t hl = (size_t)(he - hs), pl = strlen(colon + 1);
    if (hl == 0 || hl >= hcap || pl == 0 || pl >= pcap)
        return -1;
    for (size_t i = 0; i < pl; i++)
        if (colon[1 + i] < '0' || colon[1 + i] > '9')
            return -1;
    long p = strtol(colon + 1, NULL, 10);
    if (p < 1 || p > 65535)
        return -1;
    memcpy(host, hs, hl);
    host[hl] = '\0';
    memcpy(port, colon + 1, pl + 1);
    return 0;
}

/* True when addr is the node the heartbeat found silent less than TK__SILENT_SKIP_US ago and it
 * is not the only endpoint: it is neither dialled nor followed as a leader hint until then
 * (docs/clients.md, rule 1). */
static bool silent_skipped(const tk_async *ac, const char *addr)
{
    return ac->n_endpoints > 1 && ac->silent[0] && tk__now_us() < ac->silent_till && strcmp(addr, ac->silent) == 0;
}

/* The round's target at pos: the hint first (if any), then every endpoint from ep_start, less
 * the node found silent (round_skip). */
static const char *target_at(tk_async *ac, size_t pos, int *idx)
{
    if (ac->round_hint) {
        if (pos == 0) {
            *idx = -1;
            for (size_t i = 0; i < ac->n_endpoints; i++)
                if (strcmp(ac->endpoints[i], ac->round_hint) == 0)
                    *idx = (int)i;
            return ac->round_hint;
        }
        pos--;
    }
    /* endpoints equal to the hint were tried first: skip them */
    for (size_t i = 0, seen = 0; i < ac->n_endpoints; i++) {
        size_t j = (ac->ep_start + i) % ac->n_endpoints;
        if (ac->round_hint && strcmp(ac->endpoints[j], ac->round_hint) == 0)
            continue;
        if (ac->round_skip[0] && strcmp(ac->endpoints[j], ac->round_skip) == 0)
            continue;
        if (seen++ == pos) {
            *idx = (int)j;
            return ac->endpoints[j];
        }
    }
    return NULL;
}

/* ---- teardown and failures ---------------------------------------------------------------- */

void tk__conn_teardown(tk_async *ac, bool graceful)
{
    if (ac->ssl) {
        if (graceful && ac->cs == TK__C_READY)
            (void)SSL_shutdown(ac->ssl); /* best effort close_notify, never waits */
        SSL_free(ac->ssl);
        ac->ssl = NULL;
        ERR_clear_error();
    }
    if (ac->fd >= 0) {
        close(ac->fd);
        ac->fd = -1;
    }
    if (ac->ai_list) {
        freeaddrinfo(ac->ai_list);
        ac->ai_list = ac->ai_cur = NULL;
    }
    ac->ssl_read_wants_write = ac->ssl_write_wants_read = false;
    tk__buf_reset(&ac->rbuf);
    tk__buf_reset(&ac->wbuf);
}

static void try_target(tk_async *ac);
static void round_done_failed(tk_async *ac);

/* The current target failed; code/message say why. Moves to the next target. */
static void target_failed(tk_async *ac, tk_err code, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void target_failed(tk_async *ac, tk_err code, const char *fmt, ...)
{
    char msg[200];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    tk__log(ac, 0, "connect %s: %s", ac->cur_addr, msg);
    tk__conn_teardown(ac, false);
    /* The round's error: TLS only when every target failed on TLS, else unavailable. */
    size_t used = strlen(ac->round_err.message);
    if (used == 0)
        ac->round_err.code = code == TK_ERR_TLS ? TK_ERR_TLS : TK_ERR_UNAVAILABLE;
    else if (!(code == TK_ERR_TLS && ac->round_err.code == TK_ERR_TLS))
        ac->round_err.code = TK_ERR_UNAVAILABLE;
    if (used + 4 < sizeof ac->round_err.message)
        snprintf(ac->round_err.message + used, sizeof ac->round_err.message - used, "%s%s: %s", used ? "; " : "",
                 ac->cur_addr, msg);
    ac->round_pos++;
    try_target(ac);
}

/* A handshake failure no other endpoint would fix (wrong token, version): the round stops. */
static void round_fatal(tk_async *ac, tk_err code, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void round_fatal(tk_async *ac, tk_err code, const char *fmt, ...)
{
    char msg[220];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    tk__conn_teardown(ac, false);
    tk__seterr(&ac->round_err, code, "%s: %s", ac->cur_addr, msg);
    round_done_failed(ac);
}

static int64_t backoff_us(tk_async *ac)
{
    int64_t d = ac->backoff_min_us;
    for (unsigned i = 0; i < ac->round_no && d < ac->backoff_max_us; i++)
        d *= 2;
    if (d > ac->backoff_max_us)
        d = ac->backoff_max_us;
    /* xorshift64 jitter: d/2 + [0, d/2] */
    uint64_t x = ac->rng;
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    ac->rng = x;
    return d / 2 + (int64_t)(x % (uint64_t)(d / 2 + 1));
}

/* A failed round before the first connection. One in which a node answered NOT_LEADER (a
 * cluster electing a leader, as when the application and the cluster start together) is
 * retried after the shortest backoff, until the request timeout has passed since the connect
 * began; any other (nobody serves the address, the server is down, auth, version, TLS) fails
 * the connect at once. Returns true when another round is scheduled. */
static bool first_connect_retry(tk_async *ac)
{
    tk_err code = ac->round_err.code;
    bool election = ac->round_election;
    ac->round_election = false;
    if (!election || code == TK_ERR_AUTH_FAILED || code == TK_ERR_UNSUPPORTED_VERSION || code == TK_ERR_TLS)
        return false;
    ac->round_no = 0;
    int64_t d = backoff_us(ac), now = tk__now_us();
    if (now + d > ac->first_give_up)
        return false;
    ac->hint_hops = 0;
    ac->cs = TK__C_BACKOFF;
    ac->backoff_until = now + d;
    tk__log(ac, 1, "no leader yet (%s); connecting again in %lld ms", ac->round_err.message, (long long)(d / 1000));
    return true;
}

static void round_done_failed(tk_async *ac)
{
    free(ac->round_hint);
    ac->round_hint = NULL;
    ac->last_conn_err = ac->round_err;
    if (!ac->connected_once && first_connect_retry(ac))
        return;
    if (!ac->connected_once) {
        /* The first connect failed: report it and stop. */
        ac->cs = TK__C_FAILED;
        tk__set_last_error(ac, &ac->round_err);
        tk__fail_all(ac, ac->round_err.code, ac->round_err.message);
        if (ac->connect_cb) {
            tk_event *ev = tk__event_new(ac);
            if (ev) {
                ev->kind = TK__EV_CONNECT;
                ev->ccb = ac->connect_cb;
                ev->data = ac->connect_data;
                ev->error = ac->round_err;
                tk__queue_event(ac, ev);
            }
            ac->connect_cb = NULL;
        }
        return;
    }
    if (ac->round_err.code == TK_ERR_AUTH_FAILED || ac->round_err.code == TK_ERR_UNSUPPORTED_VERSION) {
        /* No retry fixes these: every waiting call fails now (the rounds go on, for later calls). */
        tk__set_last_error(ac, &ac->round_err);
        tk__fail_all(ac, ac->round_err.code, ac->round_err.message);
    }
    /* A node answered NOT_LEADER: the cluster is electing a leader, which takes well under a
       second, so the next round comes after the shortest pause, not a grown backoff. */
    if (ac->round_election)
        ac->round_no = 0;
    ac->round_election = false;
    ac->hint_hops = 0; /* the next round follows hints again */
    ac->cs = TK__C_BACKOFF;
    ac->backoff_until = tk__now_us() + backoff_us(ac);
    ac->round_no++;
    tk__log(ac, 1, "reconnect failed (%s); next round in %lld ms", ac->round_err.message,
            (long long)((ac->backoff_until - tk__now_us()) / 1000));
}

void tk__conn_start_round(tk_async *ac, bool immediate)
{
    if (ac->cs == TK__C_CLOSED || ac->cs == TK__C_FAILED)
        return;
    if (!ac->connected_once && ac->first_give_up == 0)
        ac->first_give_up = tk__now_us() + ac->request_timeout_us; /* the first connect began */
    if (!immediate) {
        ac->cs = TK__C_BACKOFF;
        ac->backoff_until = tk__now_us() + backoff_us(ac);
        ac->round_no++;
        return;
    }
    free(ac->round_hint);
    ac->round_hint = ac->hint;
    ac->hint = NULL;
    /* the node found silent is left out of this round, as an endpoint and as a hint */
    ac->round_skip[0] = '\0';
    if (silent_skipped(ac, ac->silent))
        snprintf(ac->round_skip, sizeof ac->round_skip, "%s", ac->silent);
    if (ac->round_hint && ac->round_skip[0] && strcmp(ac->round_hint, ac->round_skip) == 0) {
        free(ac->round_hint);
        ac->round_hint = NULL;
    }
    ac->round_pos = 0;
    tk__clearerr(&ac->round_err);
    try_target(ac);
}

int64_t tk__heartbeat_interval_us(const tk_async *ac)
{
    if (ac->req_head && ac->heartbeat_us > TK__BUSY_HEARTBEAT_US)
        return TK__BUSY_HEARTBEAT_US; /* a request waits for an answer */
    return ac->heartbeat_us;
}

int64_t tk__ping_wait_us(const tk_async *ac)
{
    return ac->heartbeat_us > 0 && ac->heartbeat_us < TK__MAX_PING_WAIT_US ? ac->heartbeat_us : TK__MAX_PING_WAIT_US;
}

/* Leaves a READY connection because of code/message; the session is resumed on the next one. */
void tk__conn_fail(tk_async *ac, tk_err code, const char *fmt, ...)
{
    char msg[200];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (ac->cs != TK__C_READY) {
        if (ac->cs >= TK__C_TCP && ac->cs <= TK__C_AUTH)
            target_failed(ac, code, "%s", msg);
        return;
    }
    tk__log(ac, 2, "connection to %s lost: %s", ac->cur_addr, msg);
    tk__seterr(&ac->last_conn_err, code, "%s: %s", ac->cur_addr, msg);
    tk__conn_teardown(ac, false);
    ac->cs = TK__C_IDLE;
    tk__on_disconnect(ac);
    if (ac->cs == TK__C_IDLE) {
        ac->round_no = 0;
        tk__conn_start_round(ac, true);
    }
}

void tk__conn_redirect(tk_async *ac, const uint8_t *addr, size_t len, const char *why)
{
    free(ac->hint);
    ac->hint = NULL;
    if (len > 0 && len < 256) {
        ac->hint = malloc(len + 1);
        if (ac->hint) {
            memcpy(ac->hint, addr, len);
            ac->hint[len] = '\0';
        }
    }
    if (ac->hint && silent_skipped(ac, ac->hint)) { /* not followed to the node found silent */
        free(ac->hint);
        ac->hint = NULL;
    }
    if (!ac->hint && ac->cur_ep >= 0 && ac->n_endpoints > 0)
        ac->ep_start = ((size_t)ac->cur_ep + 1) % ac->n_endpoints;
    tk__log(ac, 1, "%s: moving from %s to %s", why, ac->cur_addr, ac->hint ? ac->hint : "the next endpoint");
    if (ac->cs != TK__C_READY)
        return;
    tk__seterr(&ac->last_conn_err, TK_ERR_UNAVAILABLE, "%s: %s", ac->cur_addr, why);
    tk__conn_teardown(ac, true);
    ac->cs = TK__C_IDLE;
    tk__on_disconnect(ac);
    if (ac->cs == TK__C_IDLE) {
        bool now = ac->hint_hops < MAX_HINT_HOPS;
        ac->hint_hops++;
        ac->round_no = now ? 0 : ac->round_no;
        tk__conn_start_round(ac, now);
    }
}

/* ---- dialling ----------------------------------------------------------------------------- */

static void start_handshake(tk_async *ac);
static void tls_step(tk_async *ac);

static void tcp_connected(tk_async *ac)
{
    int one = 1;
    setsockopt(ac->fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    /* TLS and the handshake get at most TK__HANDSHAKE_WAIT_US once TCP is connected: a frozen
     * node's kernel still accepts connections, and the next endpoint should not wait for the
     * dial timeout behind it. */
    int64_t hs = tk__now_us() + (ac->dial_timeout_us < TK__HANDSHAKE_WAIT_US ? ac->dial_timeout_us : TK__HANDSHAKE_WAIT_US);
    if (hs < ac->dial_deadline) {
        ac->dial_deadline = hs;
        ac->hs_deadline = true;
    }
    if (ac->ai_list) {
        freeaddrinfo(ac->ai_list);
        ac->ai_list = ac->ai_cur = NULL;
    }
    if (!ac->tls) {
        start_handshake(ac);
        return;
    }
    char host[256], port[8];
    const char *name = ac->tls_server_name;
    if (!name) {
        if (tk__split_hostport(ac->cur_addr, host, sizeof host, port, sizeof port) != 0) {
            target_failed(ac, TK_ERR_UNAVAILABLE, "malformed address");
            return;
        }
        name = host;
    }
    ERR_clear_error();
    SSL *ssl = SSL_new(ac->ssl_ctx);
    BIO *bio = ssl ? BIO_new(ac->bio_method) : NULL;
    if (!bio) {
        SSL_free(ssl);
        target_failed(ac, TK_ERR_TLS, "TLS: out of memory");
        return;
    }
    BIO_set_data(bio, (void *)(intptr_t)ac->fd);
    SSL_set_bio(ssl, bio, bio);
    ac->ssl = ssl;
    struct in6_addr a6;
    struct in_addr a4;
    if (inet_pton(AF_INET, name, &a4) == 1 || inet_pton(AF_INET6, name, &a6) == 1) {
        X509_VERIFY_PARAM_set1_ip_asc(SSL_get0_param(ssl), name);
    } else {
        SSL_set_tlsext_host_name(ssl, name);
        SSL_set1_host(ssl, name);
    }
    ac->cs = TK__C_TLS;
    tls_step(ac);
}

static void connect_next_ai(tk_async *ac)
{
    int last = 0;
    for (; ac->ai_cur; ac->ai_cur = ac->ai_cur->ai_next) {
        struct addrinfo *ai = ac->ai_cur;
        int fd = socket(ai->ai_family, ai->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, ai->ai_protocol);
        if (fd < 0) {
            last = errno;
            continue;
        }
        if (connect(fd, ai->ai_addr, ai->ai_addrlen) == 0) {
            ac->fd = fd;
            ac->ai_cur = ai->ai_next;
            tcp_connected(ac);
            return;
        }
        if (errno == EINPROGRESS) {
            ac->fd = fd;
            ac->ai_cur = ai->ai_next;
            ac->cs = TK__C_TCP;
            return;
        }
        last = errno;
        close(fd);
    }
    target_failed(ac, TK_ERR_UNAVAILABLE, "connect: %s", strerror(last ? last : ECONNREFUSED));
}

static void try_target(tk_async *ac)
{
    int idx = 0;
    const char *addr = target_at(ac, ac->round_pos, &idx);
    if (!addr) {
        round_done_failed(ac);
        return;
    }
    ac->conn_gen++;
    ac->cur_ep = idx;
    snprintf(ac->cur_addr, sizeof ac->cur_addr, "%s", addr);
    ac->dial_deadline = tk__now_us() + ac->dial_timeout_us;
    ac->hs_deadline = false;
    char host[256], port[8];
    if (tk__split_hostport(addr, host, sizeof host, port, sizeof port) != 0) {
        target_failed(ac, TK_ERR_UNAVAILABLE, "malformed address (expected host:port)");
        return;
    }
    struct addrinfo hints;
    memset(&hints, 0, sizeof hints);
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_NUMERICSERV;
    int rc = getaddrinfo(host, port, &hints, &ac->ai_list);
    if (rc != 0) {
        ac->ai_list = NULL;
        target_failed(ac, TK_ERR_UNAVAILABLE, "resolve: %s", gai_strerror(rc));
        return;
    }
    ac->ai_cur = ac->ai_list;
    connect_next_ai(ac);
}

static void tcp_step(tk_async *ac)
{
    int soerr = 0;
    socklen_t sl = sizeof soerr;
    if (getsockopt(ac->fd, SOL_SOCKET, SO_ERROR, &soerr, &sl) != 0)
        soerr = errno;
    if (soerr == 0) {
        tcp_connected(ac);
        return;
    }
    close(ac->fd);
    ac->fd = -1;
    if (ac->ai_cur) {
        connect_next_ai(ac);
        return;
    }
    target_failed(ac, TK_ERR_UNAVAILABLE, "connect: %s", strerror(soerr));
}

static void tls_step(tk_async *ac)
{
    ERR_clear_error();
    errno = 0;
    int rc = SSL_connect(ac->ssl);
    if (rc == 1) {
        start_handshake(ac);
        return;
    }
    int e = SSL_get_error(ac->ssl, rc);
    if (e == SSL_ERROR_WANT_READ) {
        ac->ssl_write_wants_read = true;
        ac->ssl_read_wants_write = false;
        return;
    }
    if (e == SSL_ERROR_WANT_WRITE) {
        ac->ssl_read_wants_write = true;
        ac->ssl_write_wants_read = false;
        return;
    }
    char why[200];
    int saved = errno;
    ssl_errors(why, sizeof why);
    long vr = SSL_get_verify_result(ac->ssl);
    if (vr != X509_V_OK)
        target_failed(ac, TK_ERR_TLS, "TLS handshake: certificate verify failed: %s", X509_verify_cert_error_string(vr));
    else if (e == SSL_ERROR_SYSCALL || e == SSL_ERROR_ZERO_RETURN)
        target_failed(ac, TK_ERR_TLS, "TLS handshake: connection closed by the server%s%s (is the server using TLS?)",
                      saved ? ": " : "", saved ? strerror(saved) : "");
    else
        target_failed(ac, TK_ERR_TLS, "TLS handshake: %s (is the server using TLS?)", why[0] ? why : "failed");
}

static void start_handshake(tk_async *ac)
{
    ac->ssl_read_wants_write = ac->ssl_write_wants_read = false;
    tk_hello h;
    memset(&h, 0, sizeof h);
    h.version = TK_PROTOCOL_VERSION;
    memcpy(h.session_id, ac->session, TK_SESSION_ID_SIZE);
    if (RAND_bytes(ac->cnonce, TK_NONCE_SIZE) != 1) {
        round_fatal(ac, TK_ERR_PROTOCOL, "no random bytes for the nonce");
        return;
    }
    memcpy(h.nonce, ac->cnonce, TK_NONCE_SIZE);
    uint8_t frame[TK_HELLO_SIZE];
    tk_encode_hello(&h, frame);
    tk__buf_reset(&ac->wbuf);
    tk__buf_reset(&ac->rbuf);
    if (tk__buf_append(&ac->wbuf, frame, sizeof frame) != 0) {
        target_failed(ac, TK_ERR_NO_MEMORY, "out of memory");
        return;
    }
    ac->cs = TK__C_HELLO;
    tk__conn_flush(ac);
}

/* ---- the handshake's answers -------------------------------------------------------------- */

static void on_challenge(tk_async *ac, const tk_challenge *ch)
{
    char data[TK_MAX_CHALLENGE_DATA + 1];
    size_t dl = ch->data_len;
    memcpy(data, ch->data, dl);
    data[dl] = '\0';
    for (size_t i = 0; i < dl; i++)
        if ((unsigned char)data[i] < 0x20)
            data[i] = ' ';
    if (ch->status == TK_STATUS_UNSUPPORTED_VERSION || (ch->status == TK_STATUS_OK && ch->version != TK_PROTOCOL_VERSION)) {
        round_fatal(ac, TK_ERR_UNSUPPORTED_VERSION, "the server speaks protocol version %u, this client %d%s%s",
                    ch->version, TK_PROTOCOL_VERSION, dl ? ": " : "", data);
        return;
    }
    switch (ch->status) {
    case TK_STATUS_OK:
        break;
    case TK_STATUS_NOT_LEADER:
        ac->round_election = true;
        if (dl > 0 && silent_skipped(ac, data)) {
            /* the others name the frozen leader until they elect another: not followed */
            target_failed(ac, TK_ERR_UNAVAILABLE, "not the leader (it names %s, which was found silent)", data);
            return;
        }
        if (dl > 0 && ac->hint_hops < MAX_HINT_HOPS) {
            ac->hint_hops++;
            tk__log(ac, 1, "%s is not the leader; following the hint %s", ac->cur_addr, data);
            tk__conn_teardown(ac, false);
            free(ac->hint);
            ac->hint = strdup(data);
            tk__conn_start_round(ac, true);
            return;
        }
        target_failed(ac, TK_ERR_UNAVAILABLE, "not the leader (no leader known)");
        return;
    case TK_STATUS_BUSY:
        target_failed(ac, TK_ERR_BUSY, "busy (%s)%s%s", tk_busy_limit_name(ch->detail) ? tk_busy_limit_name(ch->detail) : "limit",
                      dl ? ": " : "", data);
        return;
    case TK_STATUS_SHUTTING_DOWN:
        target_failed(ac, TK_ERR_SHUTTING_DOWN, "shutting down");
        return;
    default:
        target_failed(ac, TK_ERR_PROTOCOL, "CHALLENGE status %s (%u)%s%s",
                      tk_status_name(ch->status) ? tk_status_name(ch->status) : "unknown", ch->status, dl ? ": " : "",
                      data);
        return;
    }
    ac->auth_required = (ch->flags & TK_CHALLENGE_AUTH_REQUIRED) != 0;
    if (ac->has_token && !ac->auth_required) {
        round_fatal(ac, TK_ERR_AUTH_FAILED,
                    "the server does not require auth, so it cannot prove it holds the token; refusing it");
        return;
    }
    tk_auth a;
    memset(&a, 0, sizeof a);
    if (ac->auth_required && ac->has_token &&
        tk_client_proof(ac->token, ac->token_len, ac->session, ac->cnonce, ch->nonce, a.proof) != 0) {
        round_fatal(ac, TK_ERR_AUTH_FAILED, "cannot compute the HMAC proof");
        return;
    }
    /* keep the server nonce for the server proof: it lives in the auth frame's place until WELCOME */
    memcpy(ac->snonce, ch->nonce, TK_NONCE_SIZE);
    uint8_t frame[TK_AUTH_SIZE];
    tk_encode_auth(&a, frame);
    if (tk__buf_append(&ac->wbuf, frame, sizeof frame) != 0) {
        target_failed(ac, TK_ERR_NO_MEMORY, "out of memory");
        return;
    }
    ac->cs = TK__C_AUTH;
    tk__conn_flush(ac);
}

static void on_welcome(tk_async *ac, const tk_welcome *w)
{
    switch (w->status) {
    case TK_STATUS_OK:
        break;
    case TK_STATUS_AUTH_FAILED:
        round_fatal(ac, TK_ERR_AUTH_FAILED, ac->has_token ? "the server rejected the token" : "the server requires a token");
        return;
    case TK_STATUS_BUSY:
        target_failed(ac, TK_ERR_BUSY, "busy (%s)", tk_busy_limit_name(w->detail) ? tk_busy_limit_name(w->detail) : "limit");
        return;
    case TK_STATUS_SHUTTING_DOWN:
        target_failed(ac, TK_ERR_SHUTTING_DOWN, "shutting down");
        return;
    case TK_STATUS_NOT_LEADER:
        ac->round_election = true;
        target_failed(ac, TK_ERR_UNAVAILABLE, "not the leader");
        return;
    case TK_STATUS_UNSUPPORTED_VERSION:
        round_fatal(ac, TK_ERR_UNSUPPORTED_VERSION, "unsupported protocol version");
        return;
    default:
        target_failed(ac, TK_ERR_PROTOCOL, "WELCOME status %u", w->status);
        return;
    }
    if (ac->auth_required && ac->has_token) {
        uint8_t want[TK_PROOF_SIZE];
        if (tk_server_proof(ac->token, ac->token_len, ac->session, ac->cnonce, ac->snonce, w, want) != 0 ||
            !tk_proof_equal(want, w->proof)) {
            round_fatal(ac, TK_ERR_AUTH_FAILED, "the server's proof does not verify (it does not hold the token)");
            return;
        }
    }
    /* connected */
    ac->cs = TK__C_READY;
    if (ac->cur_ep >= 0)
        ac->ep_start = (size_t)ac->cur_ep;
    ac->round_no = 0;
    ac->hint_hops = 0;
    ac->round_election = false;
    free(ac->round_hint);
    ac->round_hint = NULL;
    ac->last_recv = tk__now_us();
    tk__log(ac, 0, "connected to %s%s", ac->cur_addr, (w->flags & TK_WELCOME_RESUMED) ? " (session resumed)" : "");
    tk__on_ready(ac, w);
}

/* Parses what the handshake state expects from rbuf. */
static void handshake_input(tk_async *ac)
{
    unsigned gen = ac->conn_gen;
    if (ac->cs == TK__C_HELLO) {
        size_t n = tk__buf_size(&ac->rbuf);
        const uint8_t *p = tk__buf_data(&ac->rbuf);
        tk_challenge ch;
        size_t fl = 0;
        tk_wire_result r = tk_decode_challenge(p, n, &ch, &fl);
        if (r == TK_WIRE_SHORT)
            return;
        if (r != TK_WIRE_OK) {
            if (!ac->tls && n >= 2 && (p[0] == 0x15 || p[0] == 0x16) && p[1] == 0x03)
                target_failed(ac, TK_ERR_TLS, "the server answered with TLS (is the server using TLS? enable tls)");
            else
                target_failed(ac, TK_ERR_PROTOCOL, "malformed CHALLENGE (is this a Ticketing server?)");
            return;
        }
        on_challenge(ac, &ch);
        if (ac->conn_gen != gen || ac->cs != TK__C_AUTH)
            return;
        tk__buf_consume(&ac->rbuf, fl);
    }
    if (ac->cs == TK__C_AUTH) {
        size_t n = tk__buf_size(&ac->rbuf);
        const uint8_t *p = tk__buf_data(&ac->rbuf);
        if (n < 4)
            return;
        tk_welcome w;
        tk_wire_result r = tk_decode_welcome(p, n < TK_WELCOME_SIZE ? n : TK_WELCOME_SIZE, &w);
        if (r == TK_WIRE_SHORT)
            return;
        if (r != TK_WIRE_OK) {
            target_failed(ac, TK_ERR_PROTOCOL, "malformed WELCOME");
            return;
        }
        tk__buf_consume(&ac->rbuf, TK_WELCOME_SIZE);
        on_welcome(ac, &w);
    }
}

/* ---- reads and writes --------------------------------------------------------------------- */

/* Reads once into rbuf. Returns >0 bytes read, 0 when nothing more now, -1 after failing.
 * *drained: a plain socket gave less than there was room for (it had no more bytes then). */
static ssize_t read_some(tk_async *ac, bool *drained)
{
    *drained = false;
    if (tk__buf_reserve(&ac->rbuf, READ_CHUNK) != 0) {
        tk__conn_fail(ac, TK_ERR_NO_MEMORY, "out of memory");
        return -1;
    }
    uint8_t *dst = ac->rbuf.p + ac->rbuf.len;
    size_t room = ac->rbuf.cap - ac->rbuf.len;
    if (ac->ssl) {
        ERR_clear_error();
        errno = 0;
        int n = SSL_read(ac->ssl, dst, room > INT32_MAX ? INT32_MAX : (int)room);
        if (n > 0) {
            ac->rbuf.len += (size_t)n;
            ac->ssl_read_wants_write = false;
            return n;
        }
        int e = SSL_get_error(ac->ssl, n);
        if (e == SSL_ERROR_WANT_READ) {
            ac->ssl_read_wants_write = false;
            return 0;
        }
        if (e == SSL_ERROR_WANT_WRITE) {
            ac->ssl_read_wants_write = true;
            return 0;
        }
        char why[200];
        int saved = errno;
        ssl_errors(why, sizeof why);
        bool handshaking = ac->cs != TK__C_READY;
        if (e == SSL_ERROR_ZERO_RETURN || (e == SSL_ERROR_SYSCALL && saved == 0))
            tk__conn_fail(ac, handshaking ? TK_ERR_UNAVAILABLE : TK_ERR_CONNECTION_LOST, "connection closed by the server");
        else if (e == SSL_ERROR_SSL)
            tk__conn_fail(ac, handshaking ? TK_ERR_TLS : TK_ERR_CONNECTION_LOST, "TLS: %s", why);
        else
            tk__conn_fail(ac, handshaking ? TK_ERR_UNAVAILABLE : TK_ERR_CONNECTION_LOST, "read: %s",
                          saved ? strerror(saved) : why);
        return -1;
    }
    ssize_t n = recv(ac->fd, dst, room, 0);
    if (n > 0) {
        ac->rbuf.len += (size_t)n;
        *drained = (size_t)n < room;
        return n;
    }
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR))
        return 0;
    bool handshaking = ac->cs != TK__C_READY;
    if (n == 0) {
        if (handshaking && ac->cs == TK__C_AUTH && ac->auth_required && !ac->has_token)
            round_fatal(ac, TK_ERR_AUTH_FAILED, "the server requires a token");
        else
            tk__conn_fail(ac, handshaking ? TK_ERR_UNAVAILABLE : TK_ERR_CONNECTION_LOST, "connection closed by the server%s",
                          handshaking && !ac->tls ? " during the handshake" : "");
    } else {
        tk__conn_fail(ac, handshaking ? TK_ERR_UNAVAILABLE : TK_ERR_CONNECTION_LOST, "read: %s", strerror(errno));
    }
    return -1;
}

static void conn_read(tk_async *ac)
{
    unsigned gen = ac->conn_gen;
    bool drained = false;
    /* a short read drained the socket: the next bytes come with the next readiness event (a new
     * edge too), so no read that would only say EAGAIN */
    for (int i = 0; i < MAX_READS_PER_CALL && !drained; i++) {
        ssize_t n = read_some(ac, &drained);
        if (n <= 0 || ac->conn_gen != gen)
            return;
        if (ac->cs != TK__C_READY) {
            handshake_input(ac);
            if (ac->conn_gen != gen)
                return;
            if (ac->cs != TK__C_READY)
                continue;
        }
        ac->last_recv = tk__now_us();
        /* every whole frame in the buffer */
        for (;;) {
            tk_response r;
            size_t fl = 0;
            tk_wire_result res = tk_decode_response(tk__buf_data(&ac->rbuf), tk__buf_size(&ac->rbuf), TK_MAX_DATA_LEN, &r, &fl);
            if (res == TK_WIRE_SHORT)
                break;
            if (res != TK_WIRE_OK) {
                tk__conn_fail(ac, TK_ERR_PROTOCOL, "malformed frame from the server (%s)",
                              res == TK_WIRE_TOO_LARGE ? "length above the ceiling" : "length disagrees with the layout");
                return;
            }
            tk__on_frame(ac, &r);
            if (ac->conn_gen != gen || ac->cs != TK__C_READY)
                return;
            tk__buf_consume(&ac->rbuf, fl);
        }
    }
}

int tk__conn_flush(tk_async *ac)
{
    if (ac->fd < 0 || (ac->cs != TK__C_HELLO && ac->cs != TK__C_AUTH && ac->cs != TK__C_READY))
        return 0;
    for (int i = 0; i < 64 && tk__buf_size(&ac->wbuf) > 0; i++) {
        size_t n = tk__buf_size(&ac->wbuf);
        const uint8_t *p = tk__buf_data(&ac->wbuf);
        if (ac->ssl) {
            ERR_clear_error();
            errno = 0;
            int w = SSL_write(ac->ssl, p, n > INT32_MAX ? INT32_MAX : (int)n);
            if (w > 0) {
                ac->ssl_write_wants_read = false;
                tk__buf_consume(&ac->wbuf, (size_t)w);
                continue;
            }
            int e = SSL_get_error(ac->ssl, w);
            if (e == SSL_ERROR_WANT_WRITE) {
                ac->ssl_write_wants_read = false;
                return 0;
            }
            if (e == SSL_ERROR_WANT_READ) {
                ac->ssl_write_wants_read = true;
                return 0;
            }
            char why[200];
            int saved = errno;
            ssl_errors(why, sizeof why);
            tk__conn_fail(ac, ac->cs == TK__C_READY ? TK_ERR_CONNECTION_LOST : TK_ERR_UNAVAILABLE, "write: %s",
                          saved ? strerror(saved) : why);
            return -1;
        }
        ssize_t w = send(ac->fd, p, n, MSG_NOSIGNAL);
        if (w > 0) {
            tk__buf_consume(&ac->wbuf, (size_t)w);
            continue;
        }
        if (w < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR))
            return 0;
        tk__conn_fail(ac, ac->cs == TK__C_READY ? TK_ERR_CONNECTION_LOST : TK_ERR_UNAVAILABLE, "write: %s",
                      strerror(errno));
        return -1;
    }
    return 0;
}

bool tk__conn_want_write(const tk_async *ac)
{
    switch (ac->cs) {
    case TK__C_TCP:
        return true;
    case TK__C_TLS:
        return ac->ssl_read_wants_write;
    case TK__C_HELLO:
    case TK__C_AUTH:
    case TK__C_READY:
        return (tk__buf_size(&ac->wbuf) > 0 && !ac->ssl_write_wants_read) || ac->ssl_read_wants_write;
    default:
        return false;
    }
}

bool tk__conn_want_read(const tk_async *ac)
{
    switch (ac->cs) {
    case TK__C_TLS:
        return ac->ssl_write_wants_read;
    case TK__C_HELLO:
    case TK__C_AUTH:
    case TK__C_READY:
        return true;
    default:
        return false;
    }
}

void tk__conn_io(tk_async *ac, int events)
{
    if (ac->fd < 0 || events == 0)
        return;
    unsigned gen = ac->conn_gen;
    switch (ac->cs) {
    case TK__C_TCP:
        tcp_step(ac);
        return;
    case TK__C_TLS:
        tls_step(ac);
        return;
    case TK__C_HELLO:
    case TK__C_AUTH:
    case TK__C_READY:
        if ((events & TK_EV_WRITE) || (ac->ssl_write_wants_read && (events & TK_EV_READ))) {
            if (tk__conn_flush(ac) != 0 || ac->conn_gen != gen)
                return;
        }
        if ((events & TK_EV_READ) || (ac->ssl_read_wants_write && (events & TK_EV_WRITE)))
            conn_read(ac);
        return;
    default:
        return;
    }
}

int64_t tk__conn_next_timer(const tk_async *ac)
{
    int64_t t = INT64_MAX;
    switch (ac->cs) {
    case TK__C_BACKOFF:
        t = ac->backoff_until;
        break;
    case TK__C_TCP:
    case TK__C_TLS:
    case TK__C_HELLO:
    case TK__C_AUTH:
        t = ac->dial_deadline;
        break;
    case TK__C_READY:
        if (ac->heartbeat_us > 0 && ac->hb_id == 0)
            t = ac->last_recv + tk__heartbeat_interval_us(ac);
        break;
    default:
        break;
    }
    if (ac->disconnected_at && !ac->session_gone && ac->cs != TK__C_READY) {
        int64_t g = ac->disconnected_at + (int64_t)ac->grace_ms * 1000;
        if (g < t)
            t = g;
    }
    return t;
}

void tk__conn_timers(tk_async *ac, int64_t now)
{
    if (ac->disconnected_at && !ac->session_gone && ac->cs != TK__C_READY &&
        now >= ac->disconnected_at + (int64_t)ac->grace_ms * 1000) {
        ac->session_gone = true;
        tk__session_lost(ac, TK_ERR_CONNECTION_LOST, "the session grace passed without a reconnect");
    }
    switch (ac->cs) {
    case TK__C_BACKOFF:
        if (now >= ac->backoff_until)
            tk__conn_start_round(ac, true);
        break;
    case TK__C_TCP:
    case TK__C_TLS:
    case TK__C_HELLO:
    case TK__C_AUTH:
        if (now >= ac->dial_deadline && ac->hs_deadline)
            target_failed(ac, TK_ERR_TIMEOUT, "no %s within %lld ms of the TCP connection (is the server frozen, or not a Ticketing server?)",
                          ac->cs == TK__C_TLS ? "TLS handshake" : "handshake answer",
                          (long long)((ac->dial_timeout_us < TK__HANDSHAKE_WAIT_US ? ac->dial_timeout_us : TK__HANDSHAKE_WAIT_US) / 1000));
        else if (now >= ac->dial_deadline)
            target_failed(ac, TK_ERR_TIMEOUT, "no %s within %lld ms",
                          ac->cs == TK__C_TCP ? "TCP connection" : ac->cs == TK__C_TLS ? "TLS handshake" : "handshake answer",
                          (long long)(ac->dial_timeout_us / 1000));
        break;
    case TK__C_READY:
        if (ac->heartbeat_us > 0 && ac->hb_id == 0 && now >= ac->last_recv + tk__heartbeat_interval_us(ac)) {
            tk_req *r = tk__req_new(ac, TK_OP_PING, TK__R_HEARTBEAT);
            if (r) {
                tk__req_submit(ac, r);
                ac->hb_id = r->id;
            }
        }
        break;
    default:
        break;
    }
}
