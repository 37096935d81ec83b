/*
 * The public non-blocking API (tk_async_*): creation and options, entry checks, close and free,
 * and thin wrappers over the engine in async.c.
 */
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <openssl/rand.h>

#include "internal.h"

#define DEFAULT_ENDPOINT "127.0.0.1:7070"

/* ---- creation, checks, close ------------------------------------------------------------- */

static int64_t dur_us(int64_t ms, int64_t def_ms)
{
    if (ms == 0)
        ms = def_ms;
    if (ms < 0)
        return -1;
    if (ms > INT64_MAX / 4000)
        ms = INT64_MAX / 4000;
    return ms * 1000;
}

tk_async *tk_async_new(const tk_options *o, tk_error *err)
{
    tk__clearerr(err);
    tk_options defaults;
    if (!o) {
        memset(&defaults, 0, sizeof defaults);
        o = &defaults;
    }
    if (o->n_endpoints > 0 && !o->endpoints) {
        tk__seterr(err, TK_ERR_INVALID_ARGUMENT, "invalid options: n_endpoints %zu without endpoints", o->n_endpoints);
        return NULL;
    }
    if (o->dial_timeout_ms < 0 || o->request_timeout_ms < 0 || o->backoff_min_ms < 0 || o->backoff_max_ms < 0 ||
        o->cleanup_timeout_ms < 0 || (o->heartbeat_ms < 0 && o->heartbeat_ms != TK_OFF)) {
        tk__seterr(err, TK_ERR_INVALID_ARGUMENT, "invalid options: negative duration (0 means the default)");
        return NULL;
    }
    tk_async *ac = calloc(1, sizeof *ac);
    if (!ac) {
        tk__seterr(err, TK_ERR_NO_MEMORY, "out of memory");
        return NULL;
    }
    ac->pid = tk__getpid();
    ac->fd = -1;
    ac->next_id = 1;
    size_t n = o->n_endpoints ? o->n_endpoints : 1;
    ac->endpoints = calloc(n, sizeof *ac->endpoints);
    if (!ac->endpoints)
        goto nomem;
    ac->n_endpoints = n;
    for (size_t i = 0; i < n; i++) {
        const char *e = o->n_endpoints ? o->endpoints[i] : DEFAULT_ENDPOINT;
        char host[256], port[8];
        if (!e || strlen(e) >= 260 || tk__split_hostport(e, host, sizeof host, port, sizeof port) != 0) {
            tk__seterr(err, TK_ERR_INVALID_ARGUMENT, "invalid endpoint \"%.100s\" (expected host:port or [v6]:port)",
                       e ? e : "(null)");
            tk__free(ac, false);
            return NULL;
        }
        if (!(ac->endpoints[i] = strdup(e)))
            goto nomem;
    }
    if (o->token) {
        ac->token_len = o->token_len ? o->token_len : strlen((const char *)o->token);
        ac->token = malloc(ac->token_len ? ac->token_len : 1);
        if (!ac->token)
            goto nomem;
        memcpy(ac->token, o->token, ac->token_len);
        ac->has_token = true;
    }
    ac->dial_timeout_us = dur_us(o->dial_timeout_ms, 5000);
    ac->request_timeout_us = dur_us(o->request_timeout_ms, 10000);
    ac->heartbeat_us = o->heartbeat_ms == TK_OFF ? 0 : dur_us(o->heartbeat_ms, 2000);
    ac->backoff_min_us = dur_us(o->backoff_min_ms, 50);
    ac->backoff_max_us = dur_us(o->backoff_max_ms, 2000);
    if (ac->backoff_max_us < ac->backoff_min_us)
        ac->backoff_max_us = ac->backoff_min_us;
    ac->cleanup_us = dur_us(o->cleanup_timeout_ms, 5000);
    ac->release_on_close = o->release_on_close != 0;
    ac->on_lost = o->on_lost;
    ac->on_lost_data = o->on_lost_data;
    ac->log = o->log;
    ac->log_data = o->log_data;
    for (int i = 0; i < 8; i++) {
        if (RAND_bytes(ac->session, sizeof ac->session) != 1) {
            tk__seterr(err, TK_ERR_NO_MEMORY, "no random bytes for the session id");
            tk__free(ac, false);
            return NULL;
        }
        if (memcmp(ac->session, (uint8_t[TK_SESSION_ID_SIZE]){0}, TK_SESSION_ID_SIZE) != 0)
            break;
    }
    if (RAND_bytes((unsigned char *)&ac->rng, sizeof ac->rng) != 1 || ac->rng == 0)
        ac->rng = 0x9E3779B97F4A7C15ull;
    if (tk__conn_setup(ac, o, err) != TK_OK) {
        tk__free(ac, false);
        return NULL;
    }
    return ac;
nomem:
    tk__seterr(err, TK_ERR_NO_MEMORY, "out of memory");
    tk__free(ac, false);
    return NULL;
}

