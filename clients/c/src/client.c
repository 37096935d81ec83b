/*
 * The blocking client: a tk_async engine behind a mutex (mu), plus one I/O thread per client.
 *
 * Reading (leader/follower): one thread at a time holds the reading role, polls the socket and a
 * wake-up pipe, and processes what arrives (answers, timers, reconnects) under mu. A blocking
 * caller that waits for its answer takes the role itself when no thread holds it: it reads,
 * handles every answer it finds, wakes only the callers whose answers came (each on its own
 * semaphore: no shared condition, no thundering herd) and keeps reading until its own answer is
 * in. A call then costs no thread hand-off at all (one caller: send, poll, recv), and with many
 * callers one thread reads for all of them while the others sleep until their answer is there.
 * A caller that finds the role held sleeps; when the holder's own answer is in it gives the role
 * up: it leaves it free while a caller it woke is still running (that caller takes it when it
 * waits again, or the last of them to leave hands it on), else it hands it to a sleeping caller
 * whose answer is still out. The I/O thread takes the role when no caller waits: after
 * READ_LINGER_US without a reading caller (pushes of an idle connection), at once when an answer
 * no blocking caller reads is due (tk_client_acquire_async, background releases, withdrawals) or
 * a timer is due, and hands it to a caller that comes to wait (a sleeper) after its turn.
 *
 * Callbacks never run under mu, and user callbacks (lost, tk_client_acquire_async) never run on a
 * thread that holds the reading role: a reading caller runs the completions of blocking callers
 * only, and passes any batch with other events to the I/O thread whole (in order). The I/O thread
 * also runs the events it reads, and a caller runs the events its own call queued.
 *
 * Writes: a caller writes its request to the socket at once (under mu) while the reader sleeps in
 * poll(); while the reader is waking a batch of blocking callers (defer_flush), a caller only
 * queues its request, and the reader writes everything queued meanwhile in one send() when the
 * batch is done. Without that, N threads each paid a send() under mu per request, one after
 * another.
 */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <semaphore.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "internal.h"

/* How long the I/O thread stays out of the socket after a caller read it, while nothing else
 * needs reading: callers that keep coming read their own answers; an idle connection's pushes
 * are read by the I/O thread at most this late (timers are never late: it wakes for them). */
#define READ_LINGER_US 10000

enum { ROLE_NONE = 0, ROLE_IO, ROLE_CALLER }; /* who holds the reading role */

typedef struct waiter waiter;

struct tk_client {
    pthread_mutex_t mu;
    tk_async *ac;
    pthread_t thread;
    bool thread_started;
    bool thread_joined;
    int wake[2];        /* pipe: written to wake the thread polling the socket */
    bool stop;
    bool closed;
    bool polling;       /* the reading thread sleeps in poll() with the values below */
    bool defer_flush;   /* the reading thread is waking blocking callers only, and writes after */
    int poll_fd;
    short poll_events;
    int64_t poll_until; /* INT64_MAX: no timeout */
    pid_t pid;
    tk_error last;
    pthread_cond_t progress; /* broadcast by the reading thread after each step while closing */
    bool progress_init;

    /* the reading role (mu) */
    int role;                       /* ROLE_* */
    waiter *sleep_head, *sleep_tail; /* callers asleep until their completion (or the role) comes */
    atomic_int nrun;                /* sleepers woken by their completion that have not left yet */
    int64_t read_at;                /* when a caller last gave the role up */
    pthread_cond_t io_cv;           /* the I/O thread waits here while it does not read */
    bool io_cv_init;
    bool io_waiting;                /* it waits on io_cv... */
    int64_t io_until;               /* ...until then (INT64_MAX: until signalled) */
    tk_event *io_ev, *io_ev_tail;   /* events a reading caller passed to the I/O thread */
};

/* A blocking call's completion: the callback writes the results, sets done, then posts sem; the
 * caller reads them once it has seen done (the atomics and the semaphore order the memory). sem
 * is also posted when the caller, asleep, is handed the reading role (lead); the caller takes
 * every post (posts_due) before its waiter goes away. */
