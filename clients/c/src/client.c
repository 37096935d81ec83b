/*
 * The blocking client: a tk_async engine behind a mutex, driven by one I/O thread per client.
 *
 * Threads: callers submit requests under mu (and write them at once when the socket allows);
 * the I/O thread polls the socket and a wake-up pipe, then processes input, timers and
 * reconnects under mu. Callbacks never run under mu: events are taken from the engine under mu
 * and run after it is released (by the I/O thread, or by the caller whose call queued them).
 * A blocking call waits on its own semaphore for its completion event, not on a condition
 * variable of mu: the I/O thread completes a batch of waiters without taking mu once per waiter,
 * and a woken caller returns without taking mu again (unless it must record an error).
 *
 * Writes: a caller writes its request to the socket at once (under mu) while the I/O thread sleeps
 * in poll(); while the I/O thread is waking a batch of blocking callers (defer_flush), a caller
 * only queues its request, and the I/O thread writes everything queued meanwhile in one send()
 * when the batch is done. Without that, N threads each paid a send() under mu per request, one
 * after another (the C++ wrapper's blocking API did 0.06x the raw driver's pairs/s with 16
 * threads).
 */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <semaphore.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "internal.h"



struct tk_client {
    pthread_mutex_t mu;
    tk_async *ac;
    pthread_t thread;
    bool thread_started;
    bool thread_joined;
    int wake[2];        /* pipe: written to wake the I/O thread */
    bool stop;
    bool closed;
    bool polling;       /* the I/O thread sleeps in poll() with the values below */
    bool defer_flush;   /* the I/O thread is waking blocking callers only, and writes after */
    int poll_fd;
    short poll_events;
    int64_t poll_until; /* INT64_MAX: no timeout */
    pid_t pid;
    tk_error last;
    pthread_cond_t progress; /* broadcast by the I/O thread after each step while closing */
    bool progress_init;
};

/* A blocking call's completion: the callback writes the results, then posts done (once); the
 * caller reads them once it has taken done (sem_post and sem_wait order the memory). */
typedef struct waiter {
    tk_client *c;
    sem_t done;
    tk_error err;
    tk_reply reply;
    tk_inspect_info inspect;
} waiter;

void tk__client_lock(tk_client *c)
{
    if (c)
        pthread_mutex_lock(&c->mu);
}

/* Writes what is queued, or leaves it to the I/O thread when it writes soon (defer_flush); wakes
 * the I/O thread when what it polls for (fd, events, timeout) changed. c->mu held. */
static void kick(tk_client *c)
{
    tk_async *ac = c->ac;
    if (c->defer_flush)
        return; /* the I/O thread is awake, and flushes and recomputes its poll() before sleeping */
    if (tk__conn_want_write(ac) && !ac->ssl_read_wants_write)
        tk__conn_flush(ac);
    if (!c->polling)
        return;
    short ev = (short)((tk_async_want_read(ac) ? POLLIN : 0) | (tk_async_want_write(ac) ? POLLOUT : 0));
    int t = tk_async_timeout_ms(ac);
    int64_t until = t < 0 ? INT64_MAX : tk__now_us() + (int64_t)t * 1000;
    if (ac->fd != c->poll_fd || ev != c->poll_events || until < c->poll_until || ac->ev_head) {
        char b = 1;
        ssize_t n = write(c->wake[1], &b, 1);
        (void)n;
        c->polling = false; /* one wake-up is enough */
    }
}

void tk__client_unlock_plain(tk_client *c)
{
    if (c)
        pthread_mutex_unlock(&c->mu);
}

void tk__client_unlock(tk_client *c)
{
    kick(c);
    tk_event *ev = tk__take_events(c->ac);
    pthread_mutex_unlock(&c->mu);
    tk__run_events(ev);
}

static void waiter_cb(tk_async *ac, const tk_reply *r, void *data);

/* True when every event of the list completes a blocking caller (waiter_cb): running them is
 * quick (no user code), so the callers they wake may leave their next request to the I/O thread. */