tk_err tk__check_usable(tk_async *ac, tk_error *err)
{
    if (!ac)
        return tk__seterr(err, TK_ERR_INVALID_ARGUMENT, "invalid argument: NULL context");
    if (tk__getpid() != ac->pid)
        return tk__seterr(err, TK_ERR_FORKED,
                          "this client was created in process %ld before fork(); create a new client in this process",
                          (long)ac->pid);
    if (ac->cs == TK__C_CLOSED)
        return tk__seterr(err, TK_ERR_CLOSED, "the client is closed");
    if (ac->cs == TK__C_FAILED)
        return tk__seterr(err, ac->last_conn_err.code ? ac->last_conn_err.code : TK_ERR_UNAVAILABLE, "not connected: %s",
                          ac->last_conn_err.message);
    return TK_OK;
}

void tk__close(tk_async *ac)
{
    if (ac->cs == TK__C_CLOSED)
        return;
    /* Queued acquires are withdrawn before the connection goes (a closed client must not be
     * granted a lock it would hold until its session ends). tk_client_close waits for the
     * answers; here the CANCELs are written if the socket takes them now. */
    if (ac->cs == TK__C_READY && tk__getpid() == ac->pid) {
        tk__withdraw_acquires(ac);
        if (!ac->ssl_read_wants_write)
            tk__conn_flush(ac);
    }
    tk__conn_teardown(ac, true);
    ac->cs = TK__C_CLOSED;
    tk__fail_all(ac, TK_ERR_CLOSED, "the client was closed");
    if (ac->connect_cb) {
        tk_event *ev = tk__event_new(ac);
        if (ev) {
            ev->kind = TK__EV_CONNECT;
            ev->ccb = ac->connect_cb;
            ev->data = ac->connect_data;
            tk__seterr(&ev->error, TK_ERR_CLOSED, "the client was closed");
            tk__queue_event(ac, ev);
        }
        ac->connect_cb = NULL;
    }
    for (tk_lock *l = ac->locks; l; l = l->next) {
        tk__heap_del(&ac->heap, &l->lost_timer);
        tk__heap_del(&ac->heap, &l->ka_timer);
    }
}

void tk__free(tk_async *ac, bool forked_child)
{
    if (!ac)
        return;
    if (forked_child) {
        /* the parent owns the connection: close our copy of the socket, send nothing */
        if (ac->fd >= 0)
            close(ac->fd);
        ac->fd = -1;
        if (ac->ssl) {
            SSL_set_quiet_shutdown(ac->ssl, 1);
            SSL_free(ac->ssl);
            ac->ssl = NULL;
        }
        ac->cs = TK__C_CLOSED;
    }
    tk__close(ac);
    tk__drop_events(tk__take_events(ac));
    for (tk_req *r = ac->req_head, *next; r; r = next) {
        next = r->next;
        tk__req_remove(ac, r);
    }
    tk__lock_detach_all(ac);
    tk__drop_events(tk__take_events(ac));
    tk__heap_free(&ac->heap);
    tk__pools_free(ac);
    free(ac->htab);
    tk__buf_free(&ac->rbuf);
    tk__buf_free(&ac->wbuf);
    for (size_t i = 0; i < ac->n_endpoints && ac->endpoints; i++)
        free(ac->endpoints[i]);
    free(ac->endpoints);
    free(ac->token);
    free(ac->tls_server_name);
    free(ac->hint);
    free(ac->round_hint);
    if (ac->ssl_ctx)
        SSL_CTX_free(ac->ssl_ctx);
    if (ac->bio_method)
        BIO_meth_free(ac->bio_method);
    free(ac);
}

