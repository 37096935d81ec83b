/*
 * ticketing/ticketing.h - the official C client of Ticketing, the distributed lock server.
 *
 * Two ways to use it, one protocol engine underneath:
 *
 *  - tk_client, the blocking API: tk_client_connect(), tk_acquire(), tk_lock_release()...
 *    A tk_client is safe for use by any number of threads. It runs ONE background thread per
 *    client (its I/O thread) that reads answers, runs timers (request timeouts, heartbeat,
 *    keep-alive, lost deadlines) and reconnects; lost callbacks run on it.
 *
 *  - tk_async, the non-blocking API for event loops (in the spirit of hiredis' async context):
 *    no threads at all. The caller polls tk_async_fd() for tk_async_want_read() /
 *    tk_async_want_write(), sleeps at most tk_async_timeout_ms(), and calls tk_async_process().
 *    Keep-alive and lost deadlines run from that call. Requests complete through callbacks.
 *    A tk_async is not thread-safe: use it from one thread.
 *
 * Conventions: every fallible function returns a tk_err (TK_OK is 0). Blocking calls take an
 * optional tk_error* last (NULL allowed) that receives the code and a one-line message; the
 * handle also remembers its last failure (tk_client_last_error(), tk_async_errstr()), like
 * hiredis' c->err / c->errstr. Nothing here aborts or asserts on bad input; every object has an
 * explicit *_free; there is no global state (OpenSSL initialises itself).
 *
 * Keys are byte strings: (pointer, length). TK_KEY("order-1234") expands to both for a C string.
 * Durations are integer milliseconds (int64_t) so that bad values (negative, zero) can be
 * reported instead of wrapping around.
 *
 * fork(): a client created before fork() belongs to the parent. In the child every call on it
 * fails with TK_ERR_FORKED (detected with getpid()); tk_client_free()/tk_async_free() in the
 * child only release memory and never touch the parent's connection. Create a new client in the
 * child (it gets a new session id).
 */
#ifndef TICKETING_TICKETING_H
#define TICKETING_TICKETING_H

#include <stddef.h>
#include <stdint.h>

#include "ticketing/wire.h"

