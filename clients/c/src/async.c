/*
 * The protocol engine: requests (ids in send order, a table by id, timeouts), answers, pushes,
 * the session rules after each WELCOME (resume, session lost, server restarted), ACK, cancel,
 * callbacks as queued events, and the public tk_async API.
 */
#include <errno.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <openssl/rand.h>

#include "internal.h"

#define MAX_REDIRECTS 16       /* NOT_LEADER / SHUTTING_DOWN moves of one request */
#define MAX_TIMERS_PER_CALL 100000



void tk__log(tk_async *ac, int level, const char *fmt, ...)
{
    if (!ac->log)
        return;
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    ac->log(level, msg, ac->log_data);
}

void tk__set_last_error(tk_async *ac, const tk_error *e)
{
    ac->err = e->code;
    snprintf(ac->errstr, sizeof ac->errstr, "%s", e->message);
}

/* ---- the request table ------------------------------------------------------------------- */

static size_t hslot(const tk_async *ac, uint64_t id)
{
    return (size_t)((id * 0x9E3779B97F4A7C15ull) >> 20) & (ac->hcap - 1);
}

static int hgrow(tk_async *ac)
{
    size_t ncap = ac->hcap ? ac->hcap * 2 : 64;
    tk_req **n = calloc(ncap, sizeof *n);
    if (!n)
        return -1;
    tk_req **old = ac->htab;
    size_t ocap = ac->hcap;
    ac->htab = n;
    ac->hcap = ncap;
    for (size_t i = 0; i < ocap; i++) {
        for (tk_req *r = old[i], *next; r; r = next) {
            next = r->hnext;
            size_t s = hslot(ac, r->id);
            r->hnext = n[s];
            n[s] = r;
        }
    }
    free(old);
    return 0;
}

static tk_req *hfind(const tk_async *ac, uint64_t id)
{
    if (!ac->hcap)
        return NULL;
    for (tk_req *r = ac->htab[hslot(ac, id)]; r; r = r->hnext)
        if (r->id == id)
            return r;
    return NULL;
}

static void hdel(tk_async *ac, tk_req *r)
{
    if (!ac->hcap)
        return;
    for (tk_req **pp = &ac->htab[hslot(ac, r->id)]; *pp; pp = &(*pp)->hnext) {
        if (*pp == r) {
            *pp = r->hnext;
            ac->hcount--;
            return;
        }
    }
}

tk_req *tk__req_new(tk_async *ac, uint8_t op, uint8_t kind)
{
    tk_req *r = ac->req_pool;
    if (r) {
        TK__UNPOISON(r, sizeof *r);
        ac->req_pool = r->next;
        ac->n_req_pool--;
        memset(r, 0, offsetof(tk_req, kbuf));
    } else if (!(r = calloc(1, sizeof *r))) {
        return NULL;
    }
    r->op = op;
    r->kind = kind;
    tk__timer_init(&r->deadline, TK__T_REQ_DEADLINE);
    tk__timer_init(&r->cleanup, TK__T_REQ_CLEANUP);
    return r;
}

int tk__req_set_key(tk_req *r, const uint8_t *key, size_t len)
{
    uint8_t *k = r->kbuf;
    if (len > sizeof r->kbuf && !(k = malloc(len)))
        return -1;
    if (len)
        memcpy(k, key, len);
    r->key = k;
    r->key_len = len;
    return 0;
}

static void req_free(tk_async *ac, tk_req *r)
{
    tk__opts_discard(&r->aopts); /* no lock took the lost callback's data */
    if (r->lock)
        tk__lock_unref(r->lock);
    if (r->ev)
        tk__drop_events(r->ev);
    if (r->key != r->kbuf)
        free(r->key);
    r->key = NULL;
    if (ac->n_req_pool < TK__POOL_MAX) {
        r->next = ac->req_pool;
        ac->req_pool = r;
        ac->n_req_pool++;
        TK__POISON(r, sizeof *r);
    } else {
        free(r);
    }
}

void tk__req_discard(tk_async *ac, tk_req *r)
{
    if (r)
        req_free(ac, r);
}

void tk__req_remove(tk_async *ac, tk_req *r)
{
    tk__heap_del(&ac->heap, &r->deadline);
    tk__heap_del(&ac->heap, &r->cleanup);
    hdel(ac, r);
    if (r->prev)
        r->prev->next = r->next;
    else
        ac->req_head = r->next;
    if (r->next)
        r->next->prev = r->prev;
    else
        ac->req_tail = r->prev;
    if (r->id == ac->hb_id)
        ac->hb_id = 0;
    if (r->id == ac->ack_id)
        ac->ack_id = 0;
    req_free(ac, r);
}

/* Encodes r into wbuf (the connection is READY); now: the clock read just before. */
static void req_encode(tk_async *ac, tk_req *r, int64_t now)
{
    tk_request q = {.op = r->op, .id = r->id, .token = r->token, .lease_ms = r->lease_ms, .wait_ms = r->wait_ms,
                    .key = r->key, .key_len = r->key_len};
    size_t n = TK_HEADER_SIZE + r->key_len;
    if (tk__buf_reserve(&ac->wbuf, n) != 0) {
        tk__conn_fail(ac, TK_ERR_NO_MEMORY, "out of memory");
        return;
    }
    tk_encode_request(&q, ac->wbuf.p + ac->wbuf.len, n);
    ac->wbuf.len += n;
    /* A re-send (resume, another node) keeps t_first: the server counts from the first arrival.
     * (ever_sent is cleared only when the session was lost: the server then has nothing of it.) */
    if (!r->ever_sent)
        r->t_first = now;
    if (r->op == TK_OP_ACQUIRE && r->kind == TK__R_USER && !r->ever_sent && !r->abandoned) {
        /* the request timeout now covers only what is not queue time: wait + request timeout */
        if (r->wait_ms == TK_WAIT_FOREVER_MS)
            tk__heap_del(&ac->heap, &r->deadline);
        else
            tk__heap_set(&ac->heap, &r->deadline, now + (int64_t)r->wait_ms * 1000 + ac->request_timeout_us);
    }
    r->sent = true;
    r->ever_sent = true;
    r->not_run = false;
}

