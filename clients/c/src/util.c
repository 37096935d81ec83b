/* The clock, buffers, the timer heap, error values, argument checks and the lost-deadline
 * arithmetic. */
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "internal.h"

/* ---- the clock --------------------------------------------------------------------------- */

/* Deadlines run on a clock that keeps counting while the host is suspended, as the server's
 * leases do (PROTOCOL.md "The lost signal"): CLOCK_BOOTTIME on Linux. Kernels whose vDSO lacks
 * BOOTTIME (before 5.3) make it a system call, and the request path reads the clock for every
 * request, so tk__now_us is CLOCK_MONOTONIC (same rate, but it stops during a suspend) plus the
 * suspend time seen so far, which a look at BOOTTIME raises at most every LOOK_EVERY_US (as the
 * server's internal/clock/since.go does). Without BOOTTIME, a look adds the wall clock's advance
 * beyond the monotonic clock's since the previous look (tk__clock_missed_us). */
#define LOOK_EVERY_US 20000

static struct {
    _Atomic int64_t suspend_us; /* BOOTTIME - MONOTONIC as last seen; only grows after the first look */
    _Atomic int64_t look_us;    /* monotonic time of the last look */
    _Atomic int64_t skew_us;    /* tk__clock_skew */
    atomic_flag looking;        /* a thread is looking: the others use the offset as it is */
    pthread_once_t once;        /* the first look, which every reader waits for */
    tk_clock_pair wall;         /* without BOOTTIME: the readings of the last look */
} clk = {.look_us = INT64_MIN / 2, .looking = ATOMIC_FLAG_INIT, .once = PTHREAD_ONCE_INIT};

static int64_t clock_us(clockid_t id)
{
    struct timespec ts;
    if (clock_gettime(id, &ts) != 0)
        return INT64_MIN;
    return (int64_t)ts.tv_sec * 1000000 + ts.tv_nsec / 1000;
}

int64_t tk__clock_missed_us(tk_clock_pair *last, int64_t mono_us, int64_t wall_us)
{
    int64_t missed = last->set ? (wall_us - last->wall_us) - (mono_us - last->mono_us) : 0;
    last->mono_us = mono_us;
    last->wall_us = wall_us;
    last->set = true;
    return missed > 0 ? missed : 0;
}

static void clock_look(bool first)
{
    int64_t skew = atomic_load(&clk.skew_us);
    int64_t boot = INT64_MIN;
#ifdef __linux__ /* (FreeBSD's CLOCK_BOOTTIME is its uptime, which stops during a suspend) */
    boot = clock_us(CLOCK_BOOTTIME);
#endif
    if (boot != INT64_MIN) {
        /* the monotonic clock is read after BOOTTIME: the difference never overstates the suspend */
        int64_t d = boot + skew - clock_us(CLOCK_MONOTONIC);
        if (first || d > atomic_load(&clk.suspend_us))
            atomic_store(&clk.suspend_us, d);
    } else {
        int64_t m = clock_us(CLOCK_MONOTONIC);
        int64_t missed = tk__clock_missed_us(&clk.wall, m, clock_us(CLOCK_REALTIME) + skew);
        atomic_store(&clk.suspend_us, atomic_load(&clk.suspend_us) + missed);
    }
    atomic_store(&clk.look_us, clock_us(CLOCK_MONOTONIC));
}

static void clock_first_look(void) { clock_look(true); }

void tk__clock_skew(int64_t us) { atomic_fetch_add(&clk.skew_us, us); }

int64_t tk__now_us(void)
{
    int64_t m = clock_us(CLOCK_MONOTONIC);
    if (m - atomic_load(&clk.look_us) >= LOOK_EVERY_US) {
        pthread_once(&clk.once, clock_first_look);
        if (m - atomic_load(&clk.look_us) >= LOOK_EVERY_US && !atomic_flag_test_and_set(&clk.looking)) {
            clock_look(false);
            atomic_flag_clear(&clk.looking);
        }
    }
    return m + atomic_load(&clk.suspend_us);
}

