/*
 * Locks: the handle's life (references), the local deadline and the lost signal, keep-alive,
 * and the public tk_lock_* accessors.
 */
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "internal.h"

static void lock_link(tk_async *ac, tk_lock *l)
{
    l->prev = NULL;
    l->next = ac->locks;
    if (ac->locks)
        ac->locks->prev = l;
    ac->locks = l;
}

static void lock_unlink(tk_async *ac, tk_lock *l)
{
    if (l->prev)
        l->prev->next = l->next;
    else if (ac->locks == l)
        ac->locks = l->next;
    if (l->next)
        l->next->prev = l->prev;
    l->prev = l->next = NULL;
}

/* Frees l (its key already freed), or keeps it for reuse by ac. */
static void lock_recycle(tk_async *ac, tk_lock *l)
{
    if (ac && ac->n_lock_pool < TK__POOL_MAX) {
        l->next = ac->lock_pool;
        ac->lock_pool = l;
        ac->n_lock_pool++;
        TK__POISON(l, sizeof *l);
    } else {
        free(l);
    }
}

static int64_t keepalive_period_us(const tk_lock *l)
{
    int64_t p = (int64_t)l->lease_ms * 1000 / 3;
    return p < 1000 ? 1000 : p;
}

static void arm_lost(tk_async *ac, tk_lock *l)
{
    tk__heap_set(&ac->heap, &l->lost_timer, l->deadline_us - tk__lost_margin_us(l->lease_ms));
}

tk_lock *tk__lock_new(tk_async *ac, const tk_req *acq, uint64_t token, uint32_t lease_ms, int64_t deadline_us)
{
    tk_lock *l = ac->lock_pool;
    if (l) {
        TK__UNPOISON(l, sizeof *l);
        ac->lock_pool = l->next;
        ac->n_lock_pool--;
        memset(l, 0, offsetof(tk_lock, kbuf));
    } else if (!(l = calloc(1, sizeof *l))) {
        return NULL;
    }
    l->key = l->kbuf;
    if (acq->key_len > sizeof l->kbuf && !(l->key = malloc(acq->key_len))) {
        lock_recycle(ac, l);
        return NULL;
    }
    memcpy(l->key, acq->key, acq->key_len);
    l->key_len = acq->key_len;
    l->ac = ac;
    l->refs = 2; /* the user's handle and the held set */
    l->held = true;
    ac->n_held++;
    l->token = token;
    l->lease_ms = lease_ms;
    l->deadline_us = deadline_us;
    tk__timer_init(&l->lost_timer, TK__T_LOCK_LOST);
    tk__timer_init(&l->ka_timer, TK__T_LOCK_KEEPALIVE);
    const tk_acquire_opts *o = &acq->aopts;
    l->keepalive = o->keepalive != 0;
    l->ka_stop_us = o->max_hold_ms > 0 ? tk__now_us() + o->max_hold_ms * 1000 : INT64_MAX;
    if (o->on_lost) {
        l->on_lost = o->on_lost;
        l->on_lost_data = o->on_lost_data;
    } else {
        l->on_lost = ac->on_lost;
        l->on_lost_data = ac->on_lost_data;
    }
    l->on_lost_data_free = o->on_lost_data_free;
    ((tk_req *)acq)->aopts.on_lost_data_free = NULL; /* the lock owns the data now */
    lock_link(ac, l);
    arm_lost(ac, l);
    if (l->keepalive)
        tk__heap_set(&ac->heap, &l->ka_timer, tk__now_us() + keepalive_period_us(l));
    return l;
}

void tk__lock_ref(tk_lock *l) { l->refs++; }

void tk__lock_unref(tk_lock *l)
{
    if (--l->refs > 0)
        return;
    tk_async *ac = l->ac;
    if (ac) {
        tk__heap_del(&ac->heap, &l->lost_timer);
        tk__heap_del(&ac->heap, &l->ka_timer);
        lock_unlink(ac, l);
    }
    if (l->on_lost_data_free)
        l->on_lost_data_free(l->on_lost_data);
    if (l->key != l->kbuf)
        free(l->key);
    l->key = NULL;
    lock_recycle(ac, l);
}

/* Leaves the held set (lost or released): timers stop, the set's reference goes. */
static void lock_unhold(tk_async *ac, tk_lock *l)
{
    tk__heap_del(&ac->heap, &l->lost_timer);
    tk__heap_del(&ac->heap, &l->ka_timer);
    l->keepalive = false;
    if (l->held) {
        l->held = false;
        ac->n_held--;
        tk__lock_unref(l);
    }
}