void tk__req_submit(tk_async *ac, tk_req *r)
{
    r->id = ac->next_id++;
    r->t_submit = tk__now_us();
    if (ac->hcount >= ac->hcap && hgrow(ac) != 0 && ac->hcap == 0) {
        /* no table at all: cannot track it */
        if (r->ev) {
            tk_error e;
            tk__seterr(&e, TK_ERR_NO_MEMORY, "out of memory");
            r->ev->error = e;
            r->ev->reply.code = e.code;
            tk__queue_event(ac, r->ev);
            r->ev = NULL;
        }
        req_free(ac, r);
        return;
    }
    size_t s = hslot(ac, r->id);
    r->hnext = ac->htab[s];
    ac->htab[s] = r;
    ac->hcount++;
    r->prev = ac->req_tail;
    r->next = NULL;
    if (ac->req_tail)
        ac->req_tail->next = r;
    else
        ac->req_head = r;
    ac->req_tail = r;
    if (r->kind == TK__R_USER)
        tk__heap_set(&ac->heap, &r->deadline, r->t_submit + ac->request_timeout_us);
    else if (r->kind == TK__R_HEARTBEAT)
        tk__heap_set(&ac->heap, &r->deadline, r->t_submit + tk__ping_wait_us(ac));
    if (ac->cs == TK__C_READY)
        req_encode(ac, r, r->t_submit);
}

void tk__send_pending(tk_async *ac)
{
    unsigned gen = ac->conn_gen;
    int64_t now = tk__now_us();
    for (tk_req *r = ac->req_head; r && ac->cs == TK__C_READY && ac->conn_gen == gen; r = r->next)
        if (!r->sent)
            req_encode(ac, r, now);
}

/* ---- events ------------------------------------------------------------------------------ */

tk_event *tk__event_new(tk_async *ac)
{
    tk_event *ev = ac->ev_pool;
    if (!ev)
        return calloc(1, sizeof *ev);
    TK__UNPOISON(ev, sizeof *ev);
    ac->ev_pool = ev->next;
    ac->n_ev_pool--;
    memset(ev, 0, offsetof(tk_event, error));
    ev->error.code = TK_OK;
    ev->error.reason = TK_LOST_NONE;
    ev->error.status = 0;
    ev->error.detail = 0;
    ev->error.message[0] = '\0';
    return ev;
}

/* Frees ev, or keeps it for reuse by this context. */
static void event_recycle(tk_async *ac, tk_event *ev)
{
    if (ac->n_ev_pool < TK__POOL_MAX) {
        ev->next = ac->ev_pool;
        ac->ev_pool = ev;
        ac->n_ev_pool++;
        TK__POISON(ev, sizeof *ev);
    } else {
        free(ev);
    }
}

void tk__pools_free(tk_async *ac)
{
    for (tk_req *r = ac->req_pool, *next; r; r = next) {
        TK__UNPOISON(r, sizeof *r);
        next = r->next;
        free(r);
    }
    for (tk_event *ev = ac->ev_pool, *next; ev; ev = next) {
        TK__UNPOISON(ev, sizeof *ev);
        next = ev->next;
        free(ev);
    }
    for (tk_lock *l = ac->lock_pool, *next; l; l = next) {
        TK__UNPOISON(l, sizeof *l);
        next = l->next;
        free(l);
    }
    ac->req_pool = NULL;
    ac->ev_pool = NULL;
    ac->lock_pool = NULL;
    ac->n_req_pool = ac->n_ev_pool = ac->n_lock_pool = 0;
}

void tk__queue_event(tk_async *ac, tk_event *ev)
{
    ev->next = NULL;
    if (ac->ev_tail)
        ac->ev_tail->next = ev;
    else
        ac->ev_head = ev;
    ac->ev_tail = ev;
}

tk_event *tk__take_events(tk_async *ac)
{
    tk_event *ev = ac->ev_head;
    ac->ev_head = ac->ev_tail = NULL;
    return ev;
}

static void event_release(tk_event *ev)
{
    if (ev->kind == TK__EV_LOST && ev->lock)
        tk__lock_unref(ev->lock);
    free(ev);
}

void tk__run_events(tk_event *ev)
{
    while (ev) {
        tk_event *next = ev->next;
        switch (ev->kind) {
        case TK__EV_REPLY:
            ev->reply.error = &ev->error;
            ev->reply.inspect = &ev->inspect;
            if (ev->cb)
                ev->cb(NULL, &ev->reply, ev->data);
            else if (ev->reply.lock)
                tk_lock_drop(ev->reply.lock);
            break;
        case TK__EV_LOST: {
            /* read the handle's state under the client's mutex; call without it */
            tk_lock *l = ev->lock;
            tk_client *c = l && l->ac ? l->ac->owner : NULL;
            tk__client_lock(c);
            tk_lost_cb cb = l && !l->user_freed ? l->on_lost : NULL;
            void *data = l ? l->on_lost_data : NULL;
            tk__client_unlock_plain(c);
            if (cb)
                cb(l, ev->error.reason, data);
            break;
        }
        case TK__EV_CONNECT:
            if (ev->ccb)
                ev->ccb(NULL, &ev->error, ev->data);
            break;
        }
        /* the lost event's lock reference is dropped under the client's mutex */
        if (ev->kind == TK__EV_LOST && ev->lock) {
            tk_client *c = ev->lock->ac ? ev->lock->ac->owner : NULL;
            tk__client_lock(c);
            event_release(ev);
            if (c)
                tk__client_unlock(c);
        } else {
            free(ev);
        }
        ev = next;
    }
}

void tk__drop_events(tk_event *ev)
{
    while (ev) {
        tk_event *next = ev->next;
        if (ev->kind == TK__EV_REPLY && ev->reply.lock)
            tk_lock_free(ev->reply.lock);
        event_release(ev);
        ev = next;
    }
}

void tk__dispatch(tk_async *ac)
{
    if (ac->in_dispatch)
        return;
    ac->in_dispatch = true;
    for (int guard = 0; ac->ev_head && guard < 1000000; guard++) {
        tk_event *ev = ac->ev_head;
        ac->ev_head = ev->next;
        if (!ac->ev_head)
            ac->ev_tail = NULL;
        ev->next = NULL;
        switch (ev->kind) {
        case TK__EV_REPLY:
            ev->reply.error = &ev->error;
            ev->reply.inspect = &ev->inspect;
            if (ev->cb)
                ev->cb(ac, &ev->reply, ev->data);
            else if (ev->reply.lock)
                tk_lock_drop(ev->reply.lock);
            break;
        case TK__EV_LOST:
            if (ev->lock && !ev->lock->user_freed && ev->lock->on_lost)
                ev->lock->on_lost(ev->lock, ev->error.reason, ev->lock->on_lost_data);
            break;
        case TK__EV_CONNECT:
            if (ev->ccb)
                ev->ccb(ac, &ev->error, ev->data);
            break;
        }
        if (ev->kind == TK__EV_LOST && ev->lock)
            tk__lock_unref(ev->lock);
        event_recycle(ac, ev);
    }
    ac->in_dispatch = false;
    if (ac->free_pending)
        tk__free(ac, false);
}

void tk__maybe_dispatch(tk_async *ac)
{
    if (!ac->defer_dispatch && !ac->in_dispatch)
        tk__dispatch(ac);
}