struct waiter {
    tk_client *c;
    sem_t sem;
    atomic_int done;
    atomic_int polling;  /* it holds the role and sleeps in poll(): the completion writes the pipe */
    atomic_int lead;     /* handed the reading role while asleep */
    unsigned posts_due;  /* (mu) 1 (the completion) + hand-offs */
    unsigned posts_taken;
    bool sleeping;       /* (mu) in the list of sleepers */
    waiter *sprev, *snext;
    tk_error err;
    tk_reply reply;
    tk_inspect_info inspect;
};

void tk__client_lock(tk_client *c)
{
    if (c)
        pthread_mutex_lock(&c->mu);
}

static void waiter_cb(tk_async *ac, const tk_reply *r, void *data);
static void connect_cb(tk_async *ac, const tk_error *result, void *data);

static void wake_pipe(tk_client *c)
{
    char b = 1;
    ssize_t n = write(c->wake[1], &b, 1);
    (void)n;
}

static void wake_io(tk_client *c)
{
    if (c->io_waiting) {
        c->io_waiting = false; /* one signal is enough */
        pthread_cond_signal(&c->io_cv);
    }
}

/* With the role free, the I/O thread runs the timers: wakes it when one is due before it looks
 * next (c->mu held). */
static void io_timer_check(tk_client *c)
{
    if (c->role != ROLE_NONE || !c->io_waiting)
        return;
    int t = tk_async_timeout_ms(c->ac);
    if (t >= 0 && tk__now_us() + (int64_t)t * 1000 < c->io_until)
        wake_io(c);
}

/* Writes what is queued, or leaves it to the reading thread when it writes soon (defer_flush);
 * wakes the thread polling the socket when what it polls for (fd, events, timeout) changed, or
 * the I/O thread waiting for a timer when an earlier one is due and nobody polls. c->mu held. */
static void kick(tk_client *c)
{
    tk_async *ac = c->ac;
    if (c->defer_flush)
        return; /* the reader is awake, and flushes and recomputes its poll() before sleeping */
    if (tk__conn_want_write(ac) && !ac->ssl_read_wants_write)
        tk__conn_flush(ac);
    if (!c->polling) {
        io_timer_check(c);
        return;
    }
    short ev = (short)((tk_async_want_read(ac) ? POLLIN : 0) | (tk_async_want_write(ac) ? POLLOUT : 0));
    int t = tk_async_timeout_ms(ac);
    int64_t until = t < 0 ? INT64_MAX : tk__now_us() + (int64_t)t * 1000;
    if (ac->fd != c->poll_fd || ev != c->poll_events || until < c->poll_until || ac->ev_head) {
        wake_pipe(c);
        c->polling = false; /* one wake-up is enough */
    }
}

/* The blocking caller an event completes, or NULL. */
static waiter *event_waiter(const tk_event *ev)
{
    if (ev->kind == TK__EV_REPLY && ev->cb == waiter_cb)
        return ev->data;
    if (ev->kind == TK__EV_CONNECT && ev->ccb == connect_cb)
        return ev->data;
    return NULL;
}

/* True when every event of the list completes a blocking caller: running them is quick (no user
 * code), so the callers they wake may leave their next request to the reader. */
static bool only_waiters(const tk_event *ev)
{
    for (; ev; ev = ev->next)
        if (!event_waiter(ev))
            return false;
    return true;
}

static void sleepers_unlink(tk_client *c, waiter *w)
{
    if (w->sprev)
        w->sprev->snext = w->snext;
    else
        c->sleep_head = w->snext;
    if (w->snext)
        w->snext->sprev = w->sprev;
    else
        c->sleep_tail = w->sprev;
    w->sprev = w->snext = NULL;
    w->sleeping = false;
}

/* Takes the engine's queued events (c->mu held). A sleeping caller completed by one of them
 * leaves the sleepers (it can no longer be handed the role) and counts as running until it has
 * woken. */
static tk_event *take_events(tk_client *c)
{
    tk_event *ev = tk__take_events(c->ac);
    for (tk_event *e = ev; e; e = e->next) {
        waiter *w = event_waiter(e);
        if (w && w->sleeping) {
            sleepers_unlink(c, w);
            atomic_fetch_add(&c->nrun, 1);
        }
    }
    return ev;
}