void tk__lock_lost(tk_async *ac, tk_lock *l, tk_lost_reason reason)
{
    if (l->lost || l->released)
        return;
    l->lost = true;
    l->reason = reason;
    tk__lock_ref(l); /* keep it while we work */
    if (!l->user_freed && l->on_lost) {
        tk_event *ev = tk__event_new(ac);
        if (ev) {
            ev->kind = TK__EV_LOST;
            ev->lock = l;
            tk__lock_ref(l);
            tk__clearerr(&ev->error);
            ev->error.code = TK_ERR_LOCK_LOST;
            ev->error.reason = reason;
            tk__queue_event(ac, ev);
        }
    }
    char k[128];
    tk__fmt_key(k, sizeof k, l->key, l->key_len);
    tk__log(ac, 1, "lock %s token %llu lost: %s", k, (unsigned long long)l->token, tk_lost_reason_str(reason));
    lock_unhold(ac, l);
    tk__lock_unref(l);
}

void tk__lock_released(tk_async *ac, tk_lock *l)
{
    if (l->released || l->lost)
        return;
    l->released = true;
    lock_unhold(ac, l);
}

void tk__lock_extended(tk_async *ac, tk_lock *l, uint64_t id, uint32_t lease_ms, int64_t t_first)
{
    /* The server applies extends in id order: an older extend's answer read after a newer one's
     * changes nothing, even when its lease is longer. */
    if (l->lost || l->released || id < l->extend_id)
        return;
    l->extend_id = id;
    l->lease_ms = lease_ms;
    l->deadline_us = tk__deadline_us(t_first, 0, lease_ms);
    if (!l->releasing)
        arm_lost(ac, l);
}

bool tk__lock_check_deadline(tk_async *ac, tk_lock *l)
{
    if (l->held && !l->lost && !l->releasing && tk__now_us() >= l->deadline_us - tk__lost_margin_us(l->lease_ms))
        tk__lock_lost(ac, l, TK_LOST_EXPIRED);
    return l->lost;
}

void tk__lock_release_failed(tk_async *ac, tk_lock *l)
{
    l->releasing = false;
    if (!l->held || l->lost)
        return;
    if (!tk__lock_check_deadline(ac, l)) /* the deadline may have passed while the release was in flight */
        arm_lost(ac, l);
}

void tk__lock_stop_keepalive(tk_async *ac, tk_lock *l)
{
    l->keepalive = false;
    tk__heap_del(&ac->heap, &l->ka_timer);
}

void tk__lock_tell_lost(tk_async *ac, tk_lock *l)
{
    if (!l->lost || l->told || l->released)
        return;
    l->told = true;
    if (l->reason == TK_LOST_SERVER_RESTARTED || l->reason == TK_LOST_NOT_HELD || ac->cs == TK__C_CLOSED ||
        ac->cs == TK__C_FAILED)
        return;
    tk_req *r = tk__req_new(ac, TK_OP_RELEASE, TK__R_BACKGROUND);
    if (!r || tk__req_set_key(r, l->key, l->key_len) != 0) {
        tk__req_discard(ac, r);
        return;
    }
    r->token = l->token;
    r->lock = l;
    tk__lock_ref(l);
    tk__req_submit(ac, r);
}

void tk__lock_timer(tk_async *ac, tk_lock *l, tk_timer *t, int64_t now)
{
    if (t == &l->lost_timer) {
        if (l->releasing)
            return; /* decided by the release's answer */
        tk__lock_lost(ac, l, TK_LOST_EXPIRED);
        return;
    }
    /* keep-alive */
    if (!l->keepalive || !l->held || l->user_freed || l->releasing)
        return;
    if (now >= l->ka_stop_us) {
        tk__log(ac, 0, "keep-alive stops: max hold reached");
        l->keepalive = false;
        return;
    }
    tk__heap_set(&ac->heap, &l->ka_timer, now + keepalive_period_us(l));
    if (l->ka_inflight)
        return;
    tk_req *r = tk__req_new(ac, TK_OP_EXTEND, TK__R_KEEPALIVE);
    if (!r)
        return;
    if (tk__req_set_key(r, l->key, l->key_len) != 0) {
        tk__req_discard(ac, r);
        return;
    }
    r->token = l->token;
    r->lease_ms = l->lease_ms;
    r->lock = l;
    tk__lock_ref(l);
    l->ka_inflight = true;
    tk__req_submit(ac, r);
}

void tk__lock_detach_all(tk_async *ac)
{
    for (tk_lock *l = ac->locks, *next; l; l = next) {
        next = l->next;
        tk__heap_del(&ac->heap, &l->lost_timer);
        tk__heap_del(&ac->heap, &l->ka_timer);
        lock_unlink(ac, l);
        l->ac = NULL;
        if (l->held) {
            l->held = false;
            tk__lock_unref(l);
        }
    }
    ac->locks = NULL;
    ac->n_held = 0;
}