/* Queues the caller's completion of r (once). e may be NULL for success. */
void tk__complete(tk_async *ac, tk_req *r, tk_err code, const tk_error *e)
{
    if (r->completed || !r->ev)
        return;
    r->completed = true;
    tk_event *ev = r->ev;
    r->ev = NULL;
    if (e) {
        ev->error = *e;
    } else if (code == TK_OK || ev->error.code != code || !ev->error.message[0]) {
        tk__clearerr(&ev->error);
        if (code != TK_OK)
            snprintf(ev->error.message, sizeof ev->error.message, "%s", tk_strerror(code));
    }
    ev->error.code = code;
    ev->reply.code = code;
    ev->reply.request_id = r->id;
    if (code != TK_OK && r->kind == TK__R_USER)
        tk__set_last_error(ac, &ev->error);
    tk__queue_event(ac, ev);
}

/* Completes r with code and a formatted message. */
static void complete_msg(tk_async *ac, tk_req *r, tk_err code, const char *fmt, ...) __attribute__((format(printf, 4, 5)));
static void complete_msg(tk_async *ac, tk_req *r, tk_err code, const char *fmt, ...)
{
    tk_error e;
    tk__clearerr(&e);
    e.code = code;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(e.message, sizeof e.message, fmt, ap);
    va_end(ap);
    for (char *p = e.message; *p; p++)
        if (*p == '\n' || *p == '\r')
            *p = ' ';
    tk__complete(ac, r, code, &e);
}

static const char *op_word(uint8_t op)
{
    switch (op) {
    case TK_OP_ACQUIRE: return "acquire";
    case TK_OP_RELEASE: return "release";
    case TK_OP_EXTEND: return "extend";
    case TK_OP_CANCEL: return "cancel";
    case TK_OP_PING: return "ping";
    case TK_OP_INSPECT: return "inspect";
    default: return "request";
    }
}

/* ---- session rules ----------------------------------------------------------------------- */

static void abandon(tk_async *ac, tk_req *r, tk_err code);

void tk__fail_all(tk_async *ac, tk_err code, const char *msg)
{
    for (tk_req *r = ac->req_head, *next; r; r = next) {
        next = r->next;
        if (r->lock && r->op == TK_OP_RELEASE)
            tk__lock_release_failed(ac, r->lock);
        if (r->lock && r->kind == TK__R_KEEPALIVE)
            r->lock->ka_inflight = false;
        if (r->abandoned)
            tk__complete(ac, r, r->abandon_code, NULL);
        else
            complete_msg(ac, r, code, "%s: %s", op_word(r->op), msg);
        tk__req_remove(ac, r);
    }
}

void tk__on_disconnect(tk_async *ac)
{
    int64_t now = tk__now_us();
    ac->disconnected_at = now;
    ac->session_gone = false;
    for (tk_req *r = ac->req_head, *next; r; r = next) {
        next = r->next;
        if (r->kind == TK__R_HEARTBEAT || r->kind == TK__R_ACK) {
            tk__req_remove(ac, r);
            continue;
        }
        if (r->kind == TK__R_KEEPALIVE) {
            /* extend again once reconnected */
            tk_lock *l = r->lock;
            l->ka_inflight = false;
            if (l->keepalive && l->held && !l->user_freed)
                tk__heap_set(&ac->heap, &l->ka_timer, now);
            tk__req_remove(ac, r);
            continue;
        }
        r->sent = false;
    }
    ac->hb_id = ac->ack_id = 0;
    if (ac->grace_ms == 0) {
        ac->session_gone = true;
        tk__session_lost(ac, TK_ERR_CONNECTION_LOST, "the server keeps no session after a drop (session grace 0)");
    }
}

void tk__session_lost(tk_async *ac, tk_err code, const char *why)
{
    for (tk_req *r = ac->req_head, *next; r; r = next) {
        next = r->next;
        if (!r->ever_sent || r->not_run) {
            r->ever_sent = false; /* a new request for the next session */
            continue;
        }
        switch (r->kind) {
        case TK__R_USER:
            if (r->abandoned) {
                complete_msg(ac, r, r->abandon_code, "acquire abandoned; %s", why);
            } else if (r->op == TK_OP_ACQUIRE) {
                char k[128];
                tk__fmt_key(k, sizeof k, r->key, r->key_len);
                complete_msg(ac, r, code,
                             "connection lost while acquiring %s: %s (if it was granted, that lock runs out its lease)",
                             k, why);
            } else {
                if (r->lock && r->op == TK_OP_RELEASE)
                    tk__lock_release_failed(ac, r->lock);
                complete_msg(ac, r, code, "connection lost during %s: %s (its outcome is unknown)", op_word(r->op), why);
            }
            tk__req_remove(ac, r);
            break;
        case TK__R_CANCEL:
            tk__req_remove(ac, r);
            break;
        default:
            /* releases of tokens we hold: send them again, as new requests */
            r->ever_sent = false;
            break;
        }
    }
}

/* A reconnect found another state id: every lock is lost, every request fails, new session. */
static void server_restarted(tk_async *ac, const tk_welcome *w)
{
    tk__log(ac, 2, "%s serves a different lock state (the server restarted): every lock is lost", ac->cur_addr);
    for (tk_lock *l = ac->locks, *next; l; l = next) {
        next = l->next;
        if (l->held)
            tk__lock_lost(ac, l, TK_LOST_SERVER_RESTARTED);
    }
    for (tk_req *r = ac->req_head, *next; r; r = next) {
        next = r->next;
        /* A caller's request that never reached the old server (made while the client was
         * reconnecting, or answered NOT_LEADER) goes to the new one as a new request; one that
         * acts on a lock of the old state is answered at once. */
        if (r->kind == TK__R_USER && !r->abandoned && !r->completed && (!r->ever_sent || r->not_run)) {
            if (r->lock && (r->op == TK_OP_RELEASE || r->op == TK_OP_EXTEND)) {
                char k[128];
                tk__fmt_key(k, sizeof k, r->key, r->key_len);
                tk_error e;
                tk__seterr(&e, TK_ERR_LOCK_LOST, "lock lost (%s)%s: %s token %llu",
                           tk_lost_reason_str(r->lock->reason), r->op == TK_OP_RELEASE ? " before the release" : "", k,
                           (unsigned long long)r->token);
                e.reason = r->lock->reason;
                r->lock->releasing = false;
                tk__complete(ac, r, TK_ERR_LOCK_LOST, &e);
                tk__req_remove(ac, r);
                continue;
            }
            r->ever_sent = false;
            r->not_run = false;
            r->sent = false;
            continue;
        }
        if (r->abandoned)
            complete_msg(ac, r, r->abandon_code, "acquire abandoned; the server restarted meanwhile");
        else if (r->op == TK_OP_ACQUIRE)
            complete_msg(ac, r, TK_ERR_SERVER_RESTARTED,
                         "server restarted (its state id changed) while acquiring: the wait is not re-queued");
        else
            complete_msg(ac, r, TK_ERR_SERVER_RESTARTED,
                         "server restarted (its state id changed) during %s: its outcome on the old server is unknown",
                         op_word(r->op));
        if (r->lock && r->op == TK_OP_RELEASE)
            r->lock->releasing = false;
        tk__req_remove(ac, r);
    }
    memcpy(ac->state_id, w->state_id, TK_STATE_ID_SIZE);
    /* start over with a new session id */
    uint8_t s[TK_SESSION_ID_SIZE];
    for (int i = 0; i < 8; i++) {
        if (RAND_bytes(s, sizeof s) == 1 && memcmp(s, (uint8_t[TK_SESSION_ID_SIZE]){0}, sizeof s) != 0)
            break;
        s[TK_SESSION_ID_SIZE - 1] = 1;
    }
    memcpy(ac->session, s, sizeof s);
    ac->disconnected_at = 0;
    ac->session_gone = false;
    tk__conn_teardown(ac, true);
    ac->cs = TK__C_IDLE;
    ac->round_no = 0;
    tk__conn_start_round(ac, true);
}