static bool only_waiters(const tk_event *ev)
{
    for (; ev; ev = ev->next)
        if (ev->kind != TK__EV_REPLY || ev->cb != waiter_cb)
            return false;
    return true;
}

static void *io_thread(void *arg)
{
    tk_client *c = arg;
    pthread_mutex_lock(&c->mu);
    while (!c->stop) {
        tk_async *ac = c->ac;
        struct pollfd p[2];
        p[0].fd = c->wake[0];
        p[0].events = POLLIN;
        p[1].fd = ac->fd;
        p[1].events = (short)((tk_async_want_read(ac) ? POLLIN : 0) | (tk_async_want_write(ac) ? POLLOUT : 0));
        int timeout = tk_async_timeout_ms(ac);
        c->polling = true;
        c->poll_fd = ac->fd;
        c->poll_events = p[1].events;
        c->poll_until = timeout < 0 ? INT64_MAX : tk__now_us() + (int64_t)timeout * 1000;
        pthread_mutex_unlock(&c->mu);
        int n = poll(p, ac->fd >= 0 ? 2 : 1, timeout);
        pthread_mutex_lock(&c->mu);
        c->polling = false;
        if (n > 0 && (p[0].revents & POLLIN)) {
            char buf[64];
            while (read(c->wake[0], buf, sizeof buf) > 0) {
            }
        }
        if (c->stop)
            break;
        int events = 0;
        if (n > 0 && ac->fd >= 0 && p[1].fd == ac->fd) {
            if (p[1].revents & (POLLIN | POLLERR | POLLHUP))
                events |= TK_EV_READ;
            if (p[1].revents & (POLLOUT | POLLERR))
                events |= TK_EV_WRITE;
        }
        tk__process(ac, events);
        if (c->closed && c->progress_init)
            pthread_cond_broadcast(&c->progress); /* tk_client_close waits for withdrawals */
        tk_event *ev = tk__take_events(ac);
        if (ev) {
            c->defer_flush = only_waiters(ev);
            pthread_mutex_unlock(&c->mu);
            tk__run_events(ev);
            pthread_mutex_lock(&c->mu);
            if (c->defer_flush) {
                /* what the woken callers queued meanwhile goes in one write */
                c->defer_flush = false;
                if (!c->stop && tk__conn_want_write(ac) && !ac->ssl_read_wants_write)
                    tk__conn_flush(ac);
            }
        }
    }
    c->defer_flush = false;
    pthread_mutex_unlock(&c->mu);
    return NULL;
}

static void waiter_init(waiter *w, tk_client *c)
{
    memset(w, 0, sizeof *w);
    w->c = c;
    sem_init(&w->done, 0, 0);
}

static void waiter_destroy(waiter *w) { sem_destroy(&w->done); }

static void waiter_cb(tk_async *ac, const tk_reply *r, void *data)
{
    (void)ac;
    waiter *w = data;
    w->reply = *r;
    w->err = *r->error;
    if (r->inspect)
        w->inspect = *r->inspect;
    w->reply.error = &w->err;
    w->reply.inspect = &w->inspect;
    sem_post(&w->done);
}

/* Waits (c->mu held) until w is done, running the events queued by this thread meanwhile.
 * Returns true with c->mu still held when w was done before any wait; false, with c->mu released,
 * when it slept (the events queued meanwhile are the I/O thread's to run). */
static bool waiter_wait(tk_client *c, waiter *w)
{
    for (;;) {
        kick(c);
        tk_event *ev = tk__take_events(c->ac);
        if (ev) {
            pthread_mutex_unlock(&c->mu);
            tk__run_events(ev);
            pthread_mutex_lock(&c->mu);
            continue;
        }
        if (sem_trywait(&w->done) == 0)
            return true;
        pthread_mutex_unlock(&c->mu);
        while (sem_wait(&w->done) != 0) {
            /* EINTR: a signal handler ran; wait on */
        }
        return false;
    }
}

