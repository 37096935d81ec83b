/*
 * Internal structures of the C client. One protocol engine (tk_async) owns the connection, the
 * requests in flight, the locks and the timers; it does no blocking I/O except name resolution
 * and has no threads. tk_client (client.c) wraps it with a mutex and one I/O thread.
 *
 * Files: wire.c (codec), util.c (buffers, timers, errors), conn.c (sockets, TLS, handshake,
 * reconnects), async.c (requests, answers, sessions, public tk_async API), lock.c (locks, lost,
 * keep-alive), client.c (blocking client).
 *
 * Concurrency: a tk_async is used by one thread at a time. With a tk_client, every access to its
 * tk_async (and to the locks created through it) happens with tk_client.mu held; callbacks queued
 * as events are dispatched by client.c after it releases mu.
 */
#ifndef TICKETING_INTERNAL_H
#define TICKETING_INTERNAL_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <sys/types.h>

#include <openssl/ssl.h>

#include "ticketing/ticketing.h"

/* ---- small utilities (util.c) ------------------------------------------------------------ */

/** The engine's clock in microseconds: CLOCK_BOOTTIME, which keeps counting while the host is
 *  suspended (without it, the monotonic clock plus the wall clock's larger advances). Every
 *  timer, request time and lock deadline is on it. */
int64_t tk__now_us(void);

/** The fallback's readings at its last look (no CLOCK_BOOTTIME). */
typedef struct tk_clock_pair {
    int64_t mono_us, wall_us;
    bool set;
} tk_clock_pair;

/** The fallback: the time the monotonic clock missed since the readings in *last (the wall
 *  clock's advance beyond the monotonic clock's, or 0: a wall clock stepped back is ignored, one
 *  stepped forward only makes deadlines earlier); stores the new readings in *last. */
int64_t tk__clock_missed_us(tk_clock_pair *last, int64_t mono_us, int64_t wall_us);

/** Moves the BOOTTIME (or wall clock) reading of every later look ahead by us: tests play a host
 *  suspend with it. */
void tk__clock_skew(int64_t us);

/** getpid(), cached: a fork() handler clears the cache in the child (no system call per check). */
pid_t tk__getpid(void);

/** A growable byte buffer; bytes [off, len) are unread. */
typedef struct tk_buf {
    uint8_t *p;
    size_t off, len, cap;
} tk_buf;

int tk__buf_reserve(tk_buf *b, size_t extra); /* 0, or -1 on no memory */
int tk__buf_append(tk_buf *b, const void *data, size_t n);
void tk__buf_consume(tk_buf *b, size_t n);
void tk__buf_reset(tk_buf *b);
void tk__buf_free(tk_buf *b);
static inline size_t tk__buf_size(const tk_buf *b) { return b->len - b->off; }
static inline uint8_t *tk__buf_data(const tk_buf *b) { return b->p + b->off; }

/** A timer kept in the context's timer set. idx is its heap slot, TK__IN_LANE when it sits in a
 *  lane, or SIZE_MAX when disarmed. */
typedef struct tk_timer tk_timer;
struct tk_timer {
    int64_t at;
    size_t idx;
    tk_timer *lprev, *lnext; /* lane neighbours (idx == TK__IN_LANE) */
    uint8_t kind;            /* TK__T_* below: tells the owner's type */
};
#define TK__IN_LANE (SIZE_MAX - 1)

enum {
    TK__T_REQ_DEADLINE = 1, /* tk_req.deadline */
    TK__T_REQ_CLEANUP,      /* tk_req.cleanup */
    TK__T_LOCK_LOST,        /* tk_lock.lost_timer */
    TK__T_LOCK_KEEPALIVE    /* tk_lock.ka_timer */
};

/* The timers: a min-heap, plus one sorted lane (a list in deadline order) per kind whose
 * deadlines mostly come in order (request timeouts, lost signals). A timer whose deadline is not
 * below its lane's last one is appended there in O(1); any other goes to the heap. */