void tk__on_ready(tk_async *ac, const tk_welcome *w)
{
    bool resumed = (w->flags & TK_WELCOME_RESUMED) != 0;
    if (!ac->have_state) {
        ac->have_state = true;
        memcpy(ac->state_id, w->state_id, TK_STATE_ID_SIZE);
    } else if (memcmp(ac->state_id, w->state_id, TK_STATE_ID_SIZE) != 0) {
        server_restarted(ac, w);
        return;
    } else if (!resumed && !ac->session_gone) {
        tk__session_lost(ac, TK_ERR_CONNECTION_LOST, "the server did not resume the session");
    }
    ac->grace_ms = w->session_grace_ms;
    ac->disconnected_at = 0;
    ac->session_gone = false;
    if (!ac->connected_once) {
        ac->connected_once = true;
        if (ac->connect_cb) {
            tk_event *ev = tk__event_new(ac);
            if (ev) {
                ev->kind = TK__EV_CONNECT;
                ev->ccb = ac->connect_cb;
                ev->data = ac->connect_data;
                tk__clearerr(&ev->error);
                tk__queue_event(ac, ev);
            }
            ac->connect_cb = NULL;
        }
    }
    tk__send_pending(ac);
    tk__conn_flush(ac);
}

/* ---- answers ----------------------------------------------------------------------------- */

static void status_error(tk_async *ac, tk_req *r, const tk_response *resp)
{
    char msg[160];
    size_t n = resp->data_len < sizeof msg - 1 ? resp->data_len : sizeof msg - 1;
    memcpy(msg, resp->data, n);
    msg[n] = '\0';
    char k[128] = "";
    if (r->key_len)
        tk__fmt_key(k, sizeof k, r->key, r->key_len);
    tk_error e;
    tk__clearerr(&e);
    e.status = resp->status;
    e.detail = resp->detail;
    const char *name;
    switch (resp->status) {
    case TK_STATUS_INVALID:
        name = tk_invalid_field_name(resp->detail);
        e.code = TK_ERR_INVALID_ARGUMENT;
        snprintf(e.message, sizeof e.message, "invalid argument (%s) in %s%s%s: %s", name ? name : "field", op_word(r->op),
                 k[0] ? " of " : "", k, msg);
        break;
    case TK_STATUS_BUSY:
        name = tk_busy_limit_name(resp->detail);
        e.code = TK_ERR_BUSY;
        snprintf(e.message, sizeof e.message, "server busy (limit %s) in %s%s%s: %s", name ? name : "unknown",
                 op_word(r->op), k[0] ? " of " : "", k, msg);
        break;
    case TK_STATUS_SHUTTING_DOWN:
        e.code = TK_ERR_SHUTTING_DOWN;
        snprintf(e.message, sizeof e.message, "server shutting down (%s%s%s)", op_word(r->op), k[0] ? " of " : "", k);
        break;
    case TK_STATUS_NOT_LEADER:
        e.code = TK_ERR_UNAVAILABLE;
        snprintf(e.message, sizeof e.message, "no leader found for %s after %u moves", op_word(r->op), r->redirects);
        break;
    default:
        name = tk_status_name(resp->status);
        e.code = TK_ERR_PROTOCOL;
        snprintf(e.message, sizeof e.message, "unexpected status %s (%u) to %s%s%s%s%s", name ? name : "unknown",
                 resp->status, op_word(r->op), k[0] ? " of " : "", k, msg[0] ? ": " : "", msg);
        break;
    }
    for (char *p = e.message; *p; p++)
        if (*p == '\n' || *p == '\r')
            *p = ' ';
    tk__complete(ac, r, e.code, &e);
}

/* Submits a RELEASE of a grant that nobody will use (it raced a cancel or a timeout). The
 * caller's completion, when still due, moves to that release. */
static void release_raced_grant(tk_async *ac, tk_req *acq, uint64_t token)
{
    tk_req *rel = tk__req_new(ac, TK_OP_RELEASE, TK__R_CLEANUP);
    if (!rel || tk__req_set_key(rel, acq->key, acq->key_len) != 0) {
        tk__req_discard(ac, rel);
        tk__complete(ac, acq, acq->abandon_code, NULL);
        return;
    }
    rel->token = token;
    if (!acq->completed && acq->ev) {
        rel->ev = acq->ev;
        acq->ev = NULL;
        rel->abandon_code = acq->abandon_code;
        rel->abandoned = true;
        if (tk__timer_armed(&acq->cleanup))
            tk__heap_set(&ac->heap, &rel->cleanup, acq->cleanup.at);
    }
    acq->completed = true;
    tk__log(ac, 0, "releasing token %llu granted to an abandoned acquire", (unsigned long long)token);
    tk__req_submit(ac, rel);
}