/* The process id, cached. glibc makes getpid() a system call each time; every public call checks
 * it (a client must not be used after fork()), so it is read once and the child's fork handler
 * clears the copy. */
static atomic_int pid_cache;
static pthread_once_t pid_once = PTHREAD_ONCE_INIT;

static void pid_forked(void)
{
    atomic_store_explicit(&pid_cache, 0, memory_order_relaxed);
    atomic_flag_clear(&clk.looking); /* a thread of the parent may have been looking */
}

static void pid_register(void) { pthread_atfork(NULL, NULL, pid_forked); }

pid_t tk__getpid(void)
{
    int p = atomic_load_explicit(&pid_cache, memory_order_relaxed);
    if (p != 0)
        return (pid_t)p;
    pthread_once(&pid_once, pid_register);
    p = (int)getpid();
    atomic_store_explicit(&pid_cache, p, memory_order_relaxed);
    return (pid_t)p;
}

/* ---- buffers ----------------------------------------------------------------------------- */

int tk__buf_reserve(tk_buf *b, size_t extra)
{
    if (b->cap - b->len >= extra)
        return 0;
    if (b->off > 0) { /* move the unread bytes to the front first */
        memmove(b->p, b->p + b->off, b->len - b->off);
        b->len -= b->off;
        b->off = 0;
        if (b->cap - b->len >= extra)
            return 0;
    }
    size_t need = b->len + extra;
    if (need < extra)
        return -1;
    size_t cap = b->cap ? b->cap : 512;
    while (cap < need) {
        if (cap > SIZE_MAX / 2)
            return -1;
        cap *= 2;
    }
    uint8_t *p = realloc(b->p, cap);
    if (!p)
        return -1;
    b->p = p;
    b->cap = cap;
    return 0;
}

int tk__buf_append(tk_buf *b, const void *data, size_t n)
{
    if (tk__buf_reserve(b, n) != 0)
        return -1;
    memcpy(b->p + b->len, data, n);
    b->len += n;
    return 0;
}

void tk__buf_consume(tk_buf *b, size_t n)
{
    b->off += n;
    if (b->off >= b->len) {
        b->off = b->len = 0;
        if (b->cap > (1u << 20)) { /* do not keep a burst's buffer forever */
            free(b->p);
            b->p = NULL;
            b->cap = 0;
        }
    }
}

void tk__buf_reset(tk_buf *b) { b->off = b->len = 0; }

void tk__buf_free(tk_buf *b)
{
    free(b->p);
    b->p = NULL;
    b->off = b->len = b->cap = 0;
}

/* ---- timer heap -------------------------------------------------------------------------- */

static void heap_swap(tk_heap *h, size_t i, size_t j)
{
    tk_timer *t = h->t[i];
    h->t[i] = h->t[j];
    h->t[j] = t;
    h->t[i]->idx = i;
    h->t[j]->idx = j;
}

static void heap_up(tk_heap *h, size_t i)
{
    while (i > 0) {
        size_t p = (i - 1) / 2;
        if (h->t[p]->at <= h->t[i]->at)
            break;
        heap_swap(h, i, p);
        i = p;
    }
}

static void heap_down(tk_heap *h, size_t i)
{
    for (;;) {
        size_t l = 2 * i + 1, r = l + 1, m = i;
        if (l < h->n && h->t[l]->at < h->t[m]->at)
            m = l;
        if (r < h->n && h->t[r]->at < h->t[m]->at)
            m = r;
        if (m == i)
            return;
        heap_swap(h, i, m);
        i = m;
    }
}

/* The lane of a timer kind, or -1 for the heap only. */
static int lane_of(uint8_t kind)
{
    switch (kind) {
    case TK__T_REQ_DEADLINE: return 0;
    case TK__T_LOCK_LOST: return 1;
    default: return -1;
    }
}

static void lane_unlink(tk_heap *h, tk_timer *t)
{
    tk_lane *L = &h->lane[lane_of(t->kind)];
    if (t->lprev)
        t->lprev->lnext = t->lnext;
    else
        L->head = t->lnext;
    if (t->lnext)
        t->lnext->lprev = t->lprev;
    else
        L->tail = t->lprev;
    t->lprev = t->lnext = NULL;
    t->idx = SIZE_MAX;
}

