/*
 * ticketing-bench: acquire+release pairs per second on one connection, with the non-blocking API
 * in a single-threaded poll() loop (no library threads).
 *
 *   ticketing-bench [--addr host:port] [--callers N] [--seconds S] [--warmup W]
 *                   [--api nonblocking] [--key-prefix P]
 *   (the short forms -a, -c, -d, -w, -k still work)
 *
 * Each of the N callers is a slot that acquires its own key (try once, lease 10 s), releases it
 * when granted, and starts again: N pairs are in flight at every moment, uncontended. W seconds
 * (default 1) of warm-up are not counted, then S seconds are. Prints one line of JSON:
 *   {"pairs_per_sec":R,"errors":E,"client":"c","pairs":N,"seconds":S,"in_flight":C}
 * and exits 1 when more than 1% of the attempts failed. Send it only to a server on loopback
 * that you started for it.
 */
#define _GNU_SOURCE
#include <getopt.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <ticketing/ticketing.h>

typedef struct slot slot;
typedef struct bench {
    tk_async *ac;
    char prefix[64];
    long pairs, errors;
    int running;
    slot *slots;
} bench;

struct slot {
    bench *b;
    int index;
    char key[96];
};

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec / 1e9;
}

static void start_pair(slot *s);

static void on_release(tk_async *ac, const tk_reply *r, void *data)
{
    (void)ac;
    slot *s = data;
    if (r->code == TK_OK)
        s->b->pairs++;
    else
        s->b->errors++;
    start_pair(s);
}

static void on_acquire(tk_async *ac, const tk_reply *r, void *data)
{
    slot *s = data;
    if (r->code != TK_OK) {
        s->b->errors++;
        start_pair(s);
        return;
    }
    tk_err rc = tk_async_release(ac, r->lock, on_release, s);
    tk_lock_free(r->lock);
    if (rc != TK_OK)
        s->b->errors++;
}

static void start_pair(slot *s)
{
    if (!s->b->running)
        return;
    if (tk_async_acquire(s->b->ac, s->key, strlen(s->key), 10000, 0, NULL, on_acquire, s, NULL) != TK_OK)
        s->b->errors++;
}

static void on_connect(tk_async *ac, const tk_error *e, void *data)
{
    (void)ac;
    int *ok = data;
    *ok = e->code == TK_OK ? 1 : -1;
    if (e->code != TK_OK)
        fprintf(stderr, "ticketing-bench: connect: %s\n", e->message);
}

/* One poll() round: waits at most max_ms for the socket or the next timer. */
static void step(tk_async *ac, int max_ms)
{
    struct pollfd p = {.fd = tk_async_fd(ac), .events = 0};
    if (tk_async_want_read(ac))
        p.events |= POLLIN;
    if (tk_async_want_write(ac))
        p.events |= POLLOUT;
    int t = tk_async_timeout_ms(ac);
    if (t < 0 || t > max_ms)
        t = max_ms;
    int n = poll(&p, p.fd >= 0 ? 1 : 0, t);
    int ev = 0;
    if (n > 0 && (p.revents & (POLLIN | POLLERR | POLLHUP)))
        ev |= TK_EV_READ;
    if (n > 0 && (p.revents & POLLOUT))
        ev |= TK_EV_WRITE;
    tk_async_process(ac, ev);
}

int main(int argc, char **argv)
{
    const char *addr = "127.0.0.1:7070";
    int inflight = 64;
    double seconds = 5, warmup = 1;
    const char *prefix = "bench-c";
    static const struct option longopts[] = {
        {"addr", required_argument, NULL, 'a'},    {"callers", required_argument, NULL, 'c'},
        {"seconds", required_argument, NULL, 'd'}, {"warmup", required_argument, NULL, 'w'},
        {"key-prefix", required_argument, NULL, 'k'}, {"api", required_argument, NULL, 'A'},
        {"help", no_argument, NULL, 'h'},          {NULL, 0, NULL, 0}};
    int opt;
    while ((opt = getopt_long(argc, argv, "a:c:d:w:k:h", longopts, NULL)) != -1) {
        switch (opt) {
        case 'a': addr = optarg; break;
        case 'c': inflight = atoi(optarg); break;
        case 'd': seconds = atof(optarg); break;
        case 'w': warmup = atof(optarg); break;
        case 'k': prefix = optarg; break;
        case 'A':
            if (strcmp(optarg, "nonblocking") == 0)
                break;
            /* fall through */
        default:
            fprintf(stderr, "usage: %s [--addr host:port] [--callers N] [--seconds S] [--warmup W] [--api nonblocking] [--key-prefix P]\n",
                    argv[0]);
            return 2;
        }
    }
    if (inflight < 1 || inflight > 100000 || seconds <= 0 || seconds > 3600 || warmup < 0 || warmup > 60) {
        fprintf(stderr, "ticketing-bench: callers 1..100000, seconds 0..3600, warmup 0..60\n");
        return 2;
    }
    const char *eps[] = {addr};
    tk_options o = {.endpoints = eps, .n_endpoints = 1};
    tk_error e;
    bench b = {.running = 1};
    snprintf(b.prefix, sizeof b.prefix, "%s", prefix);
    b.ac = tk_async_new(&o, &e);
    if (!b.ac) {
        fprintf(stderr, "ticketing-bench: %s\n", e.message);
        return 1;
    }
    int connected = 0;
    tk_async_connect(b.ac, on_connect, &connected);
    double deadline = now_s() + 10;
    while (connected == 0 && now_s() < deadline)
        step(b.ac, 50);
    if (connected != 1) {
        tk_async_free(b.ac);
        return 1;
    }
    b.slots = calloc((size_t)inflight, sizeof *b.slots);
    if (!b.slots) {
        tk_async_free(b.ac);
        return 1;
    }
    for (int i = 0; i < inflight; i++) {
        b.slots[i].b = &b;
        b.slots[i].index = i;
        snprintf(b.slots[i].key, sizeof b.slots[i].key, "%s-%d-%d", b.prefix, (int)getpid(), i);
    }
    for (int i = 0; i < inflight; i++)
        start_pair(&b.slots[i]);
    double warm_end = now_s() + warmup;
    while (now_s() < warm_end)
        step(b.ac, 50);
    long pairs0 = b.pairs, errors0 = b.errors;
    double start = now_s(), end = start + seconds;
    while (now_s() < end)
        step(b.ac, 50);
    double took = now_s() - start;
    long pairs = b.pairs - pairs0, errors = b.errors - errors0, total = b.pairs;
    b.running = 0;
    /* drain what is in flight (bounded) so the keys are released */
    double drain_end = now_s() + 5;
    while (now_s() < drain_end && tk_async_timeout_ms(b.ac) != -1 && b.pairs + b.errors < total + errors0 + errors + inflight)
        step(b.ac, 20);
    printf("{\"pairs_per_sec\":%.1f,\"errors\":%ld,\"client\":\"c\",\"pairs\":%ld,\"seconds\":%.3f,\"in_flight\":%d}\n",
           pairs / took, errors, pairs, took, inflight);
    fflush(stdout);
    tk_async_free(b.ac);
    free(b.slots);
    return errors * 100 > pairs + errors ? 1 : 0;
}