/* Records e as the client's last error (c->mu held) and copies it to err. */
static tk_err finish(tk_client *c, const tk_error *e, tk_error *err)
{
    if (e->code != TK_OK && c)
        c->last = *e;
    if (err)
        *err = *e;
    return e->code;
}

/* Entry: checks the process and state; locks c->mu on TK_OK. A blocking call from the I/O
 * thread (inside a callback) would wait for that very thread: it is refused. */
static tk_err enter_mode(tk_client *c, tk_error *e, bool blocking)
{
    tk__clearerr(e);
    if (!c)
        return tk__seterr(e, TK_ERR_INVALID_ARGUMENT, "invalid argument: NULL client");
    if (tk__getpid() != c->pid)
        return tk__seterr(e, TK_ERR_FORKED,
                          "this client was created in process %ld before fork(); create a new client in this process",
                          (long)c->pid);
    if (blocking && c->thread_started && pthread_equal(pthread_self(), c->thread))
        return tk__seterr(e, TK_ERR_INVALID_ARGUMENT,
                          "a blocking call inside a callback on the client's I/O thread would wait forever; use "
                          "tk_client_acquire_async or another thread");
    pthread_mutex_lock(&c->mu);
    tk_err rc = c->closed ? tk__seterr(e, TK_ERR_CLOSED, "the client is closed") : tk__check_usable(c->ac, e);
    if (rc != TK_OK) {
        c->last = *e;
        pthread_mutex_unlock(&c->mu);
    }
    return rc;
}

static tk_err enter(tk_client *c, tk_error *e) { return enter_mode(c, e, true); }

/* After waiter_wait: records e (the client's last error when it is one) and copies it to err, and
 * leaves c->mu (running what this thread queued) when waiter_wait returned with it held. */
static tk_err finish_wait(tk_client *c, bool held, const tk_error *e, tk_error *err)
{
    if (!held && e->code != TK_OK) {
        pthread_mutex_lock(&c->mu);
        held = true;
    }
    tk_err rc = finish(c, e, err);
    if (held)
        tk__client_unlock(c);
    return rc;
}

static void connect_cb(tk_async *ac, const tk_error *result, void *data)
{
    (void)ac;
    waiter *w = data;
    w->err = *result;
    sem_post(&w->done);
}

tk_err tk_client_connect(const tk_options *opts, tk_client **out, tk_error *err)
{
    tk_error e;
    tk__clearerr(&e);
    if (!out)
        return tk__seterr(err, TK_ERR_INVALID_ARGUMENT, "invalid argument: out is NULL");
    *out = NULL;
    tk_client *c = calloc(1, sizeof *c);
    if (!c)
        return tk__seterr(err, TK_ERR_NO_MEMORY, "out of memory");
    c->pid = tk__getpid();
    c->wake[0] = c->wake[1] = -1;
    pthread_mutex_init(&c->mu, NULL);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    c->progress_init = pthread_cond_init(&c->progress, &ca) == 0;
    pthread_condattr_destroy(&ca);
    c->ac = tk_async_new(opts, &e);
    if (!c->ac)
        goto fail;
    c->ac->owner = c;
    c->ac->defer_dispatch = true;
    if (pipe2(c->wake, O_NONBLOCK | O_CLOEXEC) != 0) {
        tk__seterr(&e, TK_ERR_NO_MEMORY, "cannot create the wake-up pipe: %s", strerror(errno));
        goto fail;
    }
    waiter w;
    waiter_init(&w, c);
    pthread_mutex_lock(&c->mu);
    c->ac->connect_cb = connect_cb;
    c->ac->connect_data = &w;
    tk__conn_start_round(c->ac, true);
    if (pthread_create(&c->thread, NULL, io_thread, c) != 0) {
        c->ac->connect_cb = NULL;
        pthread_mutex_unlock(&c->mu);
        waiter_destroy(&w);
        tk__seterr(&e, TK_ERR_NO_MEMORY, "cannot start the I/O thread");
        goto fail;
    }
    c->thread_started = true;
    if (waiter_wait(c, &w))
        pthread_mutex_unlock(&c->mu);
    e = w.err;
    waiter_destroy(&w);
    if (e.code != TK_OK)
        goto fail;
    *out = c;
    return finish(NULL, &e, err);
fail:
    tk_client_free(c);
    return finish(NULL, &e, err);
}