#define TK__LANES 2
typedef struct tk_lane {
    tk_timer *head, *tail;
} tk_lane;

typedef struct tk_heap {
    tk_timer **t;
    size_t n, cap;
    tk_lane lane[TK__LANES];
} tk_heap;

int tk__heap_set(tk_heap *h, tk_timer *t, int64_t at); /* arm or move; -1 on no memory */
void tk__heap_del(tk_heap *h, tk_timer *t);            /* disarm (no-op when disarmed) */
tk_timer *tk__heap_top(const tk_heap *h);              /* the earliest timer, or NULL */
void tk__heap_free(tk_heap *h);
static inline bool tk__timer_armed(const tk_timer *t) { return t->idx != SIZE_MAX; }
static inline void tk__timer_init(tk_timer *t, uint8_t kind)
{
    t->at = 0;
    t->idx = SIZE_MAX;
    t->lprev = t->lnext = NULL;
    t->kind = kind;
}

/** Sets err (may be NULL) to code and a formatted message; returns code. */
tk_err tk__seterr(tk_error *err, tk_err code, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
void tk__clearerr(tk_error *err);

/** Writes key as "text" (valid printable UTF-8) or as hex into out, shortened past ~48 bytes. */
void tk__fmt_key(char *out, size_t cap, const uint8_t *key, size_t len);

/** Argument checks shared by every entry point (tk_error filled on failure). */
tk_err tk__check_key(const void *key, size_t len, tk_error *err);
tk_err tk__check_lease(int64_t lease_ms, const char *what, tk_error *err);
tk_err tk__check_wait(int64_t wait_ms, tk_error *err);

/** Frees opts->on_lost_data (when it has a free function): the acquire made no lock. */
void tk__opts_discard(const tk_acquire_opts *opts);

/** The lost deadline rules (PROTOCOL.md "The lost signal"), in microseconds. */
int64_t tk__deadline_us(int64_t t_first_us, uint32_t detail_ms, uint32_t lease_ms);
int64_t tk__lost_margin_us(uint32_t lease_ms);

/* Liveness (docs/clients.md, the heartbeat interval, rule 1 and the connect timeout): while any
 * request waits for an answer (a queued ACQUIRE included) a PING goes after at most
 * TK__BUSY_HEARTBEAT_US of silence; a PING unanswered within min(heartbeat, TK__MAX_PING_WAIT_US)
 * gives the connection up (the session resumes on the next one); for TK__SILENT_SKIP_US the node
 * found silent is neither dialled nor followed as a leader hint (unless it is the only endpoint:
 * it still accepts TCP and would cost the handshake wait, and the other nodes name it as the
 * leader until they elect another), then it is tried last; TLS and the handshake get at most
 * TK__HANDSHAKE_WAIT_US once TCP is connected. A frozen leader is left about 1 s after it froze. */
#define TK__BUSY_HEARTBEAT_US 250000
#define TK__MAX_PING_WAIT_US 750000
#define TK__SILENT_SKIP_US 2000000
#define TK__HANDSHAKE_WAIT_US 2000000
int64_t tk__heartbeat_interval_us(const tk_async *ac); /* the silence after which a PING goes now */
int64_t tk__ping_wait_us(const tk_async *ac);          /* how long a PING may stay unanswered */

/* ---- requests and locks ------------------------------------------------------------------ */

/** What a request is for (who gets its answer). */
enum tk_req_kind {
    TK__R_USER = 0,      /* a caller's request: cb gets the reply */
    TK__R_HEARTBEAT,     /* PING of the heartbeat */
    TK__R_ACK,           /* ACK */
    TK__R_CANCEL,        /* CANCEL of an abandoned acquire (answer ignored) */
    TK__R_CLEANUP,       /* RELEASE of a grant that raced a cancel; may carry the caller's completion */
    TK__R_KEEPALIVE,     /* EXTEND of the keep-alive */
    TK__R_BACKGROUND     /* RELEASE from tk_lock_drop / release_on_close (answer only updates the lock) */
};

/** A callback waiting to run (dispatched at the end of a public call, or by client.c). */
typedef struct tk_event tk_event;
struct tk_event {
    tk_event *next;
    enum { TK__EV_REPLY, TK__EV_LOST, TK__EV_CONNECT } kind;
    tk_reply_cb cb;
    tk_connect_cb ccb;
    void *data;
    tk_reply reply;
    tk_inspect_info inspect;
    tk_lock *lock; /* EV_LOST: the lock (a reference); EV_REPLY: reply.lock when set */
    tk_error error; /* last: a recycled event clears only its head (tk__event_new) */
};

/* Requests, events and locks are recycled through small free lists per context. Under
 * AddressSanitizer a recycled object stays poisoned until reused, so a use after its last
 * reference is still reported. */
#if defined(__SANITIZE_ADDRESS__)
#define TK__ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define TK__ASAN 1
#endif
#endif
#ifdef TK__ASAN
#include <sanitizer/asan_interface.h>
#define TK__POISON(p, n) ASAN_POISON_MEMORY_REGION((p), (n))
#define TK__UNPOISON(p, n) ASAN_UNPOISON_MEMORY_REGION((p), (n))
#else
#define TK__POISON(p, n) ((void)(p), (void)(n))
#define TK__UNPOISON(p, n) ((void)(p), (void)(n))
#endif
#define TK__POOL_MAX 1024 /* objects of each type kept per context */

/* Keys up to this size live inside the request or lock (no allocation of their own). */
#define TK__KEY_INLINE 64

typedef struct tk_req tk_req;
struct tk_req {
    uint64_t id;
    uint8_t op;
    uint8_t kind;          /* enum tk_req_kind */
    bool sent;             /* written (or queued in wbuf) on the current connection */
    bool ever_sent;        /* reached some connection: the server may know this id */
    bool not_run;          /* answered NOT_LEADER: the server did not run it */
    bool abandoned;        /* ACQUIRE: the caller cancelled or timed out; clean-up in progress */
    bool completed;        /* the caller's callback has been queued */
    bool verify;           /* INSPECT for tk_lock_verify */
    uint8_t redirects;     /* NOT_LEADER / SHUTTING_DOWN moves so far */
    tk_err abandon_code;   /* TK_ERR_CANCELLED or TK_ERR_TIMEOUT */
    uint64_t token;
    uint32_t lease_ms, wait_ms;
    uint8_t *key;
    size_t key_len;
    int64_t t_submit;
    int64_t t_first;       /* first written or queued for the wire (re-sends keep it): the deadlines' start */
    tk_timer deadline;     /* request timeout */
    tk_timer cleanup;      /* abandoned acquire: complete the caller at the latest then */
    tk_lock *lock;         /* the lock this request acts on (a reference), or NULL */
    tk_acquire_opts aopts; /* ACQUIRE: options for the lock it creates */
    tk_reply_cb cb;
    void *cb_data;
    tk_event *ev;          /* the completion, allocated up front so it can always be delivered */
    tk_req *prev, *next;   /* the context's list, in id order */
    tk_req *hnext;         /* hash chain */
    uint8_t kbuf[TK__KEY_INLINE]; /* the key when it fits (key == kbuf); last: not cleared on reuse */
};

struct tk_lock {
    tk_async *ac;           /* NULL once the context is gone */
    unsigned refs;          /* user handle, held list, queued events, requests */
    bool user_freed;        /* the handle was freed: no more callbacks */
    bool held;              /* in the context's held set (not lost, not released) */
    bool lost;
    bool released;
    bool releasing;         /* a RELEASE of it is in flight */
    bool ka_inflight;       /* a keep-alive EXTEND is in flight */
    bool told;              /* lost: a background RELEASE of it was sent (or none is due) */
    tk_lost_reason reason;
    uint8_t *key;
    size_t key_len;
    uint64_t token;
    uint32_t lease_ms;
    int64_t deadline_us;    /* local deadline; lost fires at deadline - margin */
    uint64_t extend_id;     /* the EXTEND whose OK set deadline_us (0: the grant's) */
    int64_t ka_stop_us;     /* keep-alive stops at this time (INT64_MAX: never) */
    bool keepalive;
    tk_timer lost_timer;
    tk_timer ka_timer;
    tk_lost_cb on_lost;
    void *on_lost_data;
    void (*on_lost_data_free)(void *);
    tk_lock *prev, *next;   /* the context's list of live locks */
    uint8_t kbuf[TK__KEY_INLINE]; /* the key when it fits (key == kbuf) */
};

/* ---- the engine ------------------------------------------------------------------------- */

enum tk_conn_state {
    TK__C_IDLE = 0,  /* not started */
    TK__C_BACKOFF,   /* waiting before the next round */
    TK__C_TCP,       /* non-blocking connect in progress */
    TK__C_TLS,       /* TLS handshake in progress */
    TK__C_HELLO,     /* HELLO queued; reading CHALLENGE */
    TK__C_AUTH,      /* AUTH queued; reading WELCOME */
    TK__C_READY,     /* handshaken */
    TK__C_FAILED,    /* the first round failed: nothing more happens */
    TK__C_CLOSED     /* closed by the caller */
};

struct tk_async {
    pid_t pid;
    tk_client *owner; /* the blocking client wrapping this context, or NULL */

    /* options (copied) */
    char **endpoints;
    size_t n_endpoints;
    uint8_t *token;
    size_t token_len;
    bool has_token;
    bool tls;
    char *tls_server_name;
    int64_t dial_timeout_us, request_timeout_us, heartbeat_us, backoff_min_us, backoff_max_us, cleanup_us;
    bool release_on_close;
    tk_lost_cb on_lost;
    void *on_lost_data;
    tk_log_cb log;
    void *log_data;
    SSL_CTX *ssl_ctx;
    BIO_METHOD *bio_method;

    /* session */
    uint8_t session[TK_SESSION_ID_SIZE];
    uint64_t next_id;
    bool have_state;
    uint8_t state_id[TK_STATE_ID_SIZE];
    uint32_t grace_ms;
    uint64_t rng; /* xorshift state for backoff jitter */

    /* connection */
    enum tk_conn_state cs;
    int fd;
    SSL *ssl;
    bool ssl_read_wants_write, ssl_write_wants_read;
    tk_buf rbuf, wbuf;
    unsigned conn_gen;       /* increments per connection attempt */
    bool connected_once;     /* a WELCOME OK was ever read */
    tk_connect_cb connect_cb;
    void *connect_data;
    int64_t dial_deadline;   /* current attempt's deadline */
    bool hs_deadline;        /* dial_deadline is the handshake's (TCP connected), not the dial timeout */
    int64_t backoff_until;   /* TK__C_BACKOFF: when the next round starts */
    int64_t last_recv;       /* READY: last time bytes arrived */
    int64_t disconnected_at; /* when the last READY connection dropped (0: connected / never) */
    bool session_gone;       /* the grace passed while disconnected (requests already failed) */
    uint64_t hb_id;          /* heartbeat PING in flight (0: none) */
    uint64_t ack_id;         /* ACK in flight (0: none) */
    unsigned answers_since_ack;
    uint8_t cnonce[TK_NONCE_SIZE];
    uint8_t snonce[TK_NONCE_SIZE];
    bool auth_required;
    /* dial round */
    char *hint;              /* leader hint to try first in the next round */
    char *round_hint;        /* this round's hint */
    char silent[300];        /* the node whose connection the heartbeat found silent last... */
    int64_t silent_till;     /* ...neither dialled nor followed as a hint until then (> 1 endpoint) */
    char round_skip[300];    /* this round's silent node left out ("" : none) */
    size_t ep_start;         /* first endpoint index of this round */
    size_t round_pos;        /* position in this round's targets */
    unsigned round_no;       /* rounds since the last success (backoff exponent) */
    unsigned hint_hops;      /* rounds started by a hint since the last backoff (bounded) */
    bool round_election;     /* a node answered NOT_LEADER in this round */
    int64_t first_give_up;   /* first connect: no round starts after this (0: not started) */
    int cur_ep;              /* endpoint index being tried (-1: the hint) */
    char cur_addr[300];
    struct addrinfo *ai_list, *ai_cur;
    tk_error round_err;      /* the most telling failure of this round */
    tk_error last_conn_err;  /* why the last connection/round failed */

    /* requests */
    tk_req *req_head, *req_tail;
    tk_req **htab;
    size_t hcap, hcount;

    /* locks */
    tk_lock *locks;          /* every lock whose ac is this context */
    unsigned n_held;         /* of them, held (in the held set) */
    tk_heap heap;

    /* recycled objects (bounded free lists; freed with the context) */
    tk_req *req_pool;
    tk_event *ev_pool;
    tk_lock *lock_pool;
    unsigned n_req_pool, n_ev_pool, n_lock_pool;

    /* events */
    tk_event *ev_head, *ev_tail;
    bool in_dispatch;
    bool defer_dispatch;     /* client.c dispatches (outside its mutex) */
    bool free_pending;       /* tk_async_free was called during dispatch */

    /* errors */
    tk_err err;
    char errstr[256];
};

/* logging */
void tk__log(tk_async *ac, int level, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

/* conn.c */
int tk__split_hostport(const char *addr, char *host, size_t hcap, char *port, size_t pcap);
tk_err tk__conn_setup(tk_async *ac, const tk_options *o, tk_error *err); /* TLS context etc. */
void tk__conn_teardown(tk_async *ac, bool graceful);                  /* close socket and SSL */
void tk__conn_start_round(tk_async *ac, bool immediate);              /* begin (or schedule) a dial round */
void tk__conn_fail(tk_async *ac, tk_err code, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
void tk__conn_io(tk_async *ac, int events);                           /* socket readiness */
void tk__conn_timers(tk_async *ac, int64_t now);                      /* connection timers */
int64_t tk__conn_next_timer(const tk_async *ac);                      /* INT64_MAX: none */
int tk__conn_flush(tk_async *ac);                                     /* write wbuf; -1 on failure */
bool tk__conn_want_write(const tk_async *ac);
bool tk__conn_want_read(const tk_async *ac);
void tk__conn_redirect(tk_async *ac, const uint8_t *addr, size_t len, const char *why);

/* async.c */
void tk__on_ready(tk_async *ac, const tk_welcome *w);       /* WELCOME OK: session rules, resend */
void tk__on_frame(tk_async *ac, const tk_response *r);      /* a response or push */
void tk__on_disconnect(tk_async *ac);                       /* a READY connection dropped */
void tk__session_lost(tk_async *ac, tk_err code, const char *why); /* fail what was sent */
void tk__dispatch(tk_async *ac);                            /* run queued callbacks */
void tk__maybe_dispatch(tk_async *ac);                      /* unless deferred or nested */
tk_event *tk__take_events(tk_async *ac);                    /* client.c: detach the queue */
void tk__run_events(tk_event *ev);                          /* client.c: run a detached queue */
void tk__drop_events(tk_event *ev);                         /* free without running */
void tk__queue_event(tk_async *ac, tk_event *ev);
void tk__complete(tk_async *ac, tk_req *r, tk_err code, const tk_error *e);
void tk__fail_all(tk_async *ac, tk_err code, const char *msg); /* every request, no matter what */
tk_req *tk__req_new(tk_async *ac, uint8_t op, uint8_t kind);
int tk__req_set_key(tk_req *r, const uint8_t *key, size_t len); /* copy the key in; -1 on no memory */
void tk__req_discard(tk_async *ac, tk_req *r);              /* free a request never submitted */
tk_event *tk__event_new(tk_async *ac);                      /* a zeroed event, or NULL */
void tk__pools_free(tk_async *ac);                          /* the context is being freed */
void tk__req_submit(tk_async *ac, tk_req *r);               /* assign id, queue (and encode when READY) */
void tk__req_remove(tk_async *ac, tk_req *r);               /* unlink and free */
void tk__send_pending(tk_async *ac);                        /* READY: encode every unsent request */
void tk__timers(tk_async *ac, int64_t now);                 /* request and lock timers */
void tk__process(tk_async *ac, int events);                 /* one engine step: I/O, timers, ACK */
tk_err tk__check_usable(tk_async *ac, tk_error *err);       /* forked / closed */
void tk__set_last_error(tk_async *ac, const tk_error *e);

/* Internal entry points shared by the blocking client (ac must be usable; err filled). */
tk_err tk__acquire(tk_async *ac, const void *key, size_t key_len, int64_t lease_ms, int64_t wait_ms,
                   const tk_acquire_opts *o, tk_reply_cb cb, void *data, uint64_t *id, tk_error *err);
tk_err tk__simple(tk_async *ac, uint8_t op, const void *key, size_t key_len, uint64_t token, int64_t lease_ms,
                  tk_lock *lock, bool verify, tk_reply_cb cb, void *data, tk_error *err);
tk_err tk__cancel(tk_async *ac, uint64_t id, tk_error *err);
void tk__close(tk_async *ac);
void tk__free(tk_async *ac, bool forked_child);
unsigned tk__release_all_held(tk_async *ac, tk_reply_cb cb, void *data); /* release_on_close */
/* close: every ACQUIRE sent on the live connection and not answered fails TK_ERR_CLOSED now and
 * is withdrawn (CANCEL; a grant that races it is released). Returns how many. */
unsigned tk__withdraw_acquires(tk_async *ac);
bool tk__withdrawals_pending(const tk_async *ac); /* withdrawals (CANCEL, raced grants) unanswered */

/* lock.c */
tk_lock *tk__lock_new(tk_async *ac, const tk_req *acq, uint64_t token, uint32_t lease_ms, int64_t deadline_us);
void tk__lock_ref(tk_lock *l);
void tk__lock_unref(tk_lock *l);
void tk__lock_lost(tk_async *ac, tk_lock *l, tk_lost_reason reason);
void tk__lock_released(tk_async *ac, tk_lock *l);
void tk__lock_extended(tk_async *ac, tk_lock *l, uint64_t id, uint32_t lease_ms, int64_t t_first);
void tk__lock_timer(tk_async *ac, tk_lock *l, tk_timer *t, int64_t now);
void tk__lock_detach_all(tk_async *ac); /* the context is being freed */
void tk__lock_stop_keepalive(tk_async *ac, tk_lock *l);
/* A lost lock: tells the server in the background (RELEASE, once), unless it was lost to a
 * restart or a NOT_HELD answer (nothing is left to release). */
void tk__lock_tell_lost(tk_async *ac, tk_lock *l);
void tk__lock_release_failed(tk_async *ac, tk_lock *l); /* a RELEASE of it failed: back to held */
bool tk__lock_check_deadline(tk_async *ac, tk_lock *l); /* lost now if its timer is overdue; true if lost */
tk_lock *tk__lock_by_token(tk_async *ac, uint64_t token);
tk_lock *tk__lock_by_key(tk_async *ac, const uint8_t *key, size_t len);

/* client.c: the blocking client's mutex around a lock's context (NULL without one). */
void tk__client_lock(tk_client *c);
void tk__client_unlock(tk_client *c); /* also dispatches the events queued meanwhile */
void tk__client_unlock_plain(tk_client *c); /* only unlocks */

#endif