/* Gives the reading role to the longest-sleeping caller (c->mu held, a sleeper exists). */
static void hand_off(tk_client *c)
{
    waiter *s = c->sleep_head;
    sleepers_unlink(c, s);
    s->posts_due++;
    atomic_store(&s->lead, 1);
    c->role = ROLE_CALLER;
    sem_post(&s->sem);
}

/* True when something other than a blocking caller's answer needs the socket read now: a
 * connection being set up, or an answer that no sleeping caller will read (an async acquire, a
 * background release, a withdrawal, a keep-alive). Heartbeats and ACKs can wait for the I/O
 * thread's linger. */
static bool needs_reader(const tk_client *c)
{
    const tk_async *ac = c->ac;
    if (ac->cs >= TK__C_TCP && ac->cs <= TK__C_AUTH)
        return true;
    for (const tk_req *r = ac->req_head; r; r = r->next)
        if (r->kind != TK__R_HEARTBEAT && r->kind != TK__R_ACK && !(r->kind == TK__R_USER && r->cb == waiter_cb))
            return true;
    return false;
}

/* With the role free (c->mu held): makes sure that somebody reads while an answer is awaited. A
 * caller woken by its completion and still running takes the role when it waits again (and the
 * last of them to leave calls this again); otherwise a sleeper gets it; with no sleepers, the I/O
 * thread is woken when something needs reading now (else it takes the role after its linger). */
static void appoint(tk_client *c)
{
    if (c->role != ROLE_NONE || c->stop || c->ac == NULL)
        return;
    if (c->sleep_head) {
        if (atomic_load(&c->nrun) == 0)
            hand_off(c);
        return;
    }
    if (c->io_waiting && needs_reader(c)) /* (not waiting: it looks at its next turn) */
        wake_io(c);
}

void tk__client_unlock_plain(tk_client *c)
{
    if (c)
        pthread_mutex_unlock(&c->mu);
}

void tk__client_unlock(tk_client *c)
{
    kick(c);
    tk_event *ev = take_events(c);
    appoint(c);
    pthread_mutex_unlock(&c->mu);
    tk__run_events(ev);
}

/* One turn of the reading role (c->mu held on entry and exit): polls the socket and the wake-up
 * pipe until something is due, then reads, runs the timers and reconnects. w: the reading caller
 * (NULL: the I/O thread); it does not poll once its completion has come. */
static void poll_step(tk_client *c, waiter *w)
{
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
    if (w) {
        /* with waiter_cb: one of the two sees the other's store (the pipe, or done) */
        atomic_store(&w->polling, 1);
        if (atomic_load(&w->done)) {
            atomic_store(&w->polling, 0);
            c->polling = false;
            return;
        }
    }
    pthread_mutex_unlock(&c->mu);
    int n = poll(p, ac->fd >= 0 ? 2 : 1, timeout);
    pthread_mutex_lock(&c->mu);
    if (w)
        atomic_store(&w->polling, 0);
    c->polling = false;
    if (n > 0 && (p[0].revents & POLLIN)) {
        char buf[64];
        while (read(c->wake[0], buf, sizeof buf) > 0) {
        }
    }
    if (c->stop)
        return;
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
}

/* Runs what the reader took (c->mu held, released meanwhile): completions of blocking callers
 * only, with the writes of the callers they wake deferred to one flush after. */
static void run_waiter_events(tk_client *c, tk_event *ev)
{
    tk_async *ac = c->ac;
    c->defer_flush = true;
    pthread_mutex_unlock(&c->mu);
    tk__run_events(ev);
    pthread_mutex_lock(&c->mu);
    c->defer_flush = false;
    if (!c->stop && tk__conn_want_write(ac) && !ac->ssl_read_wants_write)
        tk__conn_flush(ac);
}