/* ---- the public non-blocking API --------------------------------------------------------- */

/* Records a failure on the handle and returns its code. */
static tk_err fail(tk_async *ac, tk_err code, const tk_error *e)
{
    if (ac && code != TK_OK && code != TK_ERR_FORKED)
        tk__set_last_error(ac, e);
    return code;
}

/* Entry check for public calls on a bare context (tk_client contexts go through client.c). */
static tk_err enter(tk_async *ac, tk_error *e)
{
    tk__clearerr(e);
    if (ac && ac->owner)
        return tk__seterr(e, TK_ERR_INVALID_ARGUMENT, "this context belongs to a tk_client; use the tk_client calls");
    return tk__check_usable(ac, e);
}

tk_err tk_async_connect(tk_async *ac, tk_connect_cb cb, void *data)
{
    tk_error e;
    tk_err rc = enter(ac, &e);
    if (rc != TK_OK)
        return fail(ac, rc, &e);
    if (ac->cs != TK__C_IDLE || ac->connected_once)
        return fail(ac, tk__seterr(&e, TK_ERR_INVALID_ARGUMENT, "tk_async_connect: already started"), &e);
    ac->connect_cb = cb;
    ac->connect_data = data;
    tk__conn_start_round(ac, true);
    tk__maybe_dispatch(ac); /* a failed first round reports at once */
    return TK_OK;
}

int tk_async_fd(const tk_async *ac) { return ac ? ac->fd : -1; }

int tk_async_want_read(const tk_async *ac) { return ac && ac->fd >= 0 && tk__conn_want_read(ac); }

int tk_async_want_write(const tk_async *ac) { return ac && ac->fd >= 0 && tk__conn_want_write(ac); }

int tk_async_timeout_ms(const tk_async *ac)
{
    if (!ac || ac->cs == TK__C_CLOSED || ac->cs == TK__C_FAILED)
        return -1;
    if (ac->ev_head)
        return 0;
    int64_t t = tk__conn_next_timer(ac);
    tk_timer *top = tk__heap_top(&ac->heap);
    if (top && top->at < t)
        t = top->at;
    int64_t now = tk__now_us();
    /* A poll timeout stops while the host is suspended; the lock deadlines do not: with locks
     * held, look at them at least every LOST_CHECK_MS (after a resume, lost fires within it). */
    if (ac->n_held > 0 && t - now > (int64_t)TK_LOST_CHECK_MS * 1000)
        t = now + (int64_t)TK_LOST_CHECK_MS * 1000;
    if (t == INT64_MAX)
        return -1;
    int64_t d = t - now;
    if (d <= 0)
        return 0;
    d = (d + 999) / 1000;
    return d > INT32_MAX ? INT32_MAX : (int)d;
}

tk_err tk_async_process(tk_async *ac, int events)
{
    tk_error e;
    tk_err rc = enter(ac, &e);
    if (rc == TK_ERR_CLOSED || rc == TK_ERR_FORKED || rc == TK_ERR_INVALID_ARGUMENT)
        return rc;
    tk__process(ac, events);
    rc = ac->cs == TK__C_CLOSED ? TK_ERR_CLOSED : TK_OK;
    tk__maybe_dispatch(ac); /* may free ac (tk_async_free inside a callback) */
    return rc;
}

tk_err tk_async_process_input(tk_async *ac) { return tk_async_process(ac, TK_EV_READ); }

tk_err tk_async_process_output(tk_async *ac) { return tk_async_process(ac, TK_EV_WRITE); }

tk_err tk_async_acquire(tk_async *ac, const void *key, size_t key_len, int64_t lease_ms, int64_t wait_ms,
                        const tk_acquire_opts *opts, tk_reply_cb cb, void *data, uint64_t *request_id)
{
    tk_error e;
    tk_err rc = enter(ac, &e);
    if (rc == TK_OK)
        rc = tk__acquire(ac, key, key_len, lease_ms, wait_ms, opts, cb, data, request_id, &e);
    else
        tk__opts_discard(opts);
    return fail(ac, rc, &e);
}

