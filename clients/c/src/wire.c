/* The protocol codec (PROTOCOL.md): fixed offsets, big-endian, no allocation, no I/O. */
#include "ticketing/wire.h"

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <string.h>

static void put16(uint8_t *p, uint16_t v)
{
    p[0] = (uint8_t)(v >> 8);
    p[1] = (uint8_t)v;
}

static void put32(uint8_t *p, uint32_t v)
{
    p[0] = (uint8_t)(v >> 24);
    p[1] = (uint8_t)(v >> 16);
    p[2] = (uint8_t)(v >> 8);
    p[3] = (uint8_t)v;
}

static void put64(uint8_t *p, uint64_t v)
{
    put32(p, (uint32_t)(v >> 32));
    put32(p + 4, (uint32_t)v);
}

static uint16_t get16(const uint8_t *p) { return (uint16_t)((p[0] << 8) | p[1]); }

static uint32_t get32(const uint8_t *p)
{
    return ((uint32_t)p[0] << 24) | ((uint32_t)p[1] << 16) | ((uint32_t)p[2] << 8) | p[3];
}

static uint64_t get64(const uint8_t *p) { return ((uint64_t)get32(p) << 32) | get32(p + 4); }

/* Writes the 32-byte header shared by requests and responses. */
static void put_header(uint8_t *b, uint8_t op, uint8_t flags_or_status, size_t var_len, uint64_t id,
                       uint64_t token, uint32_t lease, uint32_t last)
{
    put32(b, (uint32_t)(TK_HEADER_SIZE - 4 + var_len));
    b[4] = op;
    b[5] = flags_or_status;
    put16(b + 6, (uint16_t)var_len);
    put64(b + 8, id);
    put64(b + 16, token);
    put32(b + 24, lease);
    put32(b + 28, last);
}

size_t tk_encode_request(const tk_request *r, uint8_t *buf, size_t cap)
{
    if (r->key_len > TK_MAX_KEY_LEN)
        return 0;
    size_t n = TK_HEADER_SIZE + r->key_len;
    if (buf == NULL || cap < n)
        return n;
    put_header(buf, r->op, r->flags, r->key_len, r->id, r->token, r->lease_ms, r->wait_ms);
    if (r->key_len > 0)
        memcpy(buf + TK_HEADER_SIZE, r->key, r->key_len);
    return n;
}

size_t tk_encode_response(const tk_response *r, uint8_t *buf, size_t cap)
{
    if (r->data_len > TK_MAX_DATA_LEN)
        return 0;
    size_t n = TK_HEADER_SIZE + r->data_len;
    if (buf == NULL || cap < n)
        return n;
    put_header(buf, r->op, r->status, r->data_len, r->id, r->token, r->lease_ms, r->detail);
    if (r->data_len > 0)
        memcpy(buf + TK_HEADER_SIZE, r->data, r->data_len);
    return n;
}

/* Checks the length field of a 32-byte-header frame against the variable-part limit and reports
 * the whole frame's size once all of it is in buf. */
static tk_wire_result frame_bounds(const uint8_t *buf, size_t len, size_t max_var, size_t *size)
{
    if (len < 4)
        return TK_WIRE_SHORT;
    uint32_t l = get32(buf);
    if (l < TK_HEADER_SIZE - 4)
        return TK_WIRE_LENGTH;
    if (max_var > TK_MAX_KEY_LEN)
        max_var = TK_MAX_KEY_LEN;
    if ((uint64_t)l > (uint64_t)(TK_HEADER_SIZE - 4 + max_var))
        return TK_WIRE_TOO_LARGE;
    size_t n = 4 + (size_t)l;
    if (len < n)
        return TK_WIRE_SHORT;
    if ((size_t)get16(buf + 6) != n - TK_HEADER_SIZE)
        return TK_WIRE_LENGTH;
    *size = n;
    return TK_WIRE_OK;
}

tk_wire_result tk_decode_request(const uint8_t *buf, size_t len, size_t max_key, tk_request *r,
                                 size_t *frame_len)
{
    size_t n = 0;
    tk_wire_result res = frame_bounds(buf, len, max_key, &n);
    if (res != TK_WIRE_OK)
        return res;
    r->op = buf[4];
    r->flags = buf[5];
    r->id = get64(buf + 8);
    r->token = get64(buf + 16);
    r->lease_ms = get32(buf + 24);
    r->wait_ms = get32(buf + 28);
    r->key = buf + TK_HEADER_SIZE;
    r->key_len = n - TK_HEADER_SIZE;
    if (frame_len)
        *frame_len = n;
    return TK_WIRE_OK;
}