/* The I/O thread waits on io_cv until signalled or until (tk__now_us's clock). c->mu held. */
static void io_wait(tk_client *c, int64_t until)
{
    c->io_waiting = true;
    c->io_until = until;
    if (until == INT64_MAX) {
        pthread_cond_wait(&c->io_cv, &c->mu);
    } else {
        int64_t us = until - tk__now_us();
        if (us < 1000)
            us = 1000; /* never a busy loop with mu held */
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        int64_t ns = ts.tv_nsec + (us % 1000000) * 1000;
        ts.tv_sec += (time_t)(us / 1000000 + ns / 1000000000);
        ts.tv_nsec = (long)(ns % 1000000000);
        pthread_cond_timedwait(&c->io_cv, &c->mu, &ts);
    }
    c->io_waiting = false;
}

static void *io_thread(void *arg)
{
    tk_client *c = arg;
    pthread_mutex_lock(&c->mu);
    while (!c->stop) {
        tk_async *ac = c->ac;
        if (c->io_ev) {
            tk_event *ev = c->io_ev;
            c->io_ev = c->io_ev_tail = NULL;
            pthread_mutex_unlock(&c->mu);
            tk__run_events(ev);
            pthread_mutex_lock(&c->mu);
            continue;
        }
        if (c->role == ROLE_NONE) {
            int t = tk_async_timeout_ms(ac);
            int64_t now = tk__now_us();
            int64_t until = t < 0 ? INT64_MAX : now + (int64_t)t * 1000;
            if (t == 0 || (!c->sleep_head && (now >= c->read_at + READ_LINGER_US || needs_reader(c)))) {
                c->role = ROLE_IO;
            } else {
                if (!c->sleep_head && c->read_at + READ_LINGER_US < until)
                    until = c->read_at + READ_LINGER_US;
                io_wait(c, until);
                continue;
            }
        }
        if (c->role == ROLE_CALLER) {
            /* The reading caller runs the timers (one that gives the role up wakes the I/O
             * thread when a timer is due before it looks again: io_timer_check); the I/O thread
             * looks again after the linger, to read an idle connection. */
            io_wait(c, tk__now_us() + READ_LINGER_US);
            continue;
        }
        if (c->sleep_head) {
            hand_off(c); /* a caller waits: it reads its own answer */
            continue;
        }
        poll_step(c, NULL);
        if (c->stop)
            break;
        tk_event *ev = take_events(c);
        if (ev) {
            if (only_waiters(ev)) {
                run_waiter_events(c, ev);
            } else {
                pthread_mutex_unlock(&c->mu);
                tk__run_events(ev);
                pthread_mutex_lock(&c->mu);
            }
        }
    }
    c->defer_flush = false;
    tk_event *ev = c->io_ev; /* passed on before the stop: run them all the same */
    c->io_ev = c->io_ev_tail = NULL;
    pthread_mutex_unlock(&c->mu);
    tk__run_events(ev);
    return NULL;
}

static void waiter_init(waiter *w, tk_client *c)
{
    memset(w, 0, sizeof *w);
    w->c = c;
    w->posts_due = 1;
    sem_init(&w->sem, 0, 0);
}

static void waiter_destroy(waiter *w) { sem_destroy(&w->sem); }

/* Marks w done and wakes it: on its semaphore, and through the pipe when it sleeps in poll()
 * holding the reading role. w may be gone once sem is posted. */
static void waiter_done(waiter *w)
{
    atomic_store(&w->done, 1);
    tk_client *c = w->c;
    bool in_poll = atomic_load(&w->polling) != 0;
    sem_post(&w->sem);
    if (in_poll)
        wake_pipe(c);
}

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
    waiter_done(w);
}

/* Takes every post of w's semaphore still due (c->mu held, or w never handed the role): after it
 * the waiter may go away. */
static void waiter_settle(waiter *w)
{
    while (w->posts_taken < w->posts_due) {
        while (sem_wait(&w->sem) != 0) {
            /* EINTR: a signal handler ran; wait on */
        }
        w->posts_taken++;
    }
}

/* Holds the reading role for w (c->mu held on entry and exit) until w's completion has come, then
 * gives it up. A batch with events other than completions of blocking callers goes to the I/O
 * thread whole: user callbacks never run on a reading caller (a blocking call in one would wait
 * for a reader that waits for it). */