static void join_thread(tk_client *c)
{
    if (c->thread_started && !c->thread_joined && !pthread_equal(pthread_self(), c->thread)) {
        pthread_join(c->thread, NULL);
        c->thread_joined = true;
    }
}

/* release_on_close: counts the answers of the releases. */
typedef struct close_wait {
    tk_client *c;
    pthread_cond_t cv;
    unsigned left;
} close_wait;

static void close_release_cb(tk_async *ac, const tk_reply *r, void *data)
{
    (void)ac;
    (void)r;
    close_wait *w = data;
    pthread_mutex_lock(&w->c->mu);
    w->left--;
    pthread_cond_signal(&w->cv);
    pthread_mutex_unlock(&w->c->mu);
}

void tk_client_close(tk_client *c)
{
    if (!c || tk__getpid() != c->pid)
        return;
    pthread_mutex_lock(&c->mu);
    if (c->closed) {
        pthread_mutex_unlock(&c->mu);
        join_thread(c);
        return;
    }
    c->closed = true;
    tk_async *ac = c->ac;
    bool waitable = ac && tk__check_usable(ac, NULL) == TK_OK && c->thread_started &&
                    !pthread_equal(pthread_self(), c->thread);
    if (waitable && c->progress_init && tk__withdraw_acquires(ac) > 0) {
        /* Queued acquires fail TK_ERR_CLOSED now and are withdrawn (CANCEL; a grant that raced it
         * is released); close waits for the server's answers, at most min(cleanup timeout,
         * request timeout), then finishes anyway (a frozen server). */
        int64_t wait_us = ac->cleanup_us < ac->request_timeout_us ? ac->cleanup_us : ac->request_timeout_us;
        struct timespec until;
        clock_gettime(CLOCK_MONOTONIC, &until);
        int64_t ns = until.tv_nsec + (wait_us % 1000000) * 1000;
        until.tv_sec += (time_t)(wait_us / 1000000 + ns / 1000000000);
        until.tv_nsec = (long)(ns % 1000000000);
        for (int guard = 0; guard < 100000; guard++) {
            kick(c);
            tk_event *ev = tk__take_events(ac);
            if (ev) {
                pthread_mutex_unlock(&c->mu);
                tk__run_events(ev);
                pthread_mutex_lock(&c->mu);
                continue;
            }
            if (!tk__withdrawals_pending(ac) ||
                pthread_cond_timedwait(&c->progress, &c->mu, &until) == ETIMEDOUT)
                break;
        }
    }
    if (ac && ac->release_on_close && tk__check_usable(ac, NULL) == TK_OK && c->thread_started &&
        !pthread_equal(pthread_self(), c->thread)) {
        close_wait w = {.c = c};
        pthread_condattr_t ca;
        pthread_condattr_init(&ca);
        pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
        pthread_cond_init(&w.cv, &ca);
        pthread_condattr_destroy(&ca);
        w.left = tk__release_all_held(ac, close_release_cb, &w);
        struct timespec until;
        clock_gettime(CLOCK_MONOTONIC, &until);
        int64_t ns = until.tv_nsec + (ac->request_timeout_us % 1000000) * 1000;
        until.tv_sec += (time_t)(ac->request_timeout_us / 1000000 + ns / 1000000000);
        until.tv_nsec = (long)(ns % 1000000000);
        for (int guard = 0; w.left > 0 && guard < 100000; guard++) {
            kick(c);
            tk_event *ev = tk__take_events(ac);
            if (ev) {
                pthread_mutex_unlock(&c->mu);
                tk__run_events(ev);
                pthread_mutex_lock(&c->mu);
                continue;
            }
            if (pthread_cond_timedwait(&w.cv, &c->mu, &until) == ETIMEDOUT)
                break;
        }
        /* what is left is answered CLOSED by tk__close below, before w goes away */
        tk__close(ac);
        tk_event *ev = tk__take_events(ac);
        pthread_mutex_unlock(&c->mu);
        tk__run_events(ev);
        pthread_mutex_lock(&c->mu);
        pthread_cond_destroy(&w.cv);
    }
    if (ac)
        tk__close(ac);
    c->stop = true;
    if (c->wake[1] >= 0) {
        char b = 1;
        ssize_t n = write(c->wake[1], &b, 1);
        (void)n;
    }
    tk_event *ev = ac ? tk__take_events(ac) : NULL;
    pthread_mutex_unlock(&c->mu);
    tk__run_events(ev);
    join_thread(c);
}