tk_wire_result tk_decode_response(const uint8_t *buf, size_t len, size_t max_data, tk_response *r,
                                  size_t *frame_len)
{
    size_t n = 0;
    tk_wire_result res = frame_bounds(buf, len, max_data, &n);
    if (res != TK_WIRE_OK)
        return res;
    r->op = buf[4];
    r->status = buf[5];
    r->id = get64(buf + 8);
    r->token = get64(buf + 16);
    r->lease_ms = get32(buf + 24);
    r->detail = get32(buf + 28);
    r->data = buf + TK_HEADER_SIZE;
    r->data_len = n - TK_HEADER_SIZE;
    if (frame_len)
        *frame_len = n;
    return TK_WIRE_OK;
}

/* Checks a fixed-size handshake frame that must occupy exactly len bytes. */
static tk_wire_result fixed_frame(const uint8_t *buf, size_t len, size_t size, uint8_t op)
{
    if (len < 4)
        return TK_WIRE_SHORT;
    if ((size_t)get32(buf) + 4 != size)
        return TK_WIRE_LENGTH;
    if (len < size)
        return TK_WIRE_SHORT;
    if (len > size)
        return TK_WIRE_LENGTH;
    if (buf[4] != op)
        return TK_WIRE_WRONG_OP;
    return TK_WIRE_OK;
}

void tk_encode_hello(const tk_hello *h, uint8_t out[TK_HELLO_SIZE])
{
    put32(out, TK_HELLO_SIZE - 4);
    out[4] = TK_OP_HELLO;
    out[5] = h->version;
    put16(out + 6, h->flags);
    memcpy(out + 8, h->session_id, TK_SESSION_ID_SIZE);
    memcpy(out + 24, h->nonce, TK_NONCE_SIZE);
}

tk_wire_result tk_decode_hello(const uint8_t *buf, size_t len, tk_hello *h)
{
    tk_wire_result res = fixed_frame(buf, len, TK_HELLO_SIZE, TK_OP_HELLO);
    if (res != TK_WIRE_OK)
        return res;
    h->version = buf[5];
    h->flags = get16(buf + 6);
    memcpy(h->session_id, buf + 8, TK_SESSION_ID_SIZE);
    memcpy(h->nonce, buf + 24, TK_NONCE_SIZE);
    return TK_WIRE_OK;
}

size_t tk_encode_challenge(const tk_challenge *c, uint8_t *buf, size_t cap)
{
    if (c->data_len > TK_MAX_CHALLENGE_DATA)
        return 0;
    size_t n = TK_CHALLENGE_SIZE + c->data_len;
    if (buf == NULL || cap < n)
        return n;
    put32(buf, (uint32_t)(n - 4));
    buf[4] = TK_OP_CHALLENGE;
    buf[5] = c->status;
    buf[6] = c->version;
    buf[7] = c->flags;
    put32(buf + 8, c->detail);
    put16(buf + 12, (uint16_t)c->data_len);
    buf[14] = 0;
    buf[15] = 0;
    memcpy(buf + 16, c->nonce, TK_NONCE_SIZE);
    if (c->data_len > 0)
        memcpy(buf + TK_CHALLENGE_SIZE, c->data, c->data_len);
    return n;
}

tk_wire_result tk_decode_challenge(const uint8_t *buf, size_t len, tk_challenge *c, size_t *frame_len)
{
    if (len < 4)
        return TK_WIRE_SHORT;
    uint32_t l = get32(buf);
    if (l < TK_CHALLENGE_SIZE - 4)
        return TK_WIRE_LENGTH;
    if (l > TK_CHALLENGE_SIZE - 4 + TK_MAX_CHALLENGE_DATA)
        return TK_WIRE_TOO_LARGE;
    size_t n = 4 + (size_t)l;
    if (len < n)
        return TK_WIRE_SHORT;
    if (buf[4] != TK_OP_CHALLENGE)
        return TK_WIRE_WRONG_OP;
    if ((size_t)get16(buf + 12) != n - TK_CHALLENGE_SIZE)
        return TK_WIRE_LENGTH;
    c->status = buf[5];
    c->version = buf[6];
    c->flags = buf[7];
    c->detail = get32(buf + 8);
    memcpy(c->nonce, buf + 16, TK_NONCE_SIZE);
    c->data = buf + TK_CHALLENGE_SIZE;
    c->data_len = n - TK_CHALLENGE_SIZE;
    if (frame_len)
        *frame_len = n;
    return TK_WIRE_OK;
}