static void lead(tk_client *c, waiter *w)
{
    for (;;) {
        tk_event *ev = take_events(c);
        if (ev) {
            /* (after events passed on, later ones follow them, in order; after the stop,
             * nothing else would run them) */
            if ((only_waiters(ev) && !c->io_ev) || c->stop) {
                run_waiter_events(c, ev);
            } else {
                if (c->io_ev_tail)
                    c->io_ev_tail->next = ev;
                else
                    c->io_ev = ev;
                while (ev->next)
                    ev = ev->next;
                c->io_ev_tail = ev;
                wake_io(c);
            }
            continue;
        }
        if (atomic_load(&w->done))
            break;
        poll_step(c, w);
    }
    c->role = ROLE_NONE;
    c->read_at = tk__now_us();
    appoint(c);
    io_timer_check(c); /* a timer this reader armed may be due before the I/O thread looks */
}

/* Waits (c->mu held) until w is done, running the events queued by this thread meanwhile, and
 * reading the socket itself when no other thread reads it. Returns true with c->mu still held
 * when it did not sleep on its semaphore; false, with c->mu released, when its completion woke
 * it. */
static bool waiter_wait(tk_client *c, waiter *w)
{
    for (;;) {
        kick(c);
        tk_event *ev = take_events(c);
        if (ev) {
            pthread_mutex_unlock(&c->mu);
            tk__run_events(ev);
            pthread_mutex_lock(&c->mu);
            continue;
        }
        if (atomic_load(&w->done)) {
            waiter_settle(w);
            return true;
        }
        if (c->role == ROLE_NONE) {
            c->role = ROLE_CALLER;
            lead(c, w);
            waiter_settle(w);
            return true;
        }
        if (c->role == ROLE_IO && c->polling) {
            wake_pipe(c); /* the I/O thread hands the role over after its turn */
            c->polling = false;
        }
        w->sleeping = true;
        w->sprev = c->sleep_tail;
        w->snext = NULL;
        if (c->sleep_tail)
            c->sleep_tail->snext = w;
        else
            c->sleep_head = w;
        c->sleep_tail = w;
        pthread_mutex_unlock(&c->mu);
        while (sem_wait(&w->sem) != 0) {
            /* EINTR: a signal handler ran; wait on */
        }
        w->posts_taken++;
        if (!atomic_load(&w->lead)) {
            /* its completion woke it (a hand-off, made before it, would show) */
            if (atomic_fetch_sub(&c->nrun, 1) == 1) {
                pthread_mutex_lock(&c->mu);
                appoint(c); /* the last woken caller to leave: the role must not stay free */
                pthread_mutex_unlock(&c->mu);
            }
            return false;
        }
        pthread_mutex_lock(&c->mu);
        atomic_store(&w->lead, 0);
        lead(c, w); /* handed the role (it is this caller's now) */
        waiter_settle(w);
        return true;
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
    waiter_done(w);
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
    c->io_cv_init = pthread_cond_init(&c->io_cv, &ca) == 0;
    pthread_condattr_destroy(&ca);
    atomic_init(&c->nrun, 0);
    c->io_until = INT64_MAX;
    if (!c->io_cv_init) {
        tk__seterr(&e, TK_ERR_NO_MEMORY, "cannot create a condition variable");
        goto fail;
    }
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
            tk_event *ev = take_events(c);
            appoint(c); /* the withdrawals' answers need a reader */
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
            tk_event *ev = take_events(c);
            appoint(c); /* the releases' answers need a reader */
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
        tk_event *ev = take_events(c);
        pthread_mutex_unlock(&c->mu);
        tk__run_events(ev);
        pthread_mutex_lock(&c->mu);
        pthread_cond_destroy(&w.cv);
    }
    if (ac)
        tk__close(ac);
    c->stop = true;
    if (c->wake[1] >= 0)
        wake_pipe(c); /* the thread polling the socket */
    wake_io(c);
    tk_event *ev = ac ? take_events(c) : NULL;
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
    if (c->io_cv_init)
        pthread_cond_destroy(&c->io_cv);
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