void tk_client_free(tk_client *c)
{
    if (!c)
        return;
    if (tk__getpid() != c->pid) {
        /* After fork: the parent's threads may have been mid-update; touch nothing but our
         * copies of the descriptors (closing them does not affect the parent). */
        if (c->ac && c->ac->fd >= 0)
            close(c->ac->fd);
        if (c->wake[0] >= 0)
            close(c->wake[0]);
        if (c->wake[1] >= 0)
            close(c->wake[1]);
        return;
    }
    tk_client_close(c);
    if (c->ac) {
        pthread_mutex_lock(&c->mu);
        c->ac->owner = NULL;
        c->ac->defer_dispatch = false;
        tk__drop_events(tk__take_events(c->ac));
        tk__free(c->ac, false);
        c->ac = NULL;
        pthread_mutex_unlock(&c->mu);
    }
    if (c->wake[0] >= 0)
        close(c->wake[0]);
    if (c->wake[1] >= 0)
        close(c->wake[1]);
    if (c->progress_init)
        pthread_cond_destroy(&c->progress);
    pthread_mutex_destroy(&c->mu);
    free(c);
}

tk_err tk_client_session_id(tk_client *c, uint8_t out[TK_SESSION_ID_SIZE])
{
    tk_error e;
    tk_err rc = enter_mode(c, &e, false);
    if (rc != TK_OK)
        return rc;
    if (out)
        memcpy(out, c->ac->session, TK_SESSION_ID_SIZE);
    pthread_mutex_unlock(&c->mu);
    return TK_OK;
}

tk_err tk_client_last_error(tk_client *c, tk_error *err)
{
    if (!c)
        return tk__seterr(err, TK_ERR_INVALID_ARGUMENT, "invalid argument: NULL client");
    if (tk__getpid() != c->pid)
        return tk__seterr(err, TK_ERR_FORKED, "the client belongs to process %ld", (long)c->pid);
    pthread_mutex_lock(&c->mu);
    tk_error e = c->last;
    pthread_mutex_unlock(&c->mu);
    if (err)
        *err = e;
    return e.code;
}

/* Runs one request built by submit (under mu) and waits for it. */
typedef tk_err (*submit_fn)(tk_client *c, waiter *w, void *arg, tk_error *e);

static tk_err run(tk_client *c, submit_fn submit, void *arg, waiter *w, tk_error *err)
{
    tk_error e;
    tk_err rc = enter(c, &e);
    if (rc != TK_OK)
        return finish(NULL, &e, err);
    waiter_init(w, c);
    rc = submit(c, w, arg, &e);
    if (rc != TK_OK) {
        rc = finish(c, &e, err);
        tk__client_unlock(c);
        waiter_destroy(w);
        return rc;
    }
    bool held = waiter_wait(c, w);
    rc = finish_wait(c, held, &w->err, err);
    waiter_destroy(w);
    return rc;
}