static void on_acquire(tk_async *ac, tk_req *r, const tk_response *resp)
{
    char k[128]; /* the key for messages: formatted only on the paths that write one */
    if (r->abandoned) {
        if (resp->status == TK_STATUS_OK) {
            release_raced_grant(ac, r, resp->token);
        } else {
            tk__fmt_key(k, sizeof k, r->key, r->key_len);
            complete_msg(ac, r, r->abandon_code, "acquire of %s %s", k,
                         r->abandon_code == TK_ERR_CANCELLED ? "cancelled" : "timed out");
        }
        return;
    }
    if (resp->status != TK_STATUS_OK)
        tk__fmt_key(k, sizeof k, r->key, r->key_len);
    switch (resp->status) {
    case TK_STATUS_OK: {
        /* one rule for every transmission: detail counts from the request's first arrival (for a
         * retry answered from the server's table, lease_ms is what is left of the lease) */
        int64_t deadline = tk__deadline_us(r->t_first, resp->detail, resp->lease_ms);
        tk_lock *l = tk__lock_new(ac, r, resp->token, resp->lease_ms, deadline);
        if (!l) {
            r->abandon_code = TK_ERR_NO_MEMORY;
            release_raced_grant(ac, r, resp->token);
            return;
        }
        tk_event *ev = r->ev;
        if (ev) {
            ev->reply.lock = l;
            ev->reply.token = resp->token;
            ev->reply.lease_ms = resp->lease_ms;
            ev->reply.queued_ms = resp->detail;
        }
        tk__complete(ac, r, TK_OK, NULL);
        return;
    }
    case TK_STATUS_TIMED_OUT:
        if (resp->data_len > 0) {
            /* the server says why (its start-up wait: nothing is granted before it ends) */
            char msg[200];
            size_t n = resp->data_len < sizeof msg - 1 ? resp->data_len : sizeof msg - 1;
            memcpy(msg, resp->data, n);
            msg[n] = '\0';
            if (r->wait_ms == 0)
                complete_msg(ac, r, TK_ERR_NOT_ACQUIRED, "not acquired: %s (tried once): %s", k, msg);
            else if (r->wait_ms == TK_WAIT_FOREVER_MS)
                complete_msg(ac, r, TK_ERR_NOT_ACQUIRED, "not acquired: %s: %s", k, msg);
            else
                complete_msg(ac, r, TK_ERR_NOT_ACQUIRED, "not acquired: %s (waited %u ms): %s", k, r->wait_ms, msg);
        } else if (r->wait_ms == 0)
            complete_msg(ac, r, TK_ERR_NOT_ACQUIRED, "not acquired: %s is held by another holder (tried once)", k);
        else if (r->wait_ms == TK_WAIT_FOREVER_MS)
            complete_msg(ac, r, TK_ERR_NOT_ACQUIRED, "not acquired: %s", k);
        else
            complete_msg(ac, r, TK_ERR_NOT_ACQUIRED, "not acquired: %s still held after waiting %u ms", k, r->wait_ms);
        return;
    case TK_STATUS_CANCELLED:
        complete_msg(ac, r, TK_ERR_CANCELLED, "acquire of %s was cancelled", k);
        return;
    case TK_STATUS_NOT_HELD:
        complete_msg(ac, r, TK_ERR_CONNECTION_LOST,
                     "connection lost while acquiring %s: the retry found nothing held for it", k);
        return;
    default:
        status_error(ac, r, resp);
        return;
    }
}

static void on_release(tk_async *ac, tk_req *r, const tk_response *resp)
{
    tk_lock *l = r->lock;
    char k[128]; /* formatted only on the paths that write a message */
    if (l)
        l->releasing = false;
    if (r->kind == TK__R_CLEANUP) {
        tk__complete(ac, r, r->abandon_code, NULL);
        return;
    }
    if (resp->status == TK_STATUS_OK) {
        if (l && l->lost) {
            tk_error e;
            tk__fmt_key(k, sizeof k, r->key, r->key_len);
            tk__seterr(&e, TK_ERR_LOCK_LOST, "lock lost (%s) before the release: %s token %llu",
                       tk_lost_reason_str(l->reason), k, (unsigned long long)r->token);
            e.reason = l->reason;
            tk__complete(ac, r, TK_ERR_LOCK_LOST, &e);
            return;
        }
        if (!l)
            l = tk__lock_by_token(ac, r->token);
        if (l && l->token == r->token)
            tk__lock_released(ac, l);
        tk__complete(ac, r, TK_OK, NULL);
        return;
    }
    if (resp->status == TK_STATUS_NOT_HELD) {
        tk__fmt_key(k, sizeof k, r->key, r->key_len);
        if (l) {
            if (!l->lost) {
                bool past = tk__now_us() >= l->deadline_us - tk__lost_margin_us(l->lease_ms);
                tk__lock_lost(ac, l, past ? TK_LOST_EXPIRED : TK_LOST_NOT_HELD);
            }
            if (r->kind == TK__R_BACKGROUND)
                return;
            tk_error e;
            tk__seterr(&e, TK_ERR_LOCK_LOST, "lock lost (%s): %s token %llu is not held any more",
                       tk_lost_reason_str(l->reason), k, (unsigned long long)r->token);
            e.reason = l->reason;
            e.status = resp->status;
            tk__complete(ac, r, TK_ERR_LOCK_LOST, &e);
            return;
        }
        tk_error e;
        tk__seterr(&e, TK_ERR_NOT_HELD, "not held: %s token %llu is not the holder (expired, released or never granted)",
                   k, (unsigned long long)r->token);
        e.status = resp->status;
        tk__complete(ac, r, TK_ERR_NOT_HELD, &e);
        return;
    }
    if (l)
        tk__lock_release_failed(ac, l);
    status_error(ac, r, resp);
}

static void on_extend(tk_async *ac, tk_req *r, const tk_response *resp)
{
    tk_lock *l = r->lock;
    char k[128]; /* formatted only on the paths that write a message */
    if (r->kind == TK__R_KEEPALIVE)
        l->ka_inflight = false;
    if (resp->status == TK_STATUS_OK) {
        if (l && l->lost) {
            if (r->kind == TK__R_KEEPALIVE)
                return;
            tk_error e;
            tk__fmt_key(k, sizeof k, r->key, r->key_len);
            tk__seterr(&e, TK_ERR_LOCK_LOST, "lock lost (%s): %s token %llu", tk_lost_reason_str(l->reason), k,
                       (unsigned long long)r->token);
            e.reason = l->reason;
            tk__complete(ac, r, TK_ERR_LOCK_LOST, &e);
            return;
        }
        if (l && !l->released)
            tk__lock_extended(ac, l, r->id, resp->lease_ms, r->t_first);
        if (r->ev) {
            r->ev->reply.token = resp->token;
            r->ev->reply.lease_ms = resp->lease_ms;
        }
        tk__complete(ac, r, TK_OK, NULL);
        return;
    }
    if (resp->status == TK_STATUS_NOT_HELD) {
        tk__fmt_key(k, sizeof k, r->key, r->key_len);
        if (l) {
            if (!l->lost && !l->released)
                tk__lock_lost(ac, l, TK_LOST_NOT_HELD);
            if (r->kind == TK__R_KEEPALIVE)
                return;
            tk_error e;
            tk__seterr(&e, TK_ERR_LOCK_LOST, "lock lost (%s): %s token %llu is not held any more",
                       tk_lost_reason_str(l->reason), k, (unsigned long long)r->token);
            e.reason = l->reason;
            e.status = resp->status;
            tk__complete(ac, r, TK_ERR_LOCK_LOST, &e);
            return;
        }
        tk_error e;
        tk__seterr(&e, TK_ERR_NOT_HELD, "not held: %s token %llu is not the holder", k, (unsigned long long)r->token);
        e.status = resp->status;
        tk__complete(ac, r, TK_ERR_NOT_HELD, &e);
        return;
    }
    if (r->kind == TK__R_KEEPALIVE) {
        tk__fmt_key(k, sizeof k, r->key, r->key_len);
        tk__log(ac, 2, "keep-alive of %s failed: status %u", k, resp->status);
        return;
    }
    status_error(ac, r, resp);
}