static void heap_remove(tk_heap *h, tk_timer *t)
{
    size_t i = t->idx;
    h->n--;
    if (i != h->n) {
        h->t[i] = h->t[h->n];
        h->t[i]->idx = i;
        heap_up(h, i);
        heap_down(h, h->t[i]->idx);
    }
    t->idx = SIZE_MAX;
}

int tk__heap_set(tk_heap *h, tk_timer *t, int64_t at)
{
    if (t->idx == TK__IN_LANE) {
        if (at == t->at)
            return 0;
        lane_unlink(h, t);
    } else if (tk__timer_armed(t)) {
        int64_t old = t->at;
        t->at = at;
        if (at < old)
            heap_up(h, t->idx);
        else
            heap_down(h, t->idx);
        return 0;
    }
    int ln = lane_of(t->kind);
    if (ln >= 0) {
        tk_lane *L = &h->lane[ln];
        if (!L->tail || L->tail->at <= at) {
            t->at = at;
            t->idx = TK__IN_LANE;
            t->lnext = NULL;
            t->lprev = L->tail;
            if (L->tail)
                L->tail->lnext = t;
            else
                L->head = t;
            L->tail = t;
            return 0;
        }
    }
    if (h->n == h->cap) {
        size_t cap = h->cap ? h->cap * 2 : 64;
        tk_timer **n = realloc(h->t, cap * sizeof *n);
        if (!n)
            return -1;
        h->t = n;
        h->cap = cap;
    }
    t->at = at;
    t->idx = h->n;
    h->t[h->n++] = t;
    heap_up(h, t->idx);
    return 0;
}

void tk__heap_del(tk_heap *h, tk_timer *t)
{
    if (t->idx == TK__IN_LANE)
        lane_unlink(h, t);
    else if (tk__timer_armed(t))
        heap_remove(h, t);
}

tk_timer *tk__heap_top(const tk_heap *h)
{
    tk_timer *best = h->n ? h->t[0] : NULL;
    for (int i = 0; i < TK__LANES; i++) {
        tk_timer *c = h->lane[i].head;
        if (c && (!best || c->at < best->at))
            best = c;
    }
    return best;
}

void tk__heap_free(tk_heap *h)
{
    for (size_t i = 0; i < h->n; i++)
        h->t[i]->idx = SIZE_MAX;
    for (int i = 0; i < TK__LANES; i++) {
        for (tk_timer *t = h->lane[i].head, *next; t; t = next) {
            next = t->lnext;
            t->lprev = t->lnext = NULL;
            t->idx = SIZE_MAX;
        }
        h->lane[i].head = h->lane[i].tail = NULL;
    }
    free(h->t);
    h->t = NULL;
    h->n = h->cap = 0;
}

/* ---- errors ------------------------------------------------------------------------------ */

const char *tk_strerror(tk_err code)
{
    switch (code) {
    case TK_OK: return "ok";
    case TK_ERR_NOT_ACQUIRED: return "not acquired";
    case TK_ERR_CANCELLED: return "cancelled";
    case TK_ERR_NOT_HELD: return "not held";
    case TK_ERR_LOCK_LOST: return "lock lost";
    case TK_ERR_INVALID_ARGUMENT: return "invalid argument";
    case TK_ERR_ALREADY_HELD: return "already held";
    case TK_ERR_AUTH_FAILED: return "auth failed";
    case TK_ERR_UNSUPPORTED_VERSION: return "unsupported version";
    case TK_ERR_UNAVAILABLE: return "unavailable";
    case TK_ERR_TLS: return "TLS";
    case TK_ERR_TIMEOUT: return "timeout";
    case TK_ERR_CONNECTION_LOST: return "connection lost";
    case TK_ERR_SERVER_RESTARTED: return "server restarted";
    case TK_ERR_BUSY: return "busy";
    case TK_ERR_SHUTTING_DOWN: return "shutting down";
    case TK_ERR_CLOSED: return "closed";
    case TK_ERR_PROTOCOL: return "protocol error";
    case TK_ERR_FORKED: return "used after fork";
    case TK_ERR_NO_MEMORY: return "out of memory";
    }
    return "unknown error";
}