void tk_encode_auth(const tk_auth *a, uint8_t out[TK_AUTH_SIZE])
{
    put32(out, TK_AUTH_SIZE - 4);
    out[4] = TK_OP_AUTH;
    out[5] = out[6] = out[7] = 0;
    memcpy(out + 8, a->proof, TK_PROOF_SIZE);
}

tk_wire_result tk_decode_auth(const uint8_t *buf, size_t len, tk_auth *a)
{
    tk_wire_result res = fixed_frame(buf, len, TK_AUTH_SIZE, TK_OP_AUTH);
    if (res != TK_WIRE_OK)
        return res;
    memcpy(a->proof, buf + 8, TK_PROOF_SIZE);
    return TK_WIRE_OK;
}

/* Bytes 0..31 of WELCOME: everything the server proof signs (from offset 5) and the framing. */
static void welcome_signed(const tk_welcome *w, uint8_t out[32])
{
    put32(out, TK_WELCOME_SIZE - 4);
    out[4] = TK_OP_WELCOME;
    out[5] = w->status;
    out[6] = w->flags;
    out[7] = 0;
    put32(out + 8, w->detail);
    put32(out + 12, w->session_grace_ms);
    memcpy(out + 16, w->state_id, TK_STATE_ID_SIZE);
}

void tk_encode_welcome(const tk_welcome *w, uint8_t out[TK_WELCOME_SIZE])
{
    welcome_signed(w, out);
    memcpy(out + 32, w->proof, TK_PROOF_SIZE);
}

tk_wire_result tk_decode_welcome(const uint8_t *buf, size_t len, tk_welcome *w)
{
    tk_wire_result res = fixed_frame(buf, len, TK_WELCOME_SIZE, TK_OP_WELCOME);
    if (res != TK_WIRE_OK)
        return res;
    w->status = buf[5];
    w->flags = buf[6];
    w->detail = get32(buf + 8);
    w->session_grace_ms = get32(buf + 12);
    memcpy(w->state_id, buf + 16, TK_STATE_ID_SIZE);
    memcpy(w->proof, buf + 32, TK_PROOF_SIZE);
    return TK_WIRE_OK;
}

static const char client_label[] = "ticketing/1 client";
static const char server_label[] = "ticketing/1 server";

/* HMAC-SHA256 over the concatenation of parts. */
static int hmac_parts(const void *key, size_t key_len, const void *const *parts, const size_t *lens,
                      int n, uint8_t out[TK_PROOF_SIZE])
{
    static const uint8_t empty = 0;
    int ok = 0;
    EVP_MAC *mac = EVP_MAC_fetch(NULL, "HMAC", NULL);
    EVP_MAC_CTX *ctx = mac ? EVP_MAC_CTX_new(mac) : NULL;
    if (ctx) {
        char digest[] = "SHA256";
        OSSL_PARAM params[] = {OSSL_PARAM_construct_utf8_string("digest", digest, 0), OSSL_PARAM_construct_end()};
        size_t outl = 0;
        if (EVP_MAC_init(ctx, key_len ? key : &empty, key_len, params) == 1) {
            ok = 1;
            for (int i = 0; i < n && ok; i++)
                ok = EVP_MAC_update(ctx, parts[i], lens[i]) == 1;
            ok = ok && EVP_MAC_final(ctx, out, &outl, TK_PROOF_SIZE) == 1 && outl == TK_PROOF_SIZE;
        }
    }
    EVP_MAC_CTX_free(ctx);
    EVP_MAC_free(mac);
    return ok ? 0 : -1;
}