static void on_inspect(tk_async *ac, tk_req *r, const tk_response *resp)
{
    if (resp->status != TK_STATUS_OK) {
        status_error(ac, r, resp);
        return;
    }
    if (resp->data_len != TK_INSPECT_DATA_SIZE) {
        complete_msg(ac, r, TK_ERR_PROTOCOL, "malformed INSPECT answer (%zu data bytes)", resp->data_len);
        return;
    }
    const uint8_t *d = resp->data;
    tk_event *ev = r->ev;
    if (ev) {
        tk_inspect_info *in = &ev->inspect;
        in->held_for_ms = ((uint32_t)d[0] << 24) | ((uint32_t)d[1] << 16) | ((uint32_t)d[2] << 8) | d[3];
        in->lock_delay_ms = ((uint32_t)d[4] << 24) | ((uint32_t)d[5] << 16) | ((uint32_t)d[6] << 8) | d[7];
        in->flags = ((uint32_t)d[8] << 24) | ((uint32_t)d[9] << 16) | ((uint32_t)d[10] << 8) | d[11];
        in->held = (in->flags & TK_INSPECT_HELD) != 0;
        in->token_match = (in->flags & TK_INSPECT_TOKEN_MATCH) != 0;
        in->session = (in->flags & TK_INSPECT_SESSION) != 0;
        in->token = resp->token;
        in->lease_left_ms = resp->lease_ms;
        in->waiters = resp->detail;
        ev->reply.held = in->token_match;
        ev->reply.token = resp->token;
    }
    tk__complete(ac, r, TK_OK, NULL);
}

static void on_answer(tk_async *ac, tk_req *r, const tk_response *resp)
{
    switch (r->kind) {
    case TK__R_HEARTBEAT:
        ac->hb_id = 0;
        return;
    case TK__R_ACK:
        ac->ack_id = 0;
        tk__log(ac, 0, "ACK answered: %u outcomes stored", resp->detail);
        return;
    case TK__R_CANCEL:
        tk__log(ac, 0, "CANCEL of request %llu answered: %s", (unsigned long long)r->token,
                resp->detail ? "withdrawn" : "nothing to withdraw");
        return;
    default:
        break;
    }
    switch (r->op) {
    case TK_OP_ACQUIRE:
        on_acquire(ac, r, resp);
        return;
    case TK_OP_RELEASE:
        on_release(ac, r, resp);
        return;
    case TK_OP_EXTEND:
        on_extend(ac, r, resp);
        return;
    case TK_OP_INSPECT:
        on_inspect(ac, r, resp);
        return;
    case TK_OP_PING:
        if (resp->status == TK_STATUS_OK)
            tk__complete(ac, r, TK_OK, NULL);
        else
            status_error(ac, r, resp);
        return;
    default:
        return;
    }
}

static void maybe_ack(tk_async *ac)
{
    if (ac->cs != TK__C_READY || ac->ack_id != 0 || ac->answers_since_ack < TK_ACK_EVERY)
        return;
    uint64_t x = ac->next_id;
    for (tk_req *r = ac->req_head; r; r = r->next) {
        if (r->op != TK_OP_ACQUIRE) {
            x = r->id;
            break;
        }
    }
    tk_req *r = tk__req_new(ac, TK_OP_ACK, TK__R_ACK);
    if (!r)
        return;
    r->token = x;
    tk__req_submit(ac, r);
    ac->ack_id = r->id;
    ac->answers_since_ack = 0;
}

void tk__on_frame(tk_async *ac, const tk_response *resp)
{
    if (resp->id == 0) {
        if (resp->op == TK_OP_EXPIRED) {
            tk_lock *l = tk__lock_by_token(ac, resp->token);
            if (l && l->key_len == resp->data_len && memcmp(l->key, resp->data, l->key_len) == 0) {
                tk__lock_lost(ac, l, resp->detail == TK_EXPIRED_STOPPING ? TK_LOST_SERVER_STOPPING : TK_LOST_EXPIRED);
            } else {
                tk__log(ac, 0, "EXPIRED for token %llu that this client does not hold", (unsigned long long)resp->token);
            }
        } else if (resp->op == TK_OP_GOAWAY) {
            uint8_t addr[256];
            size_t n = resp->data_len < sizeof addr ? resp->data_len : 0;
            memcpy(addr, resp->data, n);
            const char *why = tk_goaway_reason_name(resp->detail);
            char w[64];
            snprintf(w, sizeof w, "GOAWAY (%s)", why ? why : "unknown reason");
            tk__conn_redirect(ac, addr, n, w);
        } else if (resp->status == TK_STATUS_INVALID) {
            char msg[160];
            size_t n = resp->data_len < sizeof msg - 1 ? resp->data_len : sizeof msg - 1;
            memcpy(msg, resp->data, n);
            msg[n] = '\0';
            tk__log(ac, 2, "the server rejected a frame: %s", msg);
        } else {
            tk__log(ac, 0, "ignoring push op 0x%02x", resp->op);
        }
        return;
    }
    tk_req *r = hfind(ac, resp->id);
    if (!r || !r->sent) {
        tk__log(ac, 0, "answer to request %llu that is not pending", (unsigned long long)resp->id);
        return;
    }
    ac->answers_since_ack++;
    bool not_leader = resp->status == TK_STATUS_NOT_LEADER;
    bool move = resp->status == TK_STATUS_SHUTTING_DOWN && ac->n_endpoints > 1 && r->kind == TK__R_USER;
    if ((not_leader || move) && r->redirects < MAX_REDIRECTS) {
        r->redirects++;
        r->sent = false;
        r->not_run = not_leader;
        uint8_t addr[256];
        size_t n = not_leader && resp->data_len < sizeof addr ? resp->data_len : 0;
        memcpy(addr, resp->data, n);
        tk__conn_redirect(ac, addr, n, not_leader ? "NOT_LEADER" : "SHUTTING_DOWN");
        return;
    }
    on_answer(ac, r, resp);
    if (hfind(ac, resp->id) == r)
        tk__req_remove(ac, r);
    maybe_ack(ac);
}

/* ---- timers ------------------------------------------------------------------------------ */

static void abandon(tk_async *ac, tk_req *r, tk_err code)
{
    r->abandoned = true;
    r->abandon_code = code;
    tk__heap_del(&ac->heap, &r->deadline);
    tk_req *c = tk__req_new(ac, TK_OP_CANCEL, TK__R_CANCEL);
    if (c) {
        c->token = r->id;
        tk__req_submit(ac, c);
    }
}