#ifdef __cplusplus
extern "C" {
#endif

/** Library version, "MAJOR.MINOR.PATCH". */
#define TK_VERSION "0.3.0"

/** Expands to `s, strlen(s)`: a NUL-terminated key for the (key, key_len) parameters. */
#define TK_KEY(s) (s), strlen(s)

/** wait_ms: wait in the queue without limit. */
#define TK_WAIT_FOREVER ((int64_t)TK_WAIT_FOREVER_MS)

/** A duration option set to this is switched off (heartbeat_ms). */
#define TK_OFF ((int64_t)-1)

/** Error codes. The names are the conformance kinds of tests/conformance/DRIVER.md. */
typedef enum tk_err {
    TK_OK = 0,                  /**< success */
    TK_ERR_NOT_ACQUIRED,        /**< the wait timeout passed or a try found the key taken (TIMED_OUT) */
    TK_ERR_CANCELLED,           /**< the caller cancelled the acquire (or the server answered CANCELLED) */
    TK_ERR_NOT_HELD,            /**< NOT_HELD to a release/extend by key and token: nothing changed */
    TK_ERR_LOCK_LOST,           /**< the lock handle is lost; tk_error.reason says why */
    TK_ERR_INVALID_ARGUMENT,    /**< rejected before sending, or INVALID from the server (detail: field) */
    TK_ERR_ALREADY_HELD,        /**< refuse_held was set and this client holds the key */
    TK_ERR_AUTH_FAILED,         /**< wrong token, token required, or the server's proof failed */
    TK_ERR_UNSUPPORTED_VERSION, /**< the server does not speak protocol version 1 */
    TK_ERR_UNAVAILABLE,         /**< no endpoint could be connected to */
    TK_ERR_TLS,                 /**< the TLS handshake failed (or TLS/plaintext mismatch) */
    TK_ERR_TIMEOUT,             /**< a request timeout or dial timeout passed */
    TK_ERR_CONNECTION_LOST,     /**< the connection dropped and the session could not be resumed */
    TK_ERR_SERVER_RESTARTED,    /**< the server's state id changed while the call was in flight */
    TK_ERR_BUSY,                /**< BUSY: a server limit (tk_error.detail) */
    TK_ERR_SHUTTING_DOWN,       /**< SHUTTING_DOWN */
    TK_ERR_CLOSED,              /**< the client was closed */
    TK_ERR_PROTOCOL,            /**< the server broke the protocol, or answered an unknown status */
    TK_ERR_FORKED,              /**< the client was created in another process (before fork) */
    TK_ERR_NO_MEMORY            /**< out of memory */
} tk_err;

/** Why a lock was lost. */
typedef enum tk_lost_reason {
    TK_LOST_NONE = 0,            /**< not lost */
    TK_LOST_EXPIRED,             /**< the local deadline passed, or EXPIRED (reason LEASE) */
    TK_LOST_NOT_HELD,            /**< NOT_HELD answered an extend or release of the lock */
    TK_LOST_SERVER_RESTARTED,    /**< a reconnect found a different state id */
    TK_LOST_SERVER_STOPPING      /**< EXPIRED with reason STOPPING */
} tk_lost_reason;

/** The result of a call: code, context, and a one-line message. */
typedef struct tk_error {
    tk_err code;           /**< TK_OK when the call succeeded */
    tk_lost_reason reason; /**< TK_ERR_LOCK_LOST: why */
    int status;            /**< the server's status when the error is its answer, else -1 */
    uint32_t detail;       /**< INVALID: field code; BUSY: limit code; else 0 */
    char message[256];     /**< one line, NUL-terminated, "" on success */
} tk_error;

/** Returns a short constant name for a code ("not acquired", "lock lost"...). */
TK_API const char *tk_strerror(tk_err code);

/** Returns the conformance name of a code ("not_acquired", "lock_lost"...). */
TK_API const char *tk_err_kind(tk_err code);

/** Returns the name of a lost reason ("expired", "not held", "server restarted"...). */
TK_API const char *tk_lost_reason_str(tk_lost_reason reason);

typedef struct tk_lock tk_lock;
typedef struct tk_client tk_client;
typedef struct tk_async tk_async;

/**
 * Lost callback: called once per lock, at the first of its local deadline, an EXPIRED notice,
 * a NOT_HELD answer to its extend or release, or a reconnect that finds a new state id. Never
 * after a successful release. With tk_client it runs on the I/O thread (or a thread inside a call
 * of that client) with no library lock held: it may call into the client, but a blocking call from
 * the I/O thread is refused (TK_ERR_INVALID_ARGUMENT); it should return promptly. With tk_async it
 * runs inside tk_async_process(). The lock handle stays valid during the call.
 */
typedef void (*tk_lost_cb)(tk_lock *lock, tk_lost_reason reason, void *data);

/** Diagnostic log callback (level: 0 debug, 1 info, 2 warning). Off by default. */
typedef void (*tk_log_cb)(int level, const char *message, void *data);

/**
 * Client options. A zero-initialised struct gives every default: set only what you need.
 * Strings are copied at creation time.
 */
typedef struct tk_options {
    /** Endpoints "host:port" or "[v6]:port", tried in order; the leader hint first when known.
     *  Default: {"127.0.0.1:7070"}. */
    const char *const *endpoints;
    size_t n_endpoints; /**< number of endpoints; default 0 = the default endpoint */

    /** Shared auth token (bytes); NULL = none (default). With a token, a server that does not
     *  require auth is refused. */
    const void *token;
    size_t token_len; /**< token bytes; 0 = strlen(token) */

    int tls;                     /**< non-zero: TLS 1.2+ (default off) */
    const char *tls_ca_file;     /**< PEM CA bundle to verify the server; NULL = the system's */
    const char *tls_cert_file;   /**< PEM client certificate for mutual TLS; NULL = none */
    const char *tls_key_file;    /**< PEM private key of tls_cert_file */
    const char *tls_server_name; /**< name (or IP) to verify and send as SNI; NULL = the endpoint's host */

    int64_t dial_timeout_ms;     /**< TCP + TLS + handshake per endpoint; 0 = default 5000; once TCP is
                                      connected, TLS and the handshake get at most 2000 of it */
    int64_t request_timeout_ms;  /**< every answer except an ACQUIRE's queued time; 0 = default 10000.
                                      Calls made while no connection exists wait for one within it:
                                      fail fast with a short one */
    int64_t heartbeat_ms;        /**< PING after this long without input (after at most 250 while a
                                      request waits); a PING unanswered within min(heartbeat, 750)
                                      replaces the connection; 0 = default 2000; TK_OFF = off */
    int64_t backoff_min_ms;      /**< reconnect backoff start; 0 = default 50 */
    int64_t backoff_max_ms;      /**< reconnect backoff cap; 0 = default 2000 */
    int64_t cleanup_timeout_ms;  /**< how long a cancelled acquire waits for its clean-up (and close for
                                      the withdrawal of queued acquires); 0 = default 5000 */
    int release_on_close;        /**< non-zero: closing releases every lock still held (default off) */

    tk_lost_cb on_lost;          /**< lost callback for locks without their own; NULL = none */
    void *on_lost_data;          /**< passed to on_lost */
    tk_log_cb log;               /**< diagnostics; NULL = silent (default) */
    void *log_data;              /**< passed to log */
} tk_options;

/** Per-acquire options. A zero-initialised struct (or NULL) gives every default. */
typedef struct tk_acquire_opts {
    int keepalive;          /**< non-zero: EXTEND with the lease every lease/3 until release or loss */
    int64_t max_hold_ms;    /**< keep-alive stops this long after the grant; 0 = no cap */
    int refuse_held;        /**< non-zero: fail TK_ERR_ALREADY_HELD if this client holds the key */
    tk_lost_cb on_lost;     /**< lost callback of this lock (overrides tk_options.on_lost) */
    void *on_lost_data;     /**< passed to on_lost */
    /** Frees on_lost_data: called exactly once by the library whatever the call's outcome (when
     *  the lock is freed and no callback can run any more, or when no lock results). It may run
     *  with the client's lock held: it must not call into the client. NULL = nothing. */
    void (*on_lost_data_free)(void *data);
} tk_acquire_opts;

/** A key's state as INSPECT reports it. */
typedef struct tk_inspect_info {
    int held;               /**< somebody holds the key */
    uint64_t token;         /**< holder's token: only with token_match or session */
    uint32_t lease_left_ms; /**< ms left on the holder's lease */
    uint32_t waiters;       /**< acquires queued on the key */
    uint32_t held_for_ms;   /**< ms since the lock was granted */
    uint32_t lock_delay_ms; /**< ms of lock-delay left; with TK_INSPECT_STARTUP, the start-up wait left */
    uint32_t flags;         /**< tk_inspect_flag bits (TK_INSPECT_STALLED, TK_INSPECT_STARTUP...) */
    int token_match;        /**< the token asked about is the holder's */
    int session;            /**< this client's session holds the key */
} tk_inspect_info;

/* ---------------------------------------------------------------------------------------------
 * Blocking client (thread-safe; one background I/O thread per client)
 * ------------------------------------------------------------------------------------------- */

/**
 * Connects to the first endpoint that completes the handshake and returns a client in *out.
 * Fails TK_ERR_UNAVAILABLE when no endpoint answers (one round over the list), and at once with
 * TK_ERR_AUTH_FAILED, TK_ERR_UNSUPPORTED_VERSION or TK_ERR_TLS where no other endpoint would help.
 * A round in which a node answered NOT_LEADER (a cluster electing a leader) is retried after the
 * shortest backoff until request_timeout_ms has passed since the call began; it then fails
 * TK_ERR_UNAVAILABLE with the last round's error.
 * opts may be NULL (all defaults).
 */
TK_API tk_err tk_client_connect(const tk_options *opts, tk_client **out, tk_error *err);

/**
 * Closes the client: calls in flight fail TK_ERR_CLOSED, keep-alive stops, the I/O thread ends,
 * later calls fail TK_ERR_CLOSED. Acquires waiting in a queue fail TK_ERR_CLOSED at once and are
 * withdrawn from the server (CANCEL; a grant that raced it is released): close waits for those
 * answers at most min(cleanup_timeout_ms, request_timeout_ms), so a closed client is never
 * granted a lock it would hold until its session ends. Held locks are NOT released (the server
 * keeps them until their lease ends) unless release_on_close is set: then each is released
 * first, bounded by the request timeout. Idempotent. The handle stays valid until tk_client_free.
 */
TK_API void tk_client_close(tk_client *c);

/** Closes (if needed) and frees the client. No other thread may use it any more. Lock handles
 *  stay valid (their operations then fail TK_ERR_CLOSED) until tk_lock_free. NULL is a no-op. */
TK_API void tk_client_free(tk_client *c);

/** Copies the client's 16-byte session id (random, new after a server restart). */
TK_API tk_err tk_client_session_id(tk_client *c, uint8_t out[TK_SESSION_ID_SIZE]);

/** Copies the client's last failure (any thread's) into *err. Returns its code. */
TK_API tk_err tk_client_last_error(tk_client *c, tk_error *err);

/**
 * Acquires key for lease_ms, waiting in the server's FIFO queue up to wait_ms (0 = try once,
 * TK_WAIT_FOREVER = without limit). On TK_OK, *out is the held lock (free it with tk_lock_free
 * after releasing it). TK_ERR_NOT_ACQUIRED when the wait passed. The lease starts at the grant.
 * If the request times out or the session is lost while waiting, the acquire is withdrawn (and a
 * grant that raced it released) in the background, so it never leaves a lock held.
 * Acquiring a key this client already holds queues behind itself unless opts->refuse_held.
 */
TK_API tk_err tk_acquire(tk_client *c, const void *key, size_t key_len, int64_t lease_ms, int64_t wait_ms,
                  const tk_acquire_opts *opts, tk_lock **out, tk_error *err);

/**
 * Tries once (wait 0). Returns TK_OK with *out the lock, or TK_OK with *out NULL when the key is
 * taken ("not acquired" is a value here, not an error).
 */
TK_API tk_err tk_try_acquire(tk_client *c, const void *key, size_t key_len, int64_t lease_ms,
                      const tk_acquire_opts *opts, tk_lock **out, tk_error *err);

/** Releases key held with token, from any client (the owner is the token). TK_ERR_NOT_HELD when
 *  the token does not hold it (nothing changed). Prefer tk_lock_release with a handle. */
TK_API tk_err tk_release(tk_client *c, const void *key, size_t key_len, uint64_t token, tk_error *err);

/** Sets the lease of key held with token to lease_ms from now; *lease_out (may be NULL) gets the
 *  lease granted. TK_ERR_NOT_HELD when the token does not hold it. */
TK_API tk_err tk_extend(tk_client *c, const void *key, size_t key_len, uint64_t token, int64_t lease_ms,
                 uint32_t *lease_out, tk_error *err);

/** Asks the server about key (token 0, or a token to check). Changes nothing. */
TK_API tk_err tk_inspect(tk_client *c, const void *key, size_t key_len, uint64_t token, tk_inspect_info *out,
                  tk_error *err);

/** Sends PING and waits for its answer. */
TK_API tk_err tk_ping(tk_client *c, tk_error *err);

/**
 * Scoped helper: acquires key, runs body(lock, data), then releases the lock. Returns the
 * acquire's error when it was not acquired (body does not run); TK_ERR_LOCK_LOST (reason in err)
 * when the lock was lost while body ran (body is not interrupted: long bodies should check
 * tk_lock_lost); else the release's result. body's return value goes to *body_result (may be NULL).
 */
TK_API tk_err tk_with_lock(tk_client *c, const void *key, size_t key_len, int64_t lease_ms, int64_t wait_ms,
                    const tk_acquire_opts *opts, int (*body)(tk_lock *lock, void *data), void *data,
                    int *body_result, tk_error *err);

/* ---------------------------------------------------------------------------------------------
 * Lock handles (tk_lock): from tk_acquire, tk_try_acquire, or a tk_async acquire callback
 * ------------------------------------------------------------------------------------------- */

/** The fencing token: larger than every token granted before it. Pass it to the resource. */
TK_API uint64_t tk_lock_token(const tk_lock *lock);

/** The key (not NUL-terminated; *len gets its length when len is not NULL). */
TK_API const uint8_t *tk_lock_key(const tk_lock *lock, size_t *len);

/** The lease last granted (acquire or extend), in ms. */
TK_API uint32_t tk_lock_lease_ms(const tk_lock *lock);

/** TK_LOST_NONE while the lock is not lost, else why it was lost. */
TK_API tk_lost_reason tk_lock_lost(const tk_lock *lock);

/** Milliseconds until the lost signal fires by the local deadline (0 when lost or released). */
TK_API int64_t tk_lock_remaining_ms(const tk_lock *lock);

/** Microseconds from now to the local deadline itself (the lost signal fires up to
 *  TK_LOST_MARGIN_MS before it); negative once it has passed. */
TK_API int64_t tk_lock_deadline_in_us(const tk_lock *lock);

/** Non-zero once the lock was released successfully. */
TK_API int tk_lock_released(const tk_lock *lock);

/**
 * Releases the lock (blocking; tk_client locks only). TK_OK: released, the next waiter is granted
 * at once, and lost will never fire. TK_ERR_LOCK_LOST (reason in err): the server answered
 * NOT_HELD, or the lock had been lost earlier: then the answer comes at once, without waiting for
 * the server (which may be unreachable), and the server is told in the background (a RELEASE,
 * once; none after a restart or a NOT_HELD: nothing is left to release). Releasing twice is TK_OK.
 */
TK_API tk_err tk_lock_release(tk_lock *lock, tk_error *err);

/** Extends the lease to lease_ms from now (blocking; tk_client locks only). TK_ERR_LOCK_LOST when
 *  the lock is lost or the server answers NOT_HELD. */
TK_API tk_err tk_lock_extend(tk_lock *lock, int64_t lease_ms, tk_error *err);

/** Asks the server whether this lock still holds its key (INSPECT with the token); *held gets
 *  the answer. Changes nothing. */
TK_API tk_err tk_lock_verify(tk_lock *lock, int *held, tk_error *err);

/** Frees the handle WITHOUT releasing the lock (its keep-alive stops; the server keeps the lock
 *  until its lease ends). NULL is a no-op. */
TK_API void tk_lock_free(tk_lock *lock);

/** Releases the lock in the background if it is still held, or tells the server of a lock lost
 *  earlier as tk_lock_release does (never blocks), then frees the handle: what the C++ Lock
 *  destructor does. NULL is a no-op. */
TK_API void tk_lock_drop(tk_lock *lock);

/* ---------------------------------------------------------------------------------------------
 * Non-blocking API (tk_async): no threads; the caller's event loop drives it
 * ------------------------------------------------------------------------------------------- */

/** A completed request, passed to its callback. Pointers are valid during the callback only. */
typedef struct tk_reply {
    tk_err code;              /**< TK_OK or the failure */
    const tk_error *error;    /**< full error (message, reason, status, detail) */
    uint64_t request_id;      /**< the request's id */
    tk_lock *lock;            /**< acquire: the new lock on TK_OK; the callback owns it (tk_lock_free) */
    uint64_t token;           /**< acquire/extend: the token */
    uint32_t lease_ms;        /**< acquire/extend: the lease granted */
    uint32_t queued_ms;       /**< acquire: ms spent queued on the server */
    int held;                 /**< verify: the lock still holds its key */
    const tk_inspect_info *inspect; /**< inspect: the key's state */
} tk_reply;

/** Request callback: ac is the context (NULL for tk_client calls); data is what the call was
 *  given. Every accepted request gets exactly one callback, TK_ERR_CLOSED at the latest. */
typedef void (*tk_reply_cb)(tk_async *ac, const tk_reply *reply, void *data);

/** Connect callback: TK_OK once the first handshake succeeded, else why the first connect failed
 *  (the context is then closed). */
typedef void (*tk_connect_cb)(tk_async *ac, const tk_error *result, void *data);

/** Creates a context (nothing is connected yet). NULL on bad options or no memory (err says). */
TK_API tk_async *tk_async_new(const tk_options *opts, tk_error *err);

/**
 * Starts connecting (one round over the endpoints). cb (may be NULL) reports the outcome. A
 * round in which a node answered NOT_LEADER (an election) is retried, like a reconnect, on the
 * context's timer after the shortest backoff, until request_timeout_ms has passed since this call
 * (then cb gets TK_ERR_UNAVAILABLE, the last round's error); any other failed round fails at once.
 * Requests may be issued before it completes; they are sent after the handshake. Later
 * connection losses reconnect (with backoff) by themselves and resume the session.
 * Name resolution (getaddrinfo) blocks: use numeric addresses inside latency-sensitive loops.
 */
TK_API tk_err tk_async_connect(tk_async *ac, tk_connect_cb cb, void *data);

/** The socket to poll, or -1 (none now: only the timeout matters). It changes on reconnect:
 *  ask again after every tk_async_process call. */
TK_API int tk_async_fd(const tk_async *ac);

/** Non-zero when the loop should poll the fd for reading. */
TK_API int tk_async_want_read(const tk_async *ac);

/** Non-zero when the loop should poll the fd for writing. */
TK_API int tk_async_want_write(const tk_async *ac);

/** Milliseconds until tk_async_process must run again at the latest (timers; at most
 *  TK_LOST_CHECK_MS while a lock is held), or -1 for none. */
TK_API int tk_async_timeout_ms(const tk_async *ac);

/* Readiness bits for tk_async_process (translate poll()'s revents, or your loop's, into these). */
#define TK_EV_READ 1  /**< the fd is readable, or has an error or hang-up (POLLIN|POLLERR|POLLHUP) */
#define TK_EV_WRITE 2 /**< the fd is writable (POLLOUT) */

/**
 * Does the work: reads and dispatches answers (TK_EV_READ), writes queued requests
 * (TK_EV_WRITE), runs due timers (always), reconnects. Callbacks run from here. events may be 0
 * (timers only). Returns TK_ERR_CLOSED once the context is closed, else TK_OK.
 */
TK_API tk_err tk_async_process(tk_async *ac, int events);

/** Reads and dispatches what the socket has (tk_async_process with TK_EV_READ). */
TK_API tk_err tk_async_process_input(tk_async *ac);

/** Writes what is queued (tk_async_process with TK_EV_WRITE). */
TK_API tk_err tk_async_process_output(tk_async *ac);

/**
 * Queues an ACQUIRE; cb gets the lock (reply->lock, owned by the callback) or the failure.
 * *request_id (may be NULL) identifies it for tk_async_cancel. Returns an error at once (and
 * never calls cb) when the arguments are invalid or the context is closed.
 */
TK_API tk_err tk_async_acquire(tk_async *ac, const void *key, size_t key_len, int64_t lease_ms, int64_t wait_ms,
                        const tk_acquire_opts *opts, tk_reply_cb cb, void *data, uint64_t *request_id);

/**
 * Cancels a pending acquire: it is withdrawn with CANCEL (on the next connection of the session
 * if the current one is gone) and a grant that raced the cancel is released. Its callback then
 * gets TK_ERR_CANCELLED once that is done (or after cleanup_timeout_ms; the clean-up then
 * continues in the background). Returns TK_ERR_INVALID_ARGUMENT when no acquire with that id
 * is pending (already answered).
 */
TK_API tk_err tk_async_cancel(tk_async *ac, uint64_t request_id);

/** Releases a lock handle (see tk_lock_release); cb may be NULL. */
TK_API tk_err tk_async_release(tk_async *ac, tk_lock *lock, tk_reply_cb cb, void *data);

/** Extends a lock handle (see tk_lock_extend); cb may be NULL. */
TK_API tk_err tk_async_extend(tk_async *ac, tk_lock *lock, int64_t lease_ms, tk_reply_cb cb, void *data);

/** Verifies a lock handle (see tk_lock_verify): reply->held. */
TK_API tk_err tk_async_verify(tk_async *ac, tk_lock *lock, tk_reply_cb cb, void *data);

/** Releases key by token (see tk_release); cb may be NULL. */
TK_API tk_err tk_async_release_token(tk_async *ac, const void *key, size_t key_len, uint64_t token,
                              tk_reply_cb cb, void *data);

/** Extends key by token (see tk_extend). */
TK_API tk_err tk_async_extend_token(tk_async *ac, const void *key, size_t key_len, uint64_t token,
                             int64_t lease_ms, tk_reply_cb cb, void *data);

/** Inspects key (see tk_inspect): reply->inspect. */
TK_API tk_err tk_async_inspect(tk_async *ac, const void *key, size_t key_len, uint64_t token, tk_reply_cb cb,
                        void *data);

/** Sends PING. */
TK_API tk_err tk_async_ping(tk_async *ac, tk_reply_cb cb, void *data);

/** Closes the context: pending callbacks get TK_ERR_CLOSED (from inside this call); queued
 *  acquires are withdrawn (their CANCELs written if the socket takes them now: this call never
 *  waits), then the socket is closed; locks are not released (see release_on_close for
 *  tk_client). Idempotent. */
TK_API void tk_async_close(tk_async *ac);

/** Closes and frees the context. Safe inside its own callbacks (the free is deferred to the end
 *  of the current tk_async_process). NULL is a no-op. */
TK_API void tk_async_free(tk_async *ac);

/** The context's last failure code (TK_OK if none). */
TK_API tk_err tk_async_err(const tk_async *ac);

/** The context's last failure message ("" if none). Valid until the next call on ac. */
TK_API const char *tk_async_errstr(const tk_async *ac);

/** Copies the context's 16-byte session id. */
TK_API void tk_async_session_id(const tk_async *ac, uint8_t out[TK_SESSION_ID_SIZE]);

/* ---------------------------------------------------------------------------------------------
 * Non-blocking calls on a blocking client (callbacks run on its I/O thread)
 * ------------------------------------------------------------------------------------------- */

/** tk_async_acquire on a tk_client: returns at once (the request is queued, ids in call order);
 *  cb runs on the I/O thread with no library lock held (reply->lock is the callback's to free).
 *  Cancel it with tk_client_cancel. */
TK_API tk_err tk_client_acquire_async(tk_client *c, const void *key, size_t key_len, int64_t lease_ms,
                               int64_t wait_ms, const tk_acquire_opts *opts, tk_reply_cb cb, void *data,
                               uint64_t *request_id, tk_error *err);

/** tk_async_cancel on a tk_client. */
TK_API tk_err tk_client_cancel(tk_client *c, uint64_t request_id, tk_error *err);

/** 1 when the calling thread is c's I/O thread (inside one of its callbacks), where a blocking
 *  call is refused; else 0 (NULL c: 0). For wrappers that wait themselves (the C++ stop_token
 *  acquire) and must not wait there. */
TK_API int tk_client_on_io_thread(const tk_client *c);

#ifdef __cplusplus
}
#endif

#endif /* TICKETING_TICKETING_H */