tk_err tk_async_cancel(tk_async *ac, uint64_t request_id)
{
    tk_error e;
    tk_err rc = enter(ac, &e);
    if (rc == TK_OK)
        rc = tk__cancel(ac, request_id, &e);
    fail(ac, rc, &e);
    if (rc != TK_ERR_FORKED && ac)
        tk__maybe_dispatch(ac);
    return rc;
}

static tk_err lock_call(tk_async *ac, tk_lock *lock, uint8_t op, int64_t lease_ms, bool verify, tk_reply_cb cb, void *data)
{
    tk_error e;
    tk_err rc = enter(ac, &e);
    if (rc == TK_OK && !lock)
        rc = tk__seterr(&e, TK_ERR_INVALID_ARGUMENT, "invalid argument: NULL lock");
    if (rc == TK_OK && lock->ac != ac)
        rc = tk__seterr(&e, TK_ERR_INVALID_ARGUMENT, "invalid argument: the lock belongs to another context");
    if (rc == TK_OK)
        rc = tk__simple(ac, op, NULL, 0, 0, lease_ms, lock, verify, cb, data, &e);
    fail(ac, rc, &e);
    if (rc == TK_OK)
        tk__maybe_dispatch(ac);
    return rc;
}

tk_err tk_async_release(tk_async *ac, tk_lock *lock, tk_reply_cb cb, void *data)
{
    return lock_call(ac, lock, TK_OP_RELEASE, 0, false, cb, data);
}

tk_err tk_async_extend(tk_async *ac, tk_lock *lock, int64_t lease_ms, tk_reply_cb cb, void *data)
{
    return lock_call(ac, lock, TK_OP_EXTEND, lease_ms, false, cb, data);
}

tk_err tk_async_verify(tk_async *ac, tk_lock *lock, tk_reply_cb cb, void *data)
{
    return lock_call(ac, lock, TK_OP_INSPECT, 0, true, cb, data);
}

static tk_err key_call(tk_async *ac, uint8_t op, const void *key, size_t key_len, uint64_t token, int64_t lease_ms,
                       tk_reply_cb cb, void *data)
{
    tk_error e;
    tk_err rc = enter(ac, &e);
    if (rc == TK_OK)
        rc = tk__simple(ac, op, key, key_len, token, lease_ms, NULL, false, cb, data, &e);
    return fail(ac, rc, &e);
}

tk_err tk_async_release_token(tk_async *ac, const void *key, size_t key_len, uint64_t token, tk_reply_cb cb, void *data)
{
    return key_call(ac, TK_OP_RELEASE, key, key_len, token, 0, cb, data);
}

tk_err tk_async_extend_token(tk_async *ac, const void *key, size_t key_len, uint64_t token, int64_t lease_ms,
                             tk_reply_cb cb, void *data)
{
    return key_call(ac, TK_OP_EXTEND, key, key_len, token, lease_ms, cb, data);
}

tk_err tk_async_inspect(tk_async *ac, const void *key, size_t key_len, uint64_t token, tk_reply_cb cb, void *data)
{
    return key_call(ac, TK_OP_INSPECT, key, key_len, token, 0, cb, data);
}

tk_err tk_async_ping(tk_async *ac, tk_reply_cb cb, void *data)
{
    return key_call(ac, TK_OP_PING, NULL, 0, 0, 0, cb, data);
}

void tk_async_close(tk_async *ac)
{
    if (!ac || ac->owner || tk__getpid() != ac->pid)
        return;
    tk__close(ac);
    tk__maybe_dispatch(ac);
}

void tk_async_free(tk_async *ac)
{
    if (!ac || ac->owner)
        return;
    if (tk__getpid() != ac->pid) {
        tk__free(ac, true);
        return;
    }
    if (ac->in_dispatch) {
        tk__close(ac);
        ac->free_pending = true;
        return;
    }
    tk__close(ac);
    tk__dispatch(ac);
    tk__free(ac, false);
}

tk_err tk_async_err(const tk_async *ac) { return ac ? ac->err : TK_ERR_INVALID_ARGUMENT; }

const char *tk_async_errstr(const tk_async *ac) { return ac ? ac->errstr : "NULL context"; }

void tk_async_session_id(const tk_async *ac, uint8_t out[TK_SESSION_ID_SIZE])
{
    if (ac && out)
        memcpy(out, ac->session, TK_SESSION_ID_SIZE);
}