tk_lock *tk__lock_by_token(tk_async *ac, uint64_t token)
{
    for (tk_lock *l = ac->locks; l; l = l->next)
        if (l->held && l->token == token)
            return l;
    return NULL;
}

tk_lock *tk__lock_by_key(tk_async *ac, const uint8_t *key, size_t len)
{
    int64_t now = tk__now_us();
    for (tk_lock *l = ac->locks; l; l = l->next)
        if (l->held && !l->user_freed && l->key_len == len && memcmp(l->key, key, len) == 0 &&
            now < l->deadline_us - tk__lost_margin_us(l->lease_ms))
            return l;
    return NULL;
}

/* ---- public accessors -------------------------------------------------------------------- */

static tk_client *owner_of(const tk_lock *l) { return l->ac ? l->ac->owner : NULL; }

uint64_t tk_lock_token(const tk_lock *lock) { return lock ? lock->token : 0; }

const uint8_t *tk_lock_key(const tk_lock *lock, size_t *len)
{
    if (len)
        *len = lock ? lock->key_len : 0;
    return lock ? lock->key : NULL;
}

uint32_t tk_lock_lease_ms(const tk_lock *lock)
{
    if (!lock)
        return 0;
    tk_client *c = owner_of(lock);
    tk__client_lock(c);
    uint32_t v = lock->lease_ms;
    if (c)
        tk__client_unlock(c);
    return v;
}

tk_lost_reason tk_lock_lost(const tk_lock *lock)
{
    if (!lock)
        return TK_LOST_NONE;
    tk_client *c = owner_of(lock);
    tk__client_lock(c);
    tk_lost_reason r = lock->reason;
    if (!lock->lost && !lock->released && tk__now_us() >= lock->deadline_us - tk__lost_margin_us(lock->lease_ms))
        r = TK_LOST_EXPIRED; /* the deadline passed (its timer may not have run yet) */
    if (c)
        tk__client_unlock(c);
    return r;
}

int64_t tk_lock_remaining_ms(const tk_lock *lock)
{
    if (!lock)
        return 0;
    tk_client *c = owner_of(lock);
    tk__client_lock(c);
    int64_t left = 0;
    if (!lock->lost && !lock->released)
        left = (lock->deadline_us - tk__lost_margin_us(lock->lease_ms) - tk__now_us()) / 1000;
    if (c)
        tk__client_unlock(c);
    return left > 0 ? left : 0;
}

int64_t tk_lock_deadline_in_us(const tk_lock *lock)
{
    if (!lock)
        return 0;
    tk_client *c = owner_of(lock);
    tk__client_lock(c);
    int64_t in = lock->deadline_us - tk__now_us();
    if (c)
        tk__client_unlock(c);
    return in;
}

int tk_lock_released(const tk_lock *lock)
{
    if (!lock)
        return 0;
    tk_client *c = owner_of(lock);
    tk__client_lock(c);
    int r = lock->released;
    if (c)
        tk__client_unlock(c);
    return r;
}

void tk_lock_free(tk_lock *lock)
{
    if (!lock)
        return;
    tk_async *ac = lock->ac;
    if (ac && tk__getpid() != ac->pid)
        return; /* after fork: the handle belongs to the parent's client */
    tk_client *c = owner_of(lock);
    tk__client_lock(c);
    lock->user_freed = true;
    if (lock->ac)
        tk__lock_stop_keepalive(lock->ac, lock);
    tk__lock_unref(lock);
    if (c)
        tk__client_unlock(c);
}

void tk_lock_drop(tk_lock *lock)
{
    if (!lock)
        return;
    tk_async *ac = lock->ac;
    if (ac && tk__getpid() != ac->pid)
        return;
    tk_client *c = owner_of(lock);
    tk__client_lock(c);
    if (ac && lock->ac && !lock->held && tk__check_usable(ac, NULL) == TK_OK)
        tk__lock_tell_lost(ac, lock); /* lost earlier: the server may not have reclaimed it yet */
    if (ac && lock->held && !lock->releasing && tk__check_usable(ac, NULL) == TK_OK) {
        tk_req *r = tk__req_new(ac, TK_OP_RELEASE, TK__R_BACKGROUND);
        if (r && tk__req_set_key(r, lock->key, lock->key_len) == 0) {
            r->token = lock->token;
            r->lock = lock;
            tk__lock_ref(lock);
            lock->releasing = true;
            tk__req_submit(ac, r);
        } else {
            tk__req_discard(ac, r);
        }
    }
    lock->user_freed = true;
    if (lock->ac)
        tk__lock_stop_keepalive(lock->ac, lock);
    tk__lock_unref(lock);
    if (c)
        tk__client_unlock(c);
}