int tk_client_proof(const void *token, size_t token_len, const uint8_t session_id[TK_SESSION_ID_SIZE],
                    const uint8_t client_nonce[TK_NONCE_SIZE], const uint8_t server_nonce[TK_NONCE_SIZE],
                    uint8_t out[TK_PROOF_SIZE])
{
    const void *parts[] = {client_label, session_id, client_nonce, server_nonce};
    const size_t lens[] = {sizeof client_label - 1, TK_SESSION_ID_SIZE, TK_NONCE_SIZE, TK_NONCE_SIZE};
    return hmac_parts(token, token_len, parts, lens, 4, out);
}

int tk_server_proof(const void *token, size_t token_len, const uint8_t session_id[TK_SESSION_ID_SIZE],
                    const uint8_t client_nonce[TK_NONCE_SIZE], const uint8_t server_nonce[TK_NONCE_SIZE],
                    const tk_welcome *w, uint8_t out[TK_PROOF_SIZE])
{
    uint8_t signed_bytes[32];
    welcome_signed(w, signed_bytes);
    const void *parts[] = {server_label, session_id, client_nonce, server_nonce, signed_bytes + 5};
    const size_t lens[] = {sizeof server_label - 1, TK_SESSION_ID_SIZE, TK_NONCE_SIZE, TK_NONCE_SIZE, 27};
    return hmac_parts(token, token_len, parts, lens, 5, out);
}

int tk_proof_equal(const uint8_t a[TK_PROOF_SIZE], const uint8_t b[TK_PROOF_SIZE])
{
    return CRYPTO_memcmp(a, b, TK_PROOF_SIZE) == 0;
}

const char *tk_op_name(unsigned op)
{
    switch (op) {
    case TK_OP_HELLO: return "HELLO";
    case TK_OP_CHALLENGE: return "CHALLENGE";
    case TK_OP_AUTH: return "AUTH";
    case TK_OP_WELCOME: return "WELCOME";
    case TK_OP_ACQUIRE: return "ACQUIRE";
    case TK_OP_RELEASE: return "RELEASE";
    case TK_OP_EXTEND: return "EXTEND";
    case TK_OP_CANCEL: return "CANCEL";
    case TK_OP_PING: return "PING";
    case TK_OP_INSPECT: return "INSPECT";
    case TK_OP_ACK: return "ACK";
    case TK_OP_EXPIRED: return "EXPIRED";
    case TK_OP_GOAWAY: return "GOAWAY";
    default: return NULL;
    }
}

const char *tk_status_name(unsigned status)
{
    static const char *const names[] = {"OK",   "TIMED_OUT",     "NOT_HELD",    "INVALID",
                                        "NOT_LEADER", "BUSY", "SHUTTING_DOWN", "AUTH_FAILED",
                                        "UNSUPPORTED_VERSION", "CANCELLED"};
    return status < sizeof names / sizeof names[0] ? names[status] : NULL;
}

const char *tk_invalid_field_name(unsigned field)
{
    static const char *const names[] = {NULL,    "LENGTH", "OP",         "FLAGS",     "KEY",    "LEASE",
                                        "WAIT", "TOKEN",  "REQUEST_ID", "HANDSHAKE", "SESSION"};
    return field < sizeof names / sizeof names[0] ? names[field] : NULL;
}

const char *tk_busy_limit_name(unsigned limit)
{
    static const char *const names[] = {NULL,   "CONNECTIONS", "WAITERS_PER_KEY", "WAITERS_TOTAL",
                                        "LOCKS", "INFLIGHT",   "STORAGE",         "SESSIONS"};
    return limit < sizeof names / sizeof names[0] ? names[limit] : NULL;
}

const char *tk_expired_reason_name(unsigned reason)
{
    return reason == TK_EXPIRED_LEASE ? "LEASE" : reason == TK_EXPIRED_STOPPING ? "STOPPING" : NULL;
}

const char *tk_goaway_reason_name(unsigned reason)
{
    return reason == TK_GOAWAY_LEADERSHIP ? "LEADERSHIP" : reason == TK_GOAWAY_STOPPING ? "STOPPING" : NULL;
}

const char *tk_inspect_flag_name(unsigned flag)
{
    switch (flag) {
    case TK_INSPECT_HELD: return "HELD";
    case TK_INSPECT_TOKEN_MATCH: return "TOKEN_MATCH";
    case TK_INSPECT_SESSION: return "SESSION";
    case TK_INSPECT_STALLED: return "STALLED";
    case TK_INSPECT_STARTUP: return "STARTUP";
    default: return NULL;
    }
}