const char *tk_err_kind(tk_err code)
{
    switch (code) {
    case TK_OK: return "ok";
    case TK_ERR_NOT_ACQUIRED: return "not_acquired";
    case TK_ERR_CANCELLED: return "cancelled";
    case TK_ERR_NOT_HELD: return "not_held";
    case TK_ERR_LOCK_LOST: return "lock_lost";
    case TK_ERR_INVALID_ARGUMENT: return "invalid_argument";
    case TK_ERR_ALREADY_HELD: return "already_held";
    case TK_ERR_AUTH_FAILED: return "auth_failed";
    case TK_ERR_UNSUPPORTED_VERSION: return "unsupported_version";
    case TK_ERR_UNAVAILABLE: return "unavailable";
    case TK_ERR_TLS: return "tls";
    case TK_ERR_TIMEOUT: return "timeout";
    case TK_ERR_CONNECTION_LOST: return "connection_lost";
    case TK_ERR_SERVER_RESTARTED: return "server_restarted";
    case TK_ERR_BUSY: return "busy";
    case TK_ERR_SHUTTING_DOWN: return "shutting_down";
    case TK_ERR_CLOSED: return "closed";
    case TK_ERR_PROTOCOL:
    case TK_ERR_FORKED:
    case TK_ERR_NO_MEMORY: return "other";
    }
    return "other";
}

const char *tk_lost_reason_str(tk_lost_reason reason)
{
    switch (reason) {
    case TK_LOST_NONE: return "not lost";
    case TK_LOST_EXPIRED: return "expired";
    case TK_LOST_NOT_HELD: return "not held";
    case TK_LOST_SERVER_RESTARTED: return "server restarted";
    case TK_LOST_SERVER_STOPPING: return "server stopping";
    }
    return "expired";
}

tk_err tk__seterr(tk_error *err, tk_err code, const char *fmt, ...)
{
    if (!err)
        return code;
    err->code = code;
    err->reason = TK_LOST_NONE;
    err->status = -1;
    err->detail = 0;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err->message, sizeof err->message, fmt, ap);
    va_end(ap);
    /* one line: a server message could carry a newline */
    for (char *p = err->message; *p; p++)
        if (*p == '\n' || *p == '\r')
            *p = ' ';
    return code;
}

void tk__clearerr(tk_error *err)
{
    if (!err)
        return;
    err->code = TK_OK;
    err->reason = TK_LOST_NONE;
    err->status = -1;
    err->detail = 0;
    err->message[0] = '\0';
}

/* Length of the valid UTF-8 sequence starting at p (1..4), or 0 when invalid. */
static size_t utf8_len(const uint8_t *p, size_t n)
{
    uint8_t c = p[0];
    size_t len;
    uint32_t cp;
    if (c < 0x80)
        return 1;
    if ((c & 0xE0) == 0xC0) {
        len = 2;
        cp = c & 0x1F;
    } else if ((c & 0xF0) == 0xE0) {
        len = 3;
        cp = c & 0x0F;
    } else if ((c & 0xF8) == 0xF0) {
        len = 4;
        cp = c & 0x07;
    } else {
        return 0;
    }
    if (n < len)
        return 0;
    for (size_t i = 1; i < len; i++) {
        if ((p[i] & 0xC0) != 0x80)
            return 0;
        cp = (cp << 6) | (p[i] & 0x3F);
    }
    if ((len == 2 && cp < 0x80) || (len == 3 && cp < 0x800) || (len == 4 && (cp < 0x10000 || cp > 0x10FFFF)) ||
        (cp >= 0xD800 && cp <= 0xDFFF))
        return 0;
    return len;
}