static void req_timer(tk_async *ac, tk_req *r, tk_timer *t)
{
    if (t == &r->cleanup) {
        tk__complete(ac, r, r->abandon_code, NULL);
        return;
    }
    if (r->kind == TK__R_HEARTBEAT) {
        /* A silent connection (a frozen node, a cut network) is replaced like a dropped one: the
         * calls in flight keep waiting and are re-sent on resume; for TK__SILENT_SKIP_US the node
         * just left is neither dialled nor followed as a leader hint (unless it is the only
         * endpoint), then it is tried last. */
        tk__req_remove(ac, r);
        if (ac->cs == TK__C_READY) {
            snprintf(ac->silent, sizeof ac->silent, "%s", ac->cur_addr);
            ac->silent_till = tk__now_us() + TK__SILENT_SKIP_US;
            if (ac->cur_ep >= 0 && ac->n_endpoints > 1)
                ac->ep_start = ((size_t)ac->cur_ep + 1) % ac->n_endpoints;
        }
        tk__conn_fail(ac, TK_ERR_TIMEOUT, "the server did not answer a PING within %lld ms",
                      (long long)(tk__ping_wait_us(ac) / 1000));
        return;
    }
    long long ms = (long long)((tk__now_us() - r->t_submit) / 1000);
    char k[128] = "";
    if (r->key_len)
        tk__fmt_key(k, sizeof k, r->key, r->key_len);
    const char *state = ac->cs == TK__C_READY ? "no answer from the server" : "not connected";
    if (r->op == TK_OP_ACQUIRE) {
        complete_msg(ac, r, TK_ERR_TIMEOUT, "acquire of %s timed out after %lld ms (%s%s%s)", k, ms, state,
                     ac->cs != TK__C_READY && ac->last_conn_err.message[0] ? ": " : "",
                     ac->cs != TK__C_READY ? ac->last_conn_err.message : "");
        if (!r->ever_sent) {
            tk__req_remove(ac, r);
            return;
        }
        abandon(ac, r, TK_ERR_TIMEOUT);
    } else {
        complete_msg(ac, r, TK_ERR_TIMEOUT, "%s%s%s timed out after %lld ms (%s%s%s)", op_word(r->op), k[0] ? " of " : "",
                     k, ms, state, ac->cs != TK__C_READY && ac->last_conn_err.message[0] ? ": " : "",
                     ac->cs != TK__C_READY ? ac->last_conn_err.message : "");
        if (r->lock && r->op == TK_OP_RELEASE)
            tk__lock_release_failed(ac, r->lock);
        bool was_sent = r->sent && ac->cs == TK__C_READY;
        tk__req_remove(ac, r);
        if (was_sent)
            tk__conn_fail(ac, TK_ERR_TIMEOUT, "a request got no answer within %lld ms", (long long)(ac->request_timeout_us / 1000));
    }
}

void tk__timers(tk_async *ac, int64_t now)
{
    for (int i = 0; i < MAX_TIMERS_PER_CALL; i++) {
        tk_timer *t = tk__heap_top(&ac->heap);
        if (!t || t->at > now)
            return;
        tk__heap_del(&ac->heap, t);
        switch (t->kind) {
        case TK__T_REQ_DEADLINE:
            req_timer(ac, (tk_req *)((char *)t - offsetof(tk_req, deadline)), t);
            break;
        case TK__T_REQ_CLEANUP:
            req_timer(ac, (tk_req *)((char *)t - offsetof(tk_req, cleanup)), t);
            break;
        case TK__T_LOCK_LOST:
            tk__lock_timer(ac, (tk_lock *)((char *)t - offsetof(tk_lock, lost_timer)), t, now);
            break;
        case TK__T_LOCK_KEEPALIVE:
            tk__lock_timer(ac, (tk_lock *)((char *)t - offsetof(tk_lock, ka_timer)), t, now);
            break;
        default:
            break;
        }
    }
}

/* ---- internal entry points (shared with client.c) ---------------------------------------- */

/* Before a caller's request goes out on a connection that has been idle (nothing in flight), a
 * look whether the server closed it meanwhile (a restarted server's old connection): the request
 * then waits for the next connection instead of being written into a dead socket, so that it
 * reaches the new server and does not fail "server restarted" (it never reached the old one).
 * One non-blocking peek, only when nothing is in flight. */
static void check_idle_conn(tk_async *ac)
{
    if (ac->cs != TK__C_READY || ac->req_head || ac->fd < 0 || tk__buf_size(&ac->rbuf) > 0 ||
        (ac->ssl && SSL_pending(ac->ssl) > 0))
        return;
    char b;
    ssize_t n = recv(ac->fd, &b, 1, MSG_PEEK | MSG_DONTWAIT);
    if (n == 0)
        tk__conn_fail(ac, TK_ERR_CONNECTION_LOST, "connection closed by the server");
    else if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)
        tk__conn_fail(ac, TK_ERR_CONNECTION_LOST, "read: %s", strerror(errno));
}

static tk_req *user_req(tk_async *ac, uint8_t op, const void *key, size_t key_len, tk_reply_cb cb, void *data,
                        tk_error *err)
{
    tk_req *r = tk__req_new(ac, op, TK__R_USER);
    if (r)
        r->ev = tk__event_new(ac);
    if (!r || !r->ev || tk__req_set_key(r, key, key_len) != 0) {
        tk__req_discard(ac, r);
        tk__seterr(err, TK_ERR_NO_MEMORY, "out of memory");
        return NULL;
    }
    r->cb = cb;
    r->cb_data = data;
    r->ev->kind = TK__EV_REPLY;
    r->ev->cb = cb;
    r->ev->data = data;
    return r;
}

tk_err tk__acquire(tk_async *ac, const void *key, size_t key_len, int64_t lease_ms, int64_t wait_ms,
                   const tk_acquire_opts *o, tk_reply_cb cb, void *data, uint64_t *id, tk_error *err)
{
    tk_err e;
    if ((e = tk__check_key(key, key_len, err)) != TK_OK || (e = tk__check_lease(lease_ms, "lease", err)) != TK_OK ||
        (e = tk__check_wait(wait_ms, err)) != TK_OK)
        goto fail;
    if (o && o->max_hold_ms < 0) {
        e = tk__seterr(err, TK_ERR_INVALID_ARGUMENT, "invalid max_hold_ms: %lld (0 = no cap)", (long long)o->max_hold_ms);
        goto fail;
    }
    if (!cb) {
        e = tk__seterr(err, TK_ERR_INVALID_ARGUMENT, "invalid argument: an acquire needs a callback");
        goto fail;
    }
    if (o && o->refuse_held && tk__lock_by_key(ac, key, key_len)) {
        char k[128];
        tk__fmt_key(k, sizeof k, key, key_len);
        e = tk__seterr(err, TK_ERR_ALREADY_HELD, "already held: this client holds %s (refuse_held)", k);
        goto fail;
    }
    tk_req *r = user_req(ac, TK_OP_ACQUIRE, key, key_len, cb, data, err);
    if (!r) {
        e = TK_ERR_NO_MEMORY;
        goto fail;
    }
    r->lease_ms = (uint32_t)lease_ms;
    r->wait_ms = (uint32_t)wait_ms;
    if (o)
        r->aopts = *o; /* the request owns on_lost_data now (req_free or the lock frees it) */
    check_idle_conn(ac);
    tk__req_submit(ac, r);
    if (id)
        *id = r->id;
    return TK_OK;
fail:
    tk__opts_discard(o);
    return e;
}