tk_err tk_acquire(tk_client *c, const void *key, size_t key_len, int64_t lease_ms, int64_t wait_ms,
                  const tk_acquire_opts *opts, tk_lock **out, tk_error *err)
{
    tk_error e;
    if (!out) {
        tk__opts_discard(opts);
        return tk__seterr(err, TK_ERR_INVALID_ARGUMENT, "invalid argument: out is NULL");
    }
    *out = NULL;
    tk_err rc = enter(c, &e);
    if (rc != TK_OK) {
        tk__opts_discard(opts);
        return finish(NULL, &e, err);
    }
    waiter w;
    waiter_init(&w, c);
    bool held = true;
    rc = tk__acquire(c->ac, key, key_len, lease_ms, wait_ms, opts, waiter_cb, &w, NULL, &e);
    if (rc == TK_OK) {
        held = waiter_wait(c, &w);
        e = w.err;
        rc = e.code;
        if (rc == TK_OK)
            *out = w.reply.lock;
    }
    finish_wait(c, held, &e, err);
    waiter_destroy(&w);
    return rc;
}

tk_err tk_try_acquire(tk_client *c, const void *key, size_t key_len, int64_t lease_ms, const tk_acquire_opts *opts,
                      tk_lock **out, tk_error *err)
{
    tk_err rc = tk_acquire(c, key, key_len, lease_ms, 0, opts, out, err);
    if (rc == TK_ERR_NOT_ACQUIRED) {
        tk__clearerr(err);
        return TK_OK;
    }
    return rc;
}

typedef struct simple_args {
    uint8_t op;
    const void *key;
    size_t key_len;
    uint64_t token;
    int64_t lease_ms;
    tk_lock *lock;
    bool verify;
} simple_args;

static tk_err submit_simple(tk_client *c, waiter *w, void *arg, tk_error *e)
{
    simple_args *a = arg;
    if (a->lock && a->lock->ac != c->ac)
        return tk__seterr(e, TK_ERR_CLOSED, "the lock's client is closed");
    return tk__simple(c->ac, a->op, a->key, a->key_len, a->token, a->lease_ms, a->lock, a->verify, waiter_cb, w, e);
}

tk_err tk_release(tk_client *c, const void *key, size_t key_len, uint64_t token, tk_error *err)
{
    simple_args a = {TK_OP_RELEASE, key, key_len, token, 0, NULL, false};
    waiter w;
    return run(c, submit_simple, &a, &w, err);
}

tk_err tk_extend(tk_client *c, const void *key, size_t key_len, uint64_t token, int64_t lease_ms, uint32_t *lease_out,
                 tk_error *err)
{
    simple_args a = {TK_OP_EXTEND, key, key_len, token, lease_ms, NULL, false};
    waiter w;
    tk_err rc = run(c, submit_simple, &a, &w, err);
    if (rc == TK_OK && lease_out)
        *lease_out = w.reply.lease_ms;
    return rc;
}

tk_err tk_inspect(tk_client *c, const void *key, size_t key_len, uint64_t token, tk_inspect_info *out, tk_error *err)
{
    simple_args a = {TK_OP_INSPECT, key, key_len, token, 0, NULL, false};
    waiter w;
    tk_err rc = run(c, submit_simple, &a, &w, err);
    if (rc == TK_OK && out)
        *out = w.inspect;
    return rc;
}

tk_err tk_ping(tk_client *c, tk_error *err)
{
    simple_args a = {TK_OP_PING, NULL, 0, 0, 0, NULL, false};
    waiter w;
    return run(c, submit_simple, &a, &w, err);
}

/* The client of a lock handle, or an error. */
static tk_client *lock_client(tk_lock *lock, tk_error *err, tk_err *rc)
{
    if (!lock) {
        *rc = tk__seterr(err, TK_ERR_INVALID_ARGUMENT, "invalid argument: NULL lock");
        return NULL;
    }
    if (!lock->ac) {
        *rc = tk__seterr(err, TK_ERR_CLOSED, "the lock's client is closed");
        return NULL;
    }
    if (!lock->ac->owner) {
        *rc = tk__seterr(err, TK_ERR_INVALID_ARGUMENT, "this lock belongs to a tk_async context: use tk_async_release/extend/verify");
        return NULL;
    }
    return lock->ac->owner;
}