void tk__fmt_key(char *out, size_t cap, const uint8_t *key, size_t len)
{
    /* At most 64 bytes of the key as text (32 as hex: 64 digits), then its length, as the Go
     * client does: a message never echoes a long key. */
    static const char hex[] = "0123456789abcdef";
    const size_t show = 64;
    bool text = true;
    for (size_t i = 0; i < len;) {
        size_t l = utf8_len(key + i, len - i);
        if (l == 0 || (l == 1 && (key[i] < 0x20 || key[i] == 0x7f || key[i] == '"' || key[i] == '\\'))) {
            text = false;
            break;
        }
        i += l;
    }
    if (cap < 8) {
        if (cap)
            out[0] = '\0';
        return;
    }
    char tail[32];
    int tl = snprintf(tail, sizeof tail, "...(%zu bytes)", len);
    size_t room = cap - 1 - (size_t)tl; /* what the key may use when it is cut */
    if (cap <= (size_t)tl + 8)
        room = cap - 1;
    size_t o = 0, i = 0;
    if (text) {
        out[o++] = '"';
        while (i < len && i < show) {
            size_t l = utf8_len(key + i, len - i);
            if (i + l > show || o + l + 1 > room)
                break;
            memcpy(out + o, key + i, l);
            o += l;
            i += l;
        }
        out[o++] = '"';
    } else {
        memcpy(out, "0x", 2);
        o = 2;
        for (; i < len && i < show / 2 && o + 2 <= room; i++) {
            out[o++] = hex[key[i] >> 4];
            out[o++] = hex[key[i] & 15];
        }
    }
    if (i < len && o + (size_t)tl < cap) {
        memcpy(out + o, tail, (size_t)tl);
        o += (size_t)tl;
    }
    out[o] = '\0';
}

tk_err tk__check_key(const void *key, size_t len, tk_error *err)
{
    if (key == NULL && len > 0)
        return tk__seterr(err, TK_ERR_INVALID_ARGUMENT, "invalid key: NULL with length %zu", len);
    if (len == 0)
        return tk__seterr(err, TK_ERR_INVALID_ARGUMENT, "invalid key: empty (a key has 1 to %d bytes)", TK_MAX_KEY_LEN);
    if (len > TK_MAX_KEY_LEN)
        return tk__seterr(err, TK_ERR_INVALID_ARGUMENT, "invalid key: %zu bytes (a key has 1 to %d bytes)", len,
                          TK_MAX_KEY_LEN);
    return TK_OK;
}

tk_err tk__check_lease(int64_t lease_ms, const char *what, tk_error *err)
{
    if (lease_ms < 1 || lease_ms > (int64_t)UINT32_MAX)
        return tk__seterr(err, TK_ERR_INVALID_ARGUMENT,
                          "invalid %s: %lld ms (expected milliseconds from 1 to %lu)", what, (long long)lease_ms,
                          (unsigned long)UINT32_MAX);
    return TK_OK;
}

tk_err tk__check_wait(int64_t wait_ms, tk_error *err)
{
    if (wait_ms < 0 || wait_ms > TK_WAIT_FOREVER)
        return tk__seterr(err, TK_ERR_INVALID_ARGUMENT,
                          "invalid wait: %lld ms (expected milliseconds from 0 to %lu, or TK_WAIT_FOREVER)",
                          (long long)wait_ms, (unsigned long)(UINT32_MAX - 1));
    return TK_OK;
}

int64_t tk__deadline_us(int64_t t_first_us, uint32_t detail_ms, uint32_t lease_ms)
{
    /* (detail + lease) * (1 - 2 * rho) with rho = CLOCK_RATE_BOUND_PPM / 1e6, in microseconds */
    uint64_t ms = (uint64_t)detail_ms + lease_ms;
    uint64_t factor = 1000000u - 2u * TK_CLOCK_RATE_BOUND_PPM; /* parts per million */
    return t_first_us + (int64_t)(ms * factor / 1000u);
}

int64_t tk__lost_margin_us(uint32_t lease_ms)
{
    int64_t tenth = (int64_t)lease_ms * 100; /* lease/10 in microseconds */
    int64_t cap = (int64_t)TK_LOST_MARGIN_MS * 1000;
    return tenth < cap ? tenth : cap;
}

void tk__opts_discard(const tk_acquire_opts *opts)
{
    if (opts && opts->on_lost_data_free)
        opts->on_lost_data_free(opts->on_lost_data);
}