tk_err tk__simple(tk_async *ac, uint8_t op, const void *key, size_t key_len, uint64_t token, int64_t lease_ms,
                  tk_lock *lock, bool verify, tk_reply_cb cb, void *data, tk_error *err)
{
    tk_err e;
    if (lock) {
        key = lock->key;
        key_len = lock->key_len;
        token = lock->token;
    }
    if (op != TK_OP_PING && (e = tk__check_key(key, key_len, err)) != TK_OK)
        return e;
    if (op == TK_OP_EXTEND && (e = tk__check_lease(lease_ms, "lease", err)) != TK_OK)
        return e;
    if ((op == TK_OP_RELEASE || op == TK_OP_EXTEND) && token == 0)
        return tk__seterr(err, TK_ERR_INVALID_ARGUMENT, "invalid token: 0 (tokens are positive)");
    tk_req *r = user_req(ac, op, key, key_len, cb, data, err);
    if (!r)
        return TK_ERR_NO_MEMORY;
    r->token = token;
    r->lease_ms = op == TK_OP_EXTEND ? (uint32_t)lease_ms : 0;
    r->verify = verify;
    if (lock) {
        tk__lock_check_deadline(ac, lock); /* its lost timer may have slept through a suspend */
        /* answers that need no server */
        if (op == TK_OP_RELEASE && lock->released) {
            tk__complete(ac, r, TK_OK, NULL);
            req_free(ac, r);
            return TK_OK;
        }
        /* A lock known lost: lock-lost at once, whether or not the server can be reached
         * (docs/clients.md, rule 4); the server is told in the background. */
        if ((op == TK_OP_EXTEND && (lock->lost || lock->released)) || (op == TK_OP_RELEASE && lock->lost)) {
            char k[128];
            tk__fmt_key(k, sizeof k, key, key_len);
            tk_error le;
            if (lock->released) {
                tk__seterr(&le, TK_ERR_NOT_HELD, "not held: %s token %llu was released", k, (unsigned long long)token);
            } else {
                tk__seterr(&le, TK_ERR_LOCK_LOST, "lock lost (%s)%s: %s token %llu", tk_lost_reason_str(lock->reason),
                           op == TK_OP_RELEASE ? " before the release" : "", k, (unsigned long long)token);
                le.reason = lock->reason;
            }
            tk__complete(ac, r, le.code, &le);
            req_free(ac, r);
            if (op == TK_OP_RELEASE)
                tk__lock_tell_lost(ac, lock);
            return TK_OK;
        }
        r->lock = lock;
        tk__lock_ref(lock);
        if (op == TK_OP_RELEASE) {
            lock->releasing = true;
            tk__heap_del(&ac->heap, &lock->ka_timer); /* no keep-alive after a release is asked */
            lock->keepalive = false;
        }
    }
    check_idle_conn(ac);
    tk__req_submit(ac, r);
    return TK_OK;
}

tk_err tk__cancel(tk_async *ac, uint64_t id, tk_error *err)
{
    tk_req *r = hfind(ac, id);
    if (!r || r->kind != TK__R_USER || r->op != TK_OP_ACQUIRE || r->abandoned || r->completed)
        return tk__seterr(err, TK_ERR_INVALID_ARGUMENT, "no pending acquire with request id %llu", (unsigned long long)id);
    char k[128];
    tk__fmt_key(k, sizeof k, r->key, r->key_len);
    if (!r->ever_sent) {
        complete_msg(ac, r, TK_ERR_CANCELLED, "acquire of %s cancelled before it was sent", k);
        tk__req_remove(ac, r);
        return TK_OK;
    }
    /* the caller hears "cancelled" once the clean-up is done, or at the cleanup timeout */
    if (r->ev) {
        tk__seterr(&r->ev->error, TK_ERR_CANCELLED, "acquire of %s cancelled", k);
    }
    abandon(ac, r, TK_ERR_CANCELLED);
    tk__heap_set(&ac->heap, &r->cleanup, tk__now_us() + ac->cleanup_us);
    return TK_OK;
}

unsigned tk__withdraw_acquires(tk_async *ac)
{
    if (ac->cs != TK__C_READY)
        return 0; /* nothing can be withdrawn: the server drops the waits when the session's grace ends */
    unsigned n = 0;
    for (tk_req *r = ac->req_head, *next; r; r = next) {
        next = r->next;
        if (r->kind != TK__R_USER || r->op != TK_OP_ACQUIRE || r->abandoned || r->completed || !r->sent)
            continue;
        char k[128];
        tk__fmt_key(k, sizeof k, r->key, r->key_len);
        complete_msg(ac, r, TK_ERR_CLOSED, "acquire of %s: the client was closed; the queued acquire was withdrawn", k);
        abandon(ac, r, TK_ERR_CLOSED);
        n++;
    }
    return n;
}

bool tk__withdrawals_pending(const tk_async *ac)
{
    if (ac->cs != TK__C_READY)
        return false;
    for (const tk_req *r = ac->req_head; r; r = r->next)
        if ((r->kind == TK__R_USER && r->op == TK_OP_ACQUIRE && r->abandoned) || r->kind == TK__R_CANCEL ||
            r->kind == TK__R_CLEANUP)
            return true;
    return false;
}

unsigned tk__release_all_held(tk_async *ac, tk_reply_cb cb, void *data)
{
    unsigned n = 0;
    for (tk_lock *l = ac->locks; l; l = l->next) {
        if (!l->held || l->releasing)
            continue;
        if (tk__simple(ac, TK_OP_RELEASE, NULL, 0, 0, 0, l, false, cb, data, NULL) == TK_OK)
            n++;
    }
    return n;
}

/* The engine step shared by tk_async_process and client.c. */
void tk__process(tk_async *ac, int events)
{
    if (ac->cs == TK__C_CLOSED || ac->cs == TK__C_FAILED)
        return;
    tk__conn_io(ac, events);
    int64_t now = tk__now_us();
    tk__timers(ac, now);
    tk__conn_timers(ac, now);
    maybe_ack(ac);
    if (tk__conn_want_write(ac) && !ac->ssl_read_wants_write)
        tk__conn_flush(ac);
}