static tk_err lock_op(tk_lock *lock, uint8_t op, int64_t lease_ms, bool verify, waiter *w, tk_error *err)
{
    tk_err rc = TK_OK;
    tk_client *c = lock_client(lock, err, &rc);
    if (!c)
        return rc;
    simple_args a = {op, NULL, 0, 0, lease_ms, lock, verify};
    return run(c, submit_simple, &a, w, err);
}

tk_err tk_lock_release(tk_lock *lock, tk_error *err)
{
    waiter w;
    return lock_op(lock, TK_OP_RELEASE, 0, false, &w, err);
}

tk_err tk_lock_extend(tk_lock *lock, int64_t lease_ms, tk_error *err)
{
    waiter w;
    return lock_op(lock, TK_OP_EXTEND, lease_ms, false, &w, err);
}

tk_err tk_lock_verify(tk_lock *lock, int *held, tk_error *err)
{
    waiter w;
    tk_err rc = lock_op(lock, TK_OP_INSPECT, 0, true, &w, err);
    if (held)
        *held = rc == TK_OK ? w.reply.held : 0;
    return rc;
}

tk_err tk_with_lock(tk_client *c, const void *key, size_t key_len, int64_t lease_ms, int64_t wait_ms,
                    const tk_acquire_opts *opts, int (*body)(tk_lock *lock, void *data), void *data, int *body_result,
                    tk_error *err)
{
    if (!body)
        return tk__seterr(err, TK_ERR_INVALID_ARGUMENT, "invalid argument: NULL body");
    tk_lock *lock = NULL;
    tk_err rc = tk_acquire(c, key, key_len, lease_ms, wait_ms, opts, &lock, err);
    if (rc != TK_OK)
        return rc;
    int br = body(lock, data);
    if (body_result)
        *body_result = br;
    tk_lost_reason lost = tk_lock_lost(lock);
    tk_error rel;
    rc = tk_lock_release(lock, &rel);
    if (lost != TK_LOST_NONE) {
        char k[128];
        tk__fmt_key(k, sizeof k, lock->key, lock->key_len);
        rc = tk__seterr(err, TK_ERR_LOCK_LOST, "lock lost (%s) while the body ran: %s token %llu", tk_lost_reason_str(lost),
                        k, (unsigned long long)lock->token);
        if (err)
            err->reason = lost;
    } else if (err) {
        *err = rel;
    }
    tk_lock_free(lock);
    return rc;
}

tk_err tk_client_acquire_async(tk_client *c, const void *key, size_t key_len, int64_t lease_ms, int64_t wait_ms,
                               const tk_acquire_opts *opts, tk_reply_cb cb, void *data, uint64_t *request_id,
                               tk_error *err)
{
    tk_error e;
    tk_err rc = enter_mode(c, &e, false);
    if (rc != TK_OK) {
        tk__opts_discard(opts);
        return finish(NULL, &e, err);
    }
    rc = tk__acquire(c->ac, key, key_len, lease_ms, wait_ms, opts, cb, data, request_id, &e);
    finish(c, &e, err);
    tk__client_unlock(c);
    return rc;
}

tk_err tk_client_cancel(tk_client *c, uint64_t request_id, tk_error *err)
{
    tk_error e;
    tk_err rc = enter_mode(c, &e, false);
    if (rc != TK_OK)
        return finish(NULL, &e, err);
    rc = tk__cancel(c->ac, request_id, &e);
    finish(c, &e, err);
    tk__client_unlock(c);
    return rc;
}

int tk_client_on_io_thread(const tk_client *c)
{
    return c && c->thread_started && pthread_equal(pthread_self(), c->thread) ? 1 : 0;
}
