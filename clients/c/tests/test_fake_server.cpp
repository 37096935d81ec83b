// Protocol behaviour against a scripted fake server: what a real single node cannot easily
// produce (GOAWAY, NOT_LEADER, leader hints, a changed state id, dropped answers, a silent
// server, forged proofs) and the exact bytes the client sends (ids, retries, ACK, CANCEL).
#include <atomic>
#include <condition_variable>
#include <cstring>
#include <future>
#include <poll.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include "support.h"

extern "C" {
#include "internal.h" // tk__clock_skew: plays a host suspend
}

using namespace tt;

namespace {

const uint8_t S1[16] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16};
const uint8_t S2[16] = {9, 9, 9, 9, 9, 9, 9, 9, 9, 9, 9, 9, 9, 9, 9, 9};

// Collects the reply of a non-blocking call made on a tk_client (runs on its I/O thread).
struct Reply {
    std::mutex m;
    std::condition_variable cv;
    bool done = false;
    tk_err code = TK_OK;
    tk_error err{};
    tk_lock *lock = nullptr;
    uint64_t token = 0;
    static void cb(tk_async *, const tk_reply *r, void *data)
    {
        auto *self = static_cast<Reply *>(data);
        std::lock_guard<std::mutex> g(self->m);
        self->code = r->code;
        self->err = *r->error;
        self->lock = r->lock;
        self->token = r->token;
        self->done = true;
        self->cv.notify_all();
    }
    bool wait(std::chrono::milliseconds t = 5000ms)
    {
        std::unique_lock<std::mutex> g(m);
        return cv.wait_for(g, t, [&] { return done; });
    }
    bool is_done()
    {
        std::lock_guard<std::mutex> g(m);
        return done;
    }
    ~Reply()
    {
        if (lock)
            tk_lock_free(lock);
    }
};

// A blocking client connected to a fake server (the handshake done by the fake in a thread).
struct Connected {
    tk_client *c = nullptr;
    std::unique_ptr<FakeConn> conn;
    tk_hello hello{};
    Connected(FakeServer &fs, const std::function<void(tk_options &)> &tweak = nullptr, const uint8_t *state = S1,
              uint32_t grace = 5000, std::vector<std::string> endpoints = {})
    {
        if (endpoints.empty())
            endpoints.push_back(fs.addr());
        auto fut = std::async(std::launch::async, [&] {
            std::vector<const char *> eps;
            for (auto &e : endpoints)
                eps.push_back(e.c_str());
            tk_options o{};
            o.endpoints = eps.data();
            o.n_endpoints = eps.size();
            o.heartbeat_ms = TK_OFF;
            o.backoff_min_ms = 10;
            o.backoff_max_ms = 50;
            if (tweak)
                tweak(o);
            tk_client *cl = nullptr;
            tk_error e;
            tk_err rc = tk_client_connect(&o, &cl, &e);
            EXPECT_EQ(rc, TK_OK) << e.message;
            return cl;
        });
        conn = fs.accept();
        try {
            hello = conn->handshake(state, false, grace);
        } catch (const std::runtime_error &) {
            // the client gave this connection up: see below
        }
        // On a loaded machine the client may give a connection up (its handshake must finish
        // within 2 s of the TCP connection) and dial again: answer each new connection until
        // its connect returns; the last one answered is the client's.
        auto until = std::chrono::steady_clock::now() + 30s;
        while (fut.wait_for(0ms) != std::future_status::ready && std::chrono::steady_clock::now() < until) {
            if (!fs.pending(20ms))
                continue;
            auto next = fs.accept();
            try {
                hello = next->handshake(state, false, grace);
                conn = std::move(next);
            } catch (const std::runtime_error &) {
                // given up too
            }
        }
        c = fut.get();
        if (!c)
            throw std::runtime_error("connect failed");
    }
    ~Connected() { tk_client_free(c); }
};

tk_err acquire_async(tk_client *c, const std::string &key, int64_t lease, int64_t wait, Reply &r, uint64_t *id = nullptr,
                     const tk_acquire_opts *o = nullptr)
{
    tk_error e;
    return tk_client_acquire_async(c, key.data(), key.size(), lease, wait, o, Reply::cb, &r, id, &e);
}

// Pumps a tk_async until pred holds (bounded by timeout).
bool pump(tk_async *ac, const std::function<bool()> &pred, std::chrono::milliseconds timeout = 3000ms)
{
    auto end = std::chrono::steady_clock::now() + timeout;
    while (!pred()) {
        if (std::chrono::steady_clock::now() >= end)
            return false;
        int t = tk_async_timeout_ms(ac);
        if (t < 0 || t > 10)
            t = 10;
        int fd = tk_async_fd(ac);
        int events = 0;
        if (fd >= 0) {
            pollfd p{fd, static_cast<short>((tk_async_want_read(ac) ? POLLIN : 0) | (tk_async_want_write(ac) ? POLLOUT : 0)), 0};
            if (poll(&p, 1, t) > 0) {
                if (p.revents & (POLLIN | POLLERR | POLLHUP))
                    events |= TK_EV_READ;
                if (p.revents & (POLLOUT | POLLERR))
                    events |= TK_EV_WRITE;
            }
        } else {
            std::this_thread::sleep_for(std::chrono::milliseconds(t));
        }
        tk_async_process(ac, events);
    }
    return true;
}

struct AsyncReply {
    bool done = false;
    tk_err code = TK_OK;
    std::string message;
    static void cb(tk_async *, const tk_reply *r, void *data)
    {
        auto *self = static_cast<AsyncReply *>(data);
        self->done = true;
        self->code = r->code;
        self->message = r->error->message;
    }
    static void connected(tk_async *, const tk_error *e, void *data)
    {
        auto *self = static_cast<AsyncReply *>(data);
        self->done = true;
        self->code = e->code;
        self->message = e->message;
    }
};

tk_async *new_async(const std::string &addr, const std::function<void(tk_options &)> &tweak = nullptr)
{
    const char *eps[] = {addr.c_str()};
    tk_options o{};
    o.endpoints = eps;
    o.n_endpoints = 1;
    o.heartbeat_ms = TK_OFF;
    if (tweak)
        tweak(o);
    tk_error e;
    tk_async *ac = tk_async_new(&o, &e);
    EXPECT_NE(ac, nullptr) << e.message;
    return ac;
}

} // namespace

// ---- handshake ------------------------------------------------------------------------------

TEST(FakeHandshake, HelloFirstAndNoRequestBeforeWelcome)
{
    FakeServer fs;
    tk_async *ac = new_async(fs.addr());
    AsyncReply conn, ping;
    ASSERT_EQ(tk_async_connect(ac, AsyncReply::connected, &conn), TK_OK);
    ASSERT_EQ(tk_async_ping(ac, AsyncReply::cb, &ping), TK_OK); // queued before the handshake
    auto fc = fs.accept();
    pump(ac, [&] { return fc->has_frame(); });
    tk_hello h = fc->read_hello();
    EXPECT_EQ(h.version, 1);
    EXPECT_EQ(h.flags, 0);
    uint8_t sid[16];
    tk_async_session_id(ac, sid);
    EXPECT_EQ(memcmp(h.session_id, sid, 16), 0);
    fc->send_challenge();
    pump(ac, [&] { return fc->has_frame(); });
    tk_auth a = fc->read_auth();
    uint8_t zero[32] = {0};
    EXPECT_EQ(memcmp(a.proof, zero, 32), 0) << "no token: a zero proof";
    pump(ac, [] { return false; }, 100ms);
    EXPECT_TRUE(fc->quiet_for(50ms)) << "nothing may be sent before WELCOME";
    fc->send_welcome(S1, false);
    ASSERT_TRUE(pump(ac, [&] { return conn.done; }));
    EXPECT_EQ(conn.code, TK_OK);
    pump(ac, [&] { return fc->has_frame(); });
    auto q = fc->read_request();
    EXPECT_EQ(q.r.op, TK_OP_PING);
    EXPECT_EQ(q.r.id, 1u) << "request ids start at 1";
    fc->respond(q, TK_STATUS_OK);
    ASSERT_TRUE(pump(ac, [&] { return ping.done; }));
    EXPECT_EQ(ping.code, TK_OK);
    tk_async_free(ac);
}

TEST(FakeHandshake, TokenProofsBothWays)
{
    FakeServer fs;
    const std::string token = "correct horse battery staple";
    auto run = [&](bool good_server_proof, tk_err want) {
        tk_async *ac = new_async(fs.addr(), [&](tk_options &o) { o.token = token.c_str(); });
        AsyncReply conn;
        tk_async_connect(ac, AsyncReply::connected, &conn);
        auto fc = fs.accept();
        pump(ac, [&] { return fc->has_frame(); });
        tk_hello h = fc->read_hello();
        uint8_t snonce[32];
        for (int i = 0; i < 32; i++)
            snonce[i] = uint8_t(0x40 + i);
        fc->send_challenge(TK_STATUS_OK, TK_CHALLENGE_AUTH_REQUIRED, "", snonce);
        pump(ac, [&] { return fc->has_frame(); });
        tk_auth a = fc->read_auth();
        uint8_t want_proof[32];
        tk_client_proof(token.data(), token.size(), h.session_id, h.nonce, snonce, want_proof);
        EXPECT_EQ(memcmp(a.proof, want_proof, 32), 0) << "client proof";
        tk_welcome w{};
        w.status = TK_STATUS_OK;
        w.session_grace_ms = 5000;
        memcpy(w.state_id, S1, 16);
        uint8_t sp[32];
        tk_server_proof(token.data(), token.size(), h.session_id, h.nonce, snonce, &w, sp);
        if (!good_server_proof)
            sp[0] ^= 0x80;
        fc->send_welcome(S1, false, 5000, TK_STATUS_OK, sp);
        EXPECT_TRUE(pump(ac, [&] { return conn.done; }));
        EXPECT_EQ(conn.code, want) << conn.message;
        if (want == TK_ERR_AUTH_FAILED) {
            EXPECT_NE(conn.message.find("proof does not verify"), std::string::npos) << conn.message;
        }
        tk_async_free(ac);
    };
    run(true, TK_OK);
    run(false, TK_ERR_AUTH_FAILED);
}

TEST(FakeHandshake, TokenClientRefusesServerWithoutAuth)
{
    FakeServer fs;
    tk_async *ac = new_async(fs.addr(), [](tk_options &o) { o.token = "secret"; });
    AsyncReply conn;
    tk_async_connect(ac, AsyncReply::connected, &conn);
    auto fc = fs.accept();
    pump(ac, [&] { return fc->has_frame(); });
    fc->read_hello();
    fc->send_challenge(TK_STATUS_OK, 0); // no AUTH_REQUIRED
    ASSERT_TRUE(pump(ac, [&] { return conn.done; }));
    EXPECT_EQ(conn.code, TK_ERR_AUTH_FAILED);
    EXPECT_NE(conn.message.find("does not require auth"), std::string::npos) << conn.message;
    EXPECT_TRUE(fc->closed_by_peer()) << "and sends no AUTH";
    tk_async_free(ac);
}

TEST(FakeHandshake, UnsupportedVersionStopsAtOnce)
{
    FakeServer fs;
    tk_async *ac = new_async(fs.addr());
    AsyncReply conn;
    tk_async_connect(ac, AsyncReply::connected, &conn);
    auto fc = fs.accept();
    pump(ac, [&] { return fc->has_frame(); });
    fc->read_hello();
    fc->send_challenge(TK_STATUS_UNSUPPORTED_VERSION, 0, "unsupported protocol version");
    ASSERT_TRUE(pump(ac, [&] { return conn.done; }));
    EXPECT_EQ(conn.code, TK_ERR_UNSUPPORTED_VERSION);
    EXPECT_EQ(tk_async_err(ac), TK_ERR_UNSUPPORTED_VERSION);
    EXPECT_NE(std::string(tk_async_errstr(ac)).find("version"), std::string::npos);
    tk_async_free(ac);
}

TEST(FakeHandshake, ChallengeLeaderHintIsFollowed)
{
    FakeServer follower, leader;
    std::string leader_addr = leader.addr();
    auto fut = std::async(std::launch::async, [&] {
        const char *eps[] = {follower.addr().c_str()};
        std::string f = follower.addr();
        eps[0] = f.c_str();
        tk_options o{};
        o.endpoints = eps;
        o.n_endpoints = 1;
        o.heartbeat_ms = TK_OFF;
        tk_client *c = nullptr;
        tk_error e;
        EXPECT_EQ(tk_client_connect(&o, &c, &e), TK_OK) << e.message;
        return c;
    });
    auto f = follower.accept();
    tk_hello h1 = f->read_hello();
    f->send_challenge(TK_STATUS_NOT_LEADER, 0, leader_addr);
    auto l = leader.accept();
    tk_hello h2 = l->handshake(S1, false);
    EXPECT_EQ(memcmp(h1.session_id, h2.session_id, 16), 0) << "the same session everywhere";
    tk_client *c = fut.get();
    ASSERT_NE(c, nullptr);
    tk_client_free(c);
}

// ---- sessions, resume, redirects ------------------------------------------------------------

TEST(FakeSession, GoawayMovesToTheHintAndResumesWithOriginalIds)
{
    FakeServer a, b;
    Connected cx(a);
    Reply r;
    uint64_t id = 0;
    ASSERT_EQ(acquire_async(cx.c, "k", 30000, TK_WAIT_FOREVER, r, &id), TK_OK);
    auto q = cx.conn->read_request();
    EXPECT_EQ(q.r.op, TK_OP_ACQUIRE);
    EXPECT_EQ(q.r.id, id);
    cx.conn->push(TK_OP_GOAWAY, 0, TK_GOAWAY_LEADERSHIP, b.addr());
    EXPECT_TRUE(cx.conn->closed_by_peer()) << "the client leaves the old node";
    auto nb = b.accept();
    tk_hello h = nb->read_hello();
    EXPECT_EQ(memcmp(h.session_id, cx.hello.session_id, 16), 0);
    nb->send_challenge();
    nb->read_auth();
    nb->send_welcome(S1, true);
    auto q2 = nb->read_request();
    EXPECT_EQ(q2.r.op, TK_OP_ACQUIRE);
    EXPECT_EQ(q2.r.id, id) << "re-sent with its original id";
    EXPECT_EQ(q2.key, "k");
    EXPECT_EQ(q2.r.lease_ms, 30000u);
    EXPECT_EQ(q2.r.wait_ms, TK_WAIT_FOREVER_MS);
    nb->respond(q2, TK_STATUS_OK, 9, 30000);
    ASSERT_TRUE(r.wait());
    EXPECT_EQ(r.code, TK_OK) << r.err.message;
    EXPECT_EQ(tk_lock_token(r.lock), 9u);
}

TEST(FakeSession, NotLeaderAnswerIsResentToTheLeader)
{
    FakeServer a, b;
    Connected cx(a);
    auto ping = std::async(std::launch::async, [&] {
        tk_error e;
        return tk_ping(cx.c, &e);
    });
    auto q = cx.conn->read_request();
    cx.conn->respond(q, TK_STATUS_NOT_LEADER, 0, 0, 0, b.addr());
    auto nb = b.accept();
    nb->read_hello();
    nb->send_challenge();
    nb->read_auth();
    nb->send_welcome(S1, true);
    auto q2 = nb->read_request();
    EXPECT_EQ(q2.r.op, TK_OP_PING);
    EXPECT_EQ(q2.r.id, q.r.id);
    nb->respond(q2, TK_STATUS_OK);
    EXPECT_EQ(ping.get(), TK_OK);
}

TEST(FakeSession, ResumeResendsUnansweredInIdOrderBeforeNewRequests)
{
    FakeServer fs;
    Connected cx(fs);
    Reply r1, r2, r3;
    uint64_t id1, id2, id3;
    acquire_async(cx.c, "a", 1000, TK_WAIT_FOREVER, r1, &id1);
    acquire_async(cx.c, "b", 2000, 700, r2, &id2);
    acquire_async(cx.c, "c", 3000, TK_WAIT_FOREVER, r3, &id3);
    EXPECT_LT(id1, id2);
    EXPECT_LT(id2, id3);
    auto q1 = cx.conn->read_request(), q2 = cx.conn->read_request(), q3 = cx.conn->read_request();
    EXPECT_EQ(q1.r.id, id1);
    EXPECT_EQ(q2.r.id, id2);
    EXPECT_EQ(q3.r.id, id3);
    cx.conn->respond(q2, TK_STATUS_TIMED_OUT);
    ASSERT_TRUE(r2.wait());
    EXPECT_EQ(r2.code, TK_ERR_NOT_ACQUIRED);
    cx.conn->close(); // the connection drops
    auto n = fs.accept();
    n->read_hello();
    n->send_challenge();
    n->read_auth();
    // a new request made while reconnecting must come after the retries
    Reply r4;
    uint64_t id4 = 0;
    acquire_async(cx.c, "d", 4000, 0, r4, &id4); // returns once queued
    n->send_welcome(S1, true);
    auto a1 = n->read_request(), a3 = n->read_request(), p = n->read_request();
    EXPECT_EQ(a1.r.id, id1);
    EXPECT_EQ(a1.key, "a");
    EXPECT_EQ(a1.r.lease_ms, 1000u);
    EXPECT_EQ(a3.r.id, id3);
    EXPECT_EQ(a3.key, "c");
    EXPECT_EQ(p.r.id, id4);
    EXPECT_GT(id4, id3);
    EXPECT_EQ(p.key, "d");
    n->respond(p, TK_STATUS_TIMED_OUT);
    ASSERT_TRUE(r4.wait());
    EXPECT_EQ(r4.code, TK_ERR_NOT_ACQUIRED);
    n->respond(a1, TK_STATUS_OK, 11, 1000);
    n->respond(a3, TK_STATUS_NOT_HELD); // "nothing is held for this request"
    ASSERT_TRUE(r1.wait());
    ASSERT_TRUE(r3.wait());
    EXPECT_EQ(r1.code, TK_OK);
    EXPECT_EQ(r3.code, TK_ERR_CONNECTION_LOST) << r3.err.message;
}

TEST(FakeSession, SameStateWithoutResumeFailsUnansweredAndKeepsLocks)
{
    FakeServer fs;
    Connected cx(fs);
    Reply held, pending;
    acquire_async(cx.c, "held", 30000, TK_WAIT_FOREVER, held);
    auto q = cx.conn->read_request();
    cx.conn->respond(q, TK_STATUS_OK, 5, 30000);
    ASSERT_TRUE(held.wait());
    ASSERT_EQ(held.code, TK_OK);
    acquire_async(cx.c, "waiting", 30000, TK_WAIT_FOREVER, pending);
    cx.conn->read_request();
    cx.conn->close();
    auto n = fs.accept();
    n->handshake(S1, false); // same state id, not resumed: the session ended
    ASSERT_TRUE(pending.wait());
    EXPECT_EQ(pending.code, TK_ERR_CONNECTION_LOST) << pending.err.message;
    EXPECT_EQ(tk_lock_lost(held.lock), TK_LOST_NONE) << "held locks keep their deadlines";
    EXPECT_GT(tk_lock_remaining_ms(held.lock), 20000);
}

TEST(FakeSession, ChangedStateIdLosesEverythingAndStartsANewSession)
{
    FakeServer fs;
    LostLog lost;
    Connected cx(fs, [&](tk_options &o) {
        o.on_lost = LostLog::cb;
        o.on_lost_data = &lost;
    });
    Reply held, pending;
    acquire_async(cx.c, "held", 30000, TK_WAIT_FOREVER, held);
    auto q = cx.conn->read_request();
    cx.conn->respond(q, TK_STATUS_OK, 5, 30000);
    ASSERT_TRUE(held.wait());
    acquire_async(cx.c, "waiting", 30000, TK_WAIT_FOREVER, pending);
    cx.conn->read_request();
    cx.conn->close();
    auto n = fs.accept();
    tk_hello h = n->read_hello();
    EXPECT_EQ(memcmp(h.session_id, cx.hello.session_id, 16), 0) << "tries to resume first";
    n->send_challenge();
    n->read_auth();
    n->send_welcome(S2, false); // another lock state: the server restarted
    ASSERT_TRUE(pending.wait());
    EXPECT_EQ(pending.code, TK_ERR_SERVER_RESTARTED) << pending.err.message;
    ASSERT_TRUE(wait_until([&] { return lost.count() == 1; }));
    EXPECT_EQ(lost.reason_of(5), TK_LOST_SERVER_RESTARTED);
    EXPECT_EQ(tk_lock_lost(held.lock), TK_LOST_SERVER_RESTARTED);
    // it starts over with a new session id, and never re-sends the old waiter
    auto n2 = fs.accept();
    tk_hello h2 = n2->handshake(S2, false);
    EXPECT_NE(memcmp(h2.session_id, cx.hello.session_id, 16), 0);
    EXPECT_TRUE(n2->quiet_for(200ms)) << "the waiter is not re-queued";
    // the release of a lock lost to a restart answers at once and sends nothing (the new server
    // has nothing of the old state to release)
    tk_error e;
    EXPECT_EQ(tk_lock_release(held.lock, &e), TK_ERR_LOCK_LOST);
    EXPECT_EQ(e.reason, TK_LOST_SERVER_RESTARTED);
    EXPECT_TRUE(n2->quiet_for(200ms)) << "no RELEASE after a restart";
    EXPECT_EQ(lost.count(), 1u) << "lost fires once";
}

TEST(FakeSession, GracePassingWithoutReconnectFailsTheWaiters)
{
    FakeServer fs;
    Connected cx(fs, [](tk_options &o) { o.dial_timeout_ms = 3000; }, S1, 300);
    Reply pending;
    acquire_async(cx.c, "k", 30000, TK_WAIT_FOREVER, pending);
    cx.conn->read_request();
    auto start = std::chrono::steady_clock::now();
    cx.conn->close(); // and the fake never finishes another handshake
    ASSERT_TRUE(pending.wait(3000ms));
    auto took = std::chrono::steady_clock::now() - start;
    EXPECT_EQ(pending.code, TK_ERR_CONNECTION_LOST) << pending.err.message;
    EXPECT_GE(took, 250ms);
    EXPECT_LT(took, 2500ms);
}

TEST(FakeSession, NoGraceFailsUnansweredAtOnce)
{
    FakeServer fs;
    Connected cx(fs, nullptr, S1, 0);
    Reply pending;
    acquire_async(cx.c, "k", 30000, TK_WAIT_FOREVER, pending);
    cx.conn->read_request();
    cx.conn->close();
    ASSERT_TRUE(pending.wait(2000ms));
    EXPECT_EQ(pending.code, TK_ERR_CONNECTION_LOST);
}

// ---- reconnecting ------------------------------------------------------------------------------

namespace {

// Answers every connection of fs with CHALLENGE NOT_LEADER (hint: hint_for(n), n counting from 1)
// until stopped, counting the HELLOs.
struct Refuser {
    std::atomic<int> hellos{0};
    std::atomic<bool> stop{false};
    std::thread t;
    Refuser(FakeServer &fs, std::function<std::string(int)> hint_for)
        : t([this, &fs, hint_for] {
              while (!stop) {
                  std::unique_ptr<FakeConn> c;
                  try {
                      c = fs.accept(20ms);
                  } catch (const std::exception &) {
                      continue;
                  }
                  try {
                      c->read_hello();
                      int n = ++hellos;
                      c->send_challenge(TK_STATUS_NOT_LEADER, 0, hint_for(n));
                  } catch (const std::exception &) {
                  }
              }
          })
    {
    }
    ~Refuser()
    {
        stop = true;
        t.join();
    }
};

} // namespace

TEST(FakeReconnect, OnlyAnErrorNoRetryFixesFailsWaitingCalls)
{
    FakeServer fs;
    Connected cx(fs, [](tk_options &o) { o.request_timeout_ms = 5000; });
    Reply r;
    acquire_async(cx.c, "k", 30000, TK_WAIT_FOREVER, r);
    cx.conn->read_request();
    cx.conn->close();
    auto busy = fs.accept(); // a failed round: the call keeps waiting
    busy->read_hello();
    busy->send_challenge(TK_STATUS_BUSY, 0, "too many connections", nullptr, TK_LIMIT_CONNECTIONS);
    busy->close();
    auto again = fs.accept();
    EXPECT_FALSE(r.is_done()) << r.err.message;
    again->read_hello(); // a round no retry fixes: the call fails at once
    auto start = std::chrono::steady_clock::now();
    again->send_challenge(TK_STATUS_UNSUPPORTED_VERSION, 0, "unsupported protocol version");
    ASSERT_TRUE(r.wait(3000ms));
    EXPECT_LT(std::chrono::steady_clock::now() - start, 2000ms);
    EXPECT_EQ(r.code, TK_ERR_UNSUPPORTED_VERSION) << r.err.message;
}

TEST(FakeReconnect, AfterARoundWithNotLeaderTheNextPauseIsTheShortest)
{
    FakeServer fs;
    Connected cx(fs, [](tk_options &o) {
        o.backoff_min_ms = 50;
        o.backoff_max_ms = 2000;
    });
    cx.conn->close();
    Refuser follower(fs, [](int) { return std::string(); }); // electing: no leader known yet
    ASSERT_TRUE(wait_until([&] { return follower.hellos > 0; }));
    int before = follower.hellos;
    std::this_thread::sleep_for(2000ms);
    int rounds = follower.hellos - before;
    // Pauses of 25-50 ms: about 40-80 rounds in 2 s; doubling (50, 100, 200, 400, 800, 1600 ms,
    // with jitter) would give at most 7. (Over 1 s a loaded machine fell short.)
    EXPECT_GE(rounds, 12) << "the backoff grew during the election";
}

TEST(FakeReconnect, LeaderHintsAreFollowedInEveryRound)
{
    FakeServer fs, leader;
    std::string dead;
    {
        FakeServer gone; // the old leader: nobody listens there any more
        dead = gone.addr();
    }
    std::string leader_addr = leader.addr();
    Connected cx(fs); // the only endpoint: a node that then names the leader
    cx.conn->close();
    // It names the old leader in many rounds (more hints than one round follows), then the new one.
    Refuser follower(fs, [&](int n) { return n <= 30 ? dead : leader_addr; });
    auto l = leader.accept(5000ms);
    tk_hello h = l->handshake(S1, true);
    EXPECT_EQ(memcmp(h.session_id, cx.hello.session_id, 16), 0);
    EXPECT_GT(follower.hellos, 30);
}

TEST(FakeReconnect, CallTimingOutWhileReconnectingNamesTheLastConnectError)
{
    FakeServer fs;
    std::string addr = fs.addr();
    Connected cx(fs, [](tk_options &o) { o.request_timeout_ms = 500; });
    cx.conn->close();
    Refuser follower(fs, [](int) { return std::string(); });
    tk_error e;
    EXPECT_EQ(tk_ping(cx.c, &e), TK_ERR_TIMEOUT);
    std::string m = e.message;
    EXPECT_NE(m.find("not connected: "), std::string::npos) << m;
    EXPECT_NE(m.find(addr + ": not the leader"), std::string::npos) << m;
}

// ---- the first connect during an election -------------------------------------------------------

namespace {

// tk_client_connect to fs with the given tweaks, on another thread.
std::future<std::pair<tk_client *, tk_error>> connect_later(FakeServer &fs, std::function<void(tk_options &)> tweak)
{
    std::string addr = fs.addr();
    return std::async(std::launch::async, [addr, tweak] {
        const char *eps[] = {addr.c_str()};
        tk_options o{};
        o.endpoints = eps;
        o.n_endpoints = 1;
        o.heartbeat_ms = TK_OFF;
        tweak(o);
        tk_client *c = nullptr;
        tk_error e{};
        tk_client_connect(&o, &c, &e);
        return std::make_pair(c, e);
    });
}

} // namespace

TEST(FakeFirstConnect, ElectionIsWaitedOut)
{
    FakeServer fs;
    auto fut = connect_later(fs, [](tk_options &o) { o.backoff_min_ms = 20; });
    for (int i = 0; i < 2; i++) { // electing: no leader known yet
        auto f = fs.accept();
        f->read_hello();
        f->send_challenge(TK_STATUS_NOT_LEADER, 0, "");
        EXPECT_TRUE(f->closed_by_peer());
        EXPECT_EQ(fut.wait_for(0ms), std::future_status::timeout) << "the connect gave up during the election";
    }
    auto l = fs.accept(); // a leader now
    l->handshake(S1, false);
    auto [c, e] = fut.get();
    ASSERT_NE(c, nullptr) << e.message;
    EXPECT_EQ(e.code, TK_OK);
    tk_client_free(c);
}

TEST(FakeFirstConnect, ElectionLongerThanTheRequestTimeoutFailsUnavailable)
{
    FakeServer fs;
    std::string addr = fs.addr();
    Refuser follower(fs, [](int) { return std::string(); });
    auto start = std::chrono::steady_clock::now();
    auto fut = connect_later(fs, [](tk_options &o) {
        o.request_timeout_ms = 500;
        o.backoff_min_ms = 20;
    });
    auto [c, e] = fut.get();
    auto took = std::chrono::steady_clock::now() - start;
    ASSERT_EQ(c, nullptr);
    EXPECT_EQ(e.code, TK_ERR_UNAVAILABLE) << e.message;
    EXPECT_NE(std::string(e.message).find(addr + ": not the leader"), std::string::npos) << e.message;
    EXPECT_GE(took, 400ms) << "gave up before the request timeout";
    EXPECT_LT(took, 2000ms) << "kept trying past the request timeout";
    EXPECT_GE(follower.hellos, 5) << "rounds at the shortest backoff";
}

TEST(FakeFirstConnect, RefusedFailsAtOnce)
{
    std::string dead;
    {
        FakeServer gone; // nobody listens there any more
        dead = gone.addr();
    }
    const char *eps[] = {dead.c_str()};
    tk_options o{};
    o.endpoints = eps;
    o.n_endpoints = 1;
    o.heartbeat_ms = TK_OFF;
    o.request_timeout_ms = 5000;
    auto start = std::chrono::steady_clock::now();
    tk_client *c = nullptr;
    tk_error e{};
    EXPECT_EQ(tk_client_connect(&o, &c, &e), TK_ERR_UNAVAILABLE) << e.message;
    EXPECT_EQ(c, nullptr);
    EXPECT_LT(std::chrono::steady_clock::now() - start, 1000ms) << "a round without NOT_LEADER is not retried";
}

TEST(FakeFirstConnect, AsyncElectionRetriesOnTheContextsTimer)
{
    FakeServer fs;
    tk_async *ac = new_async(fs.addr(), [](tk_options &o) { o.backoff_min_ms = 40; });
    AsyncReply conn;
    ASSERT_EQ(tk_async_connect(ac, AsyncReply::connected, &conn), TK_OK);
    for (int i = 0; i < 2; i++) {
        ASSERT_TRUE(pump(ac, [&] { return conn.done || tk_async_fd(ac) >= 0; })) << "no next round";
        auto f = fs.accept();
        pump(ac, [&] { return f->has_frame(); });
        f->read_hello();
        f->send_challenge(TK_STATUS_NOT_LEADER, 0, "");
        ASSERT_TRUE(pump(ac, [&] { return conn.done || tk_async_fd(ac) < 0; }));
        EXPECT_FALSE(conn.done) << conn.message;
        int t = tk_async_timeout_ms(ac);
        EXPECT_GE(t, 0);
        EXPECT_LE(t, 40) << "the next round waits on the shortest backoff";
    }
    ASSERT_TRUE(pump(ac, [&] { return conn.done || tk_async_fd(ac) >= 0; })) << "no next round";
    auto l = fs.accept();
    pump(ac, [&] { return l->has_frame(); });
    l->read_hello();
    l->send_challenge();
    pump(ac, [&] { return l->has_frame(); });
    l->read_auth();
    l->send_welcome(S1, false);
    ASSERT_TRUE(pump(ac, [&] { return conn.done; }));
    EXPECT_EQ(conn.code, TK_OK) << conn.message;
    tk_async_free(ac);
}

// ---- cancel, timeouts, heartbeat --------------------------------------------------------------

TEST(FakeCancel, GrantThatRacedTheCancelIsReleased)
{
    FakeServer fs;
    Connected cx(fs);
    Reply r;
    uint64_t id = 0;
    acquire_async(cx.c, "k", 30000, TK_WAIT_FOREVER, r, &id);
    auto q = cx.conn->read_request();
    tk_error e;
    ASSERT_EQ(tk_client_cancel(cx.c, id, &e), TK_OK) << e.message;
    auto c = cx.conn->read_request();
    EXPECT_EQ(c.r.op, TK_OP_CANCEL);
    EXPECT_EQ(c.r.token, id) << "CANCEL names the acquire's id";
    EXPECT_FALSE(r.is_done()) << "the caller waits for the clean-up";
    cx.conn->respond(q, TK_STATUS_OK, 77, 30000); // granted before the cancel arrived
    cx.conn->respond(c, TK_STATUS_OK, 0, 0, 0);
    auto rel = cx.conn->read_request();
    EXPECT_EQ(rel.r.op, TK_OP_RELEASE);
    EXPECT_EQ(rel.r.token, 77u);
    EXPECT_EQ(rel.key, "k");
    cx.conn->respond(rel, TK_STATUS_OK);
    ASSERT_TRUE(r.wait());
    EXPECT_EQ(r.code, TK_ERR_CANCELLED);
    EXPECT_EQ(r.lock, nullptr);
    EXPECT_EQ(tk_client_cancel(cx.c, id, &e), TK_ERR_INVALID_ARGUMENT) << "nothing pending any more";
}

TEST(FakeCancel, WithdrawnWaiterReportsCancelled)
{
    FakeServer fs;
    Connected cx(fs);
    Reply r;
    uint64_t id = 0;
    acquire_async(cx.c, "k", 30000, TK_WAIT_FOREVER, r, &id);
    auto q = cx.conn->read_request();
    tk_error e;
    tk_client_cancel(cx.c, id, &e);
    auto c = cx.conn->read_request();
    cx.conn->respond(q, TK_STATUS_CANCELLED);
    cx.conn->respond(c, TK_STATUS_OK, 0, 0, 1);
    ASSERT_TRUE(r.wait());
    EXPECT_EQ(r.code, TK_ERR_CANCELLED);
    EXPECT_TRUE(cx.conn->quiet_for(100ms)) << "nothing to release";
}

TEST(FakeTimeouts, RequestTimeoutExcludesQueueTime)
{
    FakeServer fs;
    Connected cx(fs, [](tk_options &o) { o.request_timeout_ms = 200; });
    Reply r;
    auto start = std::chrono::steady_clock::now();
    acquire_async(cx.c, "k", 30000, 600, r);
    auto q = cx.conn->read_request();
    EXPECT_FALSE(r.wait(550ms)) << "queue time (wait 600 ms) is not a timeout";
    ASSERT_TRUE(r.wait(2000ms));
    auto took = std::chrono::steady_clock::now() - start;
    EXPECT_EQ(r.code, TK_ERR_TIMEOUT) << r.err.message;
    EXPECT_GE(took, 780ms);
    // the abandoned acquire is withdrawn (on this connection or, after it failed, the next)
    bool saw_cancel = false;
    try {
        auto c = cx.conn->read_request(1000ms);
        saw_cancel = c.r.op == TK_OP_CANCEL && c.r.token == q.r.id;
    } catch (const std::exception &) {
        auto n = fs.accept();
        n->handshake(S1, true);
        auto retry = n->read_request();
        EXPECT_EQ(retry.r.id, q.r.id);
        auto c = n->read_request();
        saw_cancel = c.r.op == TK_OP_CANCEL && c.r.token == q.r.id;
    }
    EXPECT_TRUE(saw_cancel);
}

TEST(FakeTimeouts, PingTimesOutAndTheConnectionIsReplaced)
{
    FakeServer fs;
    Connected cx(fs, [](tk_options &o) { o.request_timeout_ms = 200; });
    auto start = std::chrono::steady_clock::now();
    tk_error e;
    EXPECT_EQ(tk_ping(cx.c, &e), TK_ERR_TIMEOUT);
    auto took = std::chrono::steady_clock::now() - start;
    EXPECT_GE(took, 190ms);
    EXPECT_LT(took, 1500ms);
    EXPECT_NE(std::string(e.message).find("timed out"), std::string::npos) << e.message;
    EXPECT_TRUE(cx.conn->closed_by_peer()) << "a silent connection is dropped";
    auto n = fs.accept();
    n->handshake(S1, true); // and the client reconnects by itself
}

TEST(FakeTimeouts, HeartbeatDetectsASilentServer)
{
    FakeServer fs;
    // Timed from before the connection: the heartbeat counts from the handshake's end, and a
    // loaded machine can take more than 20 ms between that and the test's next step (79.99 ms
    // was seen beside two CPU hogs when the clock started after the handshake).
    auto start = std::chrono::steady_clock::now();
    Connected cx(fs, [](tk_options &o) {
        o.heartbeat_ms = 100;
        o.request_timeout_ms = 300;
    });
    auto q = cx.conn->read_request(2000ms);
    EXPECT_EQ(q.r.op, TK_OP_PING);
    EXPECT_GE(std::chrono::steady_clock::now() - start, 80ms);
    // answered: the next heartbeat comes a heartbeat interval later
    cx.conn->respond(q, TK_STATUS_OK);
    auto q2 = cx.conn->read_request(2000ms);
    EXPECT_EQ(q2.r.op, TK_OP_PING);
    EXPECT_GT(q2.r.id, q.r.id);
    // unanswered: the connection is failed within the request timeout
    EXPECT_TRUE(cx.conn->closed_by_peer(2000ms));
    auto n = fs.accept();
    n->handshake(S1, true);
}

// ---- pushes, lost signal, keep-alive ---------------------------------------------------------

TEST(FakeLost, ExpiredPushesAndReasons)
{
    FakeServer fs;
    LostLog lost;
    Connected cx(fs, [&](tk_options &o) {
        o.on_lost = LostLog::cb;
        o.on_lost_data = &lost;
    });
    Reply a, b, c;
    acquire_async(cx.c, "a", 30000, 0, a);
    acquire_async(cx.c, "b", 30000, 0, b);
    acquire_async(cx.c, "c", 30000, 0, c);
    for (uint64_t t : {1, 2, 3}) {
        auto q = cx.conn->read_request();
        cx.conn->respond(q, TK_STATUS_OK, t, 30000);
    }
    ASSERT_TRUE(a.wait() && b.wait() && c.wait());
    cx.conn->push(TK_OP_EXPIRED, 1, TK_EXPIRED_LEASE, "a");
    cx.conn->push(TK_OP_EXPIRED, 2, TK_EXPIRED_STOPPING, "b");
    cx.conn->push(TK_OP_EXPIRED, 3, 99, "c");        // unknown reason: lost
    cx.conn->push(TK_OP_EXPIRED, 3, TK_EXPIRED_LEASE, "c"); // twice: fires once
    cx.conn->push(0x2f, 0, 0, "future push");       // unknown push op: ignored
    cx.conn->push(TK_OP_EXPIRED, 42, TK_EXPIRED_LEASE, "x"); // not ours: ignored
    ASSERT_TRUE(wait_until([&] { return lost.count() >= 3; }));
    EXPECT_TRUE(stays([&] { return lost.count() == 3; }, 50ms));
    EXPECT_EQ(lost.reason_of(1), TK_LOST_EXPIRED);
    EXPECT_EQ(lost.reason_of(2), TK_LOST_SERVER_STOPPING);
    EXPECT_EQ(lost.reason_of(3), TK_LOST_EXPIRED);
    tk_error e;
    EXPECT_EQ(tk_lock_release(a.lock, &e), TK_ERR_LOCK_LOST) << "at once: no answer needed";
    EXPECT_EQ(e.reason, TK_LOST_EXPIRED);
    auto q = cx.conn->read_request();
    EXPECT_EQ(q.r.op, TK_OP_RELEASE) << "a lost lock's release still tells the server, in the background";
    EXPECT_EQ(q.r.token, 1u);
    cx.conn->respond(q, TK_STATUS_NOT_HELD);
    tk_error ping_e;
    auto ping = std::async(std::launch::async, [&] { return tk_ping(cx.c, &ping_e); });
    auto p = cx.conn->read_request();
    cx.conn->respond(p, TK_STATUS_OK);
    EXPECT_EQ(ping.get(), TK_OK) << "the connection survived the unknown push";
}

TEST(FakeLost, LocalDeadlineFiresBeforeTheLease)
{
    FakeServer fs;
    LostLog lost;
    Connected cx(fs, [&](tk_options &o) {
        o.on_lost = LostLog::cb;
        o.on_lost_data = &lost;
    });
    Reply r;
    auto sent = std::chrono::steady_clock::now();
    acquire_async(cx.c, "k", 400, TK_WAIT_FOREVER, r);
    auto q = cx.conn->read_request();
    cx.conn->respond(q, TK_STATUS_OK, 3, 400, 100); // 100 ms queued
    ASSERT_TRUE(r.wait());
    ASSERT_TRUE(wait_until([&] { return lost.count() == 1; }, 2000ms));
    auto at = std::chrono::steady_clock::now() - sent;
    // deadline = t_send + (100 + 400) * 0.998 = 499 ms; fires 5 ms before; t_send <= sent.
    // The upper bound leaves 400 ms for a loaded machine to run the timer and this poll (it
    // fired at 712 ms under load 20 on 2 cores); a deadline counted from the answer's arrival
    // plus the queued time twice, or no local deadline at all, is still caught.
    EXPECT_LE(at, 900ms);
    EXPECT_GE(at, 480ms);
    EXPECT_EQ(lost.reason_of(3), TK_LOST_EXPIRED);
}

TEST(FakeLost, KeepAliveExtendsAndStopsOnNotHeld)
{
    FakeServer fs;
    LostLog lost;
    Connected cx(fs);
    Reply r;
    tk_acquire_opts ao{};
    ao.keepalive = 1;
    ao.on_lost = LostLog::cb;
    ao.on_lost_data = &lost;
    // A 900 ms lease, extended every 300 ms: with 300 ms (every 100 ms) a stall of 200 ms on a
    // loaded machine could lose the lock before the second extend.
    acquire_async(cx.c, "k", 900, TK_WAIT_FOREVER, r, nullptr, &ao);
    auto q = cx.conn->read_request();
    auto granted = std::chrono::steady_clock::now();
    cx.conn->respond(q, TK_STATUS_OK, 8, 900);
    ASSERT_TRUE(r.wait());
    auto x1 = cx.conn->read_request(3000ms);
    EXPECT_EQ(x1.r.op, TK_OP_EXTEND);
    EXPECT_EQ(x1.r.token, 8u);
    EXPECT_EQ(x1.r.lease_ms, 900u);
    EXPECT_GE(std::chrono::steady_clock::now() - granted, 250ms);
    cx.conn->respond(x1, TK_STATUS_OK, 8, 900);
    auto x2 = cx.conn->read_request(3000ms);
    EXPECT_EQ(x2.r.op, TK_OP_EXTEND);
    cx.conn->respond(x2, TK_STATUS_NOT_HELD);
    ASSERT_TRUE(wait_until([&] { return lost.count() == 1; }));
    EXPECT_EQ(lost.reason_of(8), TK_LOST_NOT_HELD);
    EXPECT_TRUE(cx.conn->quiet_for(300ms)) << "keep-alive stops with the loss";
}

TEST(FakeLost, NoLostAfterRelease)
{
    FakeServer fs;
    LostLog lost;
    Connected cx(fs);
    Reply r;
    tk_acquire_opts ao{};
    ao.on_lost = LostLog::cb;
    ao.on_lost_data = &lost;
    acquire_async(cx.c, "k", 150, TK_WAIT_FOREVER, r, nullptr, &ao);
    auto q = cx.conn->read_request();
    cx.conn->respond(q, TK_STATUS_OK, 4, 150);
    ASSERT_TRUE(r.wait());
    tk_error e;
    auto rel = std::async(std::launch::async, [&] { return tk_lock_release(r.lock, &e); });
    auto rq = cx.conn->read_request();
    ASSERT_TRUE(wait_until([&] { return tk_lock_remaining_ms(r.lock) == 0; })); // the deadline passes meanwhile
    cx.conn->respond(rq, TK_STATUS_OK);
    EXPECT_EQ(rel.get(), TK_OK) << e.message;
    EXPECT_TRUE(stays([&] { return lost.count() == 0; }, 100ms));
    EXPECT_TRUE(tk_lock_released(r.lock));
    EXPECT_EQ(tk_lock_release(r.lock, &e), TK_OK) << "a second release is a no-op";
}

TEST(FakeLost, BlockingCallsFromTheIoThreadAreRefusedNotDeadlocked)
{
    FakeServer fs;
    struct Ctx {
        tk_client *c = nullptr;
        std::atomic<int> rc{-1};
    } ctx;
    Connected cx(fs, [&](tk_options &o) {
        o.on_lost = [](tk_lock *, tk_lost_reason, void *d) {
            auto *x = static_cast<Ctx *>(d);
            tk_error e;
            x->rc = tk_ping(x->c, &e); // runs on the I/O thread
        };
        o.on_lost_data = &ctx;
    });
    ctx.c = cx.c;
    Reply r;
    acquire_async(cx.c, "k", 30000, 0, r);
    auto q = cx.conn->read_request();
    cx.conn->respond(q, TK_STATUS_OK, 1, 30000);
    ASSERT_TRUE(r.wait());
    cx.conn->push(TK_OP_EXPIRED, 1, TK_EXPIRED_LEASE, "k");
    ASSERT_TRUE(wait_until([&] { return ctx.rc != -1; }));
    EXPECT_EQ(ctx.rc.load(), TK_ERR_INVALID_ARGUMENT);
}

// ---- the local deadline (PROTOCOL.md "The lost signal") ---------------------------------------

using Clock = std::chrono::steady_clock;

// The lock's local deadline as a steady_clock interval [lo, hi] (the reading's own duration).
std::pair<Clock::time_point, Clock::time_point> deadline_of(tk_lock *l)
{
    auto before = Clock::now();
    auto in = std::chrono::microseconds(tk_lock_deadline_in_us(l));
    auto after = Clock::now();
    return {before + in, after + in};
}

// d in milliseconds (for readable failures).
double ms(Clock::duration d) { return std::chrono::duration<double, std::milli>(d).count(); }

// (detail + lease) * (1 - 2 * rho): the span a grant's deadline counts from its first send.
std::chrono::microseconds span_of(uint32_t detail_ms, uint32_t lease_ms)
{
    return std::chrono::microseconds((uint64_t(detail_ms) + lease_ms) * (1000000 - 2 * TK_CLOCK_RATE_BOUND_PPM) / 1000);
}

// The connection drops while an acquire waits; the client resumes and re-sends it.
std::unique_ptr<FakeConn> drop_and_resume(FakeServer &fs, Connected &cx, const FakeConn::Req &q)
{
    cx.conn->close();
    auto n = fs.accept();
    n->handshake(S1, true);
    auto retry = n->read_request();
    EXPECT_EQ(retry.r.id, q.r.id) << "re-sent with its original id";
    return n;
}

// A grant decided before the re-send and read after it (its answer was held back): the deadline
// counts from the first send with the answer's detail, not from the re-send (300 ms late before).
TEST(FakeDeadline, GrantReadAfterTheResendCountsFromTheFirstSend)
{
    FakeServer fs;
    Connected cx(fs);
    Reply r;
    auto sent = Clock::now();
    acquire_async(cx.c, "k", 3000, TK_WAIT_FOREVER, r);
    auto q = cx.conn->read_request();
    auto arrived = Clock::now();
    std::this_thread::sleep_for(300ms); // granted 100 ms after it arrived; the answer never comes
    auto n = drop_and_resume(fs, cx, q);
    n->respond(q, TK_STATUS_OK, 7, 3000, 100); // the original grant: 100 ms queued, the whole lease
    ASSERT_TRUE(r.wait());
    ASSERT_EQ(r.code, TK_OK) << r.err.message;
    auto [lo, hi] = deadline_of(r.lock);
    EXPECT_LE(ms(hi - (arrived + span_of(100, 3000))), 2.0) << "ms after the server's lease end";
    EXPECT_GE(ms(lo - (sent + span_of(100, 3000))), -2.0) << "ms earlier than the rule allows";
}

// A waiter granted a second after its re-send: the server's detail counts the whole time since
// the first arrival, and so does the deadline (a second early before: the re-send's time with the
// lease alone).
TEST(FakeDeadline, WaiterGrantedLongAfterItsResendCountsItsQueuedTime)
{
    FakeServer fs;
    Connected cx(fs);
    Reply r;
    auto sent = Clock::now();
    acquire_async(cx.c, "k", 3000, TK_WAIT_FOREVER, r);
    auto q = cx.conn->read_request();
    auto arrived = Clock::now();
    auto n = drop_and_resume(fs, cx, q);
    std::this_thread::sleep_for(1000ms);
    auto queued = std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - arrived);
    n->respond(q, TK_STATUS_OK, 7, 3000, uint32_t(queued.count()));
    ASSERT_TRUE(r.wait());
    ASSERT_EQ(r.code, TK_OK) << r.err.message;
    auto span = span_of(uint32_t(queued.count()), 3000);
    auto [lo, hi] = deadline_of(r.lock);
    EXPECT_LE(ms(hi - (arrived + span)), 2.0) << "ms after the server's lease end";
    EXPECT_GE(ms(lo - (sent + span)), -2.0) << "ms earlier than the rule allows";
}

// Two extends in flight: the server applies them in id order, so the deadline follows the newer
// one's answer even when the older one's, longer, is read after it (one hour before).
TEST(FakeDeadline, OlderExtendAnsweredAfterANewerOneLeavesTheDeadline)
{
    FakeServer fs;
    Connected cx(fs);
    Reply r;
    acquire_async(cx.c, "k", 3000, TK_WAIT_FOREVER, r);
    auto q = cx.conn->read_request();
    cx.conn->respond(q, TK_STATUS_OK, 7, 3000);
    ASSERT_TRUE(r.wait());
    ASSERT_EQ(r.code, TK_OK) << r.err.message;
    tk_error e1, e2;
    auto older = std::async(std::launch::async, [&] { return tk_lock_extend(r.lock, 3600000, &e1); });
    auto x1 = cx.conn->read_request();
    auto newer_sent = Clock::now();
    auto newer = std::async(std::launch::async, [&] { return tk_lock_extend(r.lock, 2000, &e2); });
    auto x2 = cx.conn->read_request();
    auto newer_arrived = Clock::now();
    ASSERT_EQ(x1.r.op, TK_OP_EXTEND);
    ASSERT_EQ(x2.r.op, TK_OP_EXTEND);
    ASSERT_LT(x1.r.id, x2.r.id);
    ASSERT_EQ(x2.r.lease_ms, 2000u);
    cx.conn->respond(x2, TK_STATUS_OK, 7, 2000);
    EXPECT_EQ(newer.get(), TK_OK) << e2.message;
    cx.conn->respond(x1, TK_STATUS_OK, 7, 3600000);
    EXPECT_EQ(older.get(), TK_OK) << e1.message;
    auto [lo, hi] = deadline_of(r.lock);
    EXPECT_LE(ms(hi - (newer_arrived + span_of(0, 2000))), 2.0) << "ms after the newer extend's lease end";
    EXPECT_GE(ms(lo - (newer_sent + span_of(0, 2000))), -2.0) << "ms earlier than the newer extend allows";
    EXPECT_EQ(tk_lock_lease_ms(r.lock), 2000u);
}

// A host suspend (the clock jumps; the I/O thread's poll timeout does not count it): a held lock
// whose lease ran out meanwhile is lost within LOST_CHECK_MS, not when its timer would have woken
// (30 s later before).
TEST(FakeDeadline, SuspendLongerThanTheLeaseLosesTheLockWithinTheCheckPeriod)
{
    FakeServer fs;
    LostLog lost;
    Connected cx(fs, [&](tk_options &o) {
        o.on_lost = LostLog::cb;
        o.on_lost_data = &lost;
    });
    Reply r;
    acquire_async(cx.c, "k", 30000, TK_WAIT_FOREVER, r);
    auto q = cx.conn->read_request();
    cx.conn->respond(q, TK_STATUS_OK, 7, 30000);
    ASSERT_TRUE(r.wait());
    std::this_thread::sleep_for(50ms); // the I/O thread sleeps in poll()
    auto resumed = Clock::now();
    tk__clock_skew(60000000); // 60 s suspended (for the rest of this process: the clock never goes back)
    ASSERT_TRUE(wait_until([&] { return lost.count() == 1; }, 2000ms));
    EXPECT_LE(Clock::now() - resumed, std::chrono::milliseconds(TK_LOST_CHECK_MS) + 150ms);
    EXPECT_EQ(lost.reason_of(7), TK_LOST_EXPIRED);
    EXPECT_LT(tk_lock_deadline_in_us(r.lock), -29000000);
}

// After a suspend, a call on the lock looks at its deadline at once: its lost timer has not run
// yet (nothing has called tk_async_process), and the extend fails without a round trip (it was
// sent before).
TEST(FakeDeadline, ExtendAfterASuspendIsLostAtOnce)
{
    FakeServer fs;
    LostLog lost;
    tk_async *ac = new_async(fs.addr(), [&](tk_options &o) {
        o.on_lost = LostLog::cb;
        o.on_lost_data = &lost;
    });
    AsyncReply conn, ext;
    tk_async_connect(ac, AsyncReply::connected, &conn);
    auto fc = fs.accept();
    pump(ac, [&] { return fc->has_frame(); });
    fc->read_hello();
    fc->send_challenge();
    pump(ac, [&] { return fc->has_frame(); });
    fc->read_auth();
    fc->send_welcome(S1, false);
    ASSERT_TRUE(pump(ac, [&] { return conn.done; }));
    tk_lock *lock = nullptr;
    auto got = [](tk_async *, const tk_reply *r, void *data) { *static_cast<tk_lock **>(data) = r->lock; };
    ASSERT_EQ(tk_async_acquire(ac, "k", 1, 30000, TK_WAIT_FOREVER, nullptr, got, &lock, nullptr), TK_OK);
    pump(ac, [&] { return fc->has_frame(); });
    auto q = fc->read_request();
    fc->respond(q, TK_STATUS_OK, 7, 30000);
    ASSERT_TRUE(pump(ac, [&] { return lock != nullptr; }));
    tk__clock_skew(60000000);
    std::this_thread::sleep_for(30ms); // the clock looks for suspend time at most every 20 ms
    ASSERT_EQ(tk_async_extend(ac, lock, 30000, AsyncReply::cb, &ext), TK_OK);
    EXPECT_TRUE(ext.done);
    EXPECT_EQ(ext.code, TK_ERR_LOCK_LOST) << ext.message;
    EXPECT_EQ(lost.reason_of(7), TK_LOST_EXPIRED);
    pump(ac, [] { return false; }, 50ms);
    EXPECT_TRUE(fc->quiet_for(50ms)) << "the extend went to the server";
    tk_lock_free(lock);
    tk_async_free(ac);
}

// ---- ACK, bad frames, misc --------------------------------------------------------------------

TEST(FakeAck, SentEvery1024AnswersOneAtATime)
{
    FakeServer fs;
    tk_async *ac = new_async(fs.addr());
    AsyncReply conn, waiter;
    tk_async_connect(ac, AsyncReply::connected, &conn);
    auto fc = fs.accept();
    pump(ac, [&] { return fc->has_frame(); });
    fc->read_hello();
    fc->send_challenge();
    pump(ac, [&] { return fc->has_frame(); });
    fc->read_auth();
    fc->send_welcome(S1, false);
    ASSERT_TRUE(pump(ac, [&] { return conn.done; }));
    uint64_t acq_id = 0;
    ASSERT_EQ(tk_async_acquire(ac, "k", 1, 1000, TK_WAIT_FOREVER, nullptr, AsyncReply::cb, &waiter, &acq_id), TK_OK);
    const int N = 2100;
    std::vector<AsyncReply> pings(N);
    for (auto &p : pings)
        ASSERT_EQ(tk_async_ping(ac, AsyncReply::cb, &p), TK_OK);
    std::vector<FakeConn::Req> reqs;
    ASSERT_TRUE(pump(ac, [&] {
        while (fc->has_frame())
            reqs.push_back(fc->read_request());
        return reqs.size() == size_t(N + 1);
    }, 5000ms));
    EXPECT_EQ(reqs[0].r.id, acq_id);
    // answer the pings one by one; an ACK appears after the 1024th answer
    std::vector<FakeConn::Req> acks;
    for (int i = 1; i <= N; i++) {
        fc->respond(reqs[i], TK_STATUS_OK);
        if (i % 64 == 0 || i == N) {
            ASSERT_TRUE(pump(ac, [&] { return pings[i - 1].done; }));
            while (fc->has_frame()) {
                auto q = fc->read_request();
                ASSERT_EQ(q.r.op, TK_OP_ACK) << "only ACKs are sent now";
                acks.push_back(q);
            }
        }
    }
    ASSERT_EQ(acks.size(), 1u) << "never two at once: the first ACK is still unanswered";
    // x = the lowest id still awaited, not counting the pending ACQUIRE: the first unanswered ping
    EXPECT_EQ(acks[0].r.token, reqs[1].r.id + 1024);
    // once it is answered, the answers counted since (more than 1024) call for the next one
    fc->respond(acks[0], TK_STATUS_OK, 0, 0, 0);
    ASSERT_TRUE(pump(ac, [&] { return fc->has_frame(); }));
    auto ack2 = fc->read_request();
    EXPECT_EQ(ack2.r.op, TK_OP_ACK);
    EXPECT_EQ(ack2.r.token, ack2.r.id) << "nothing awaited but the acquire: x is the next id";
    tk_async_free(ac);
    EXPECT_EQ(waiter.code, TK_ERR_CLOSED) << "the pending acquire is told the client closed";
}

TEST(FakeFrames, MalformedFrameDropsTheConnectionNotTheProcess)
{
    FakeServer fs;
    Connected cx(fs);
    Reply r;
    acquire_async(cx.c, "k", 1000, TK_WAIT_FOREVER, r);
    auto q = cx.conn->read_request();
    cx.conn->send_raw(from_hex("0000001d14000000000000000000000100000000000000000000000000000000aa")); // data_len mismatch
    EXPECT_TRUE(cx.conn->closed_by_peer());
    auto n = fs.accept();
    n->handshake(S1, true);
    auto retry = n->read_request();
    EXPECT_EQ(retry.r.id, q.r.id);
    n->respond(retry, TK_STATUS_OK, 1, 1000);
    ASSERT_TRUE(r.wait());
    EXPECT_EQ(r.code, TK_OK);
}

TEST(FakeFrames, UnknownStatusIsAnErrorWithItsNumberAndAnswersForNobodyAreIgnored)
{
    FakeServer fs;
    Connected cx(fs);
    tk_error e;
    auto ping = std::async(std::launch::async, [&] { return tk_ping(cx.c, &e); });
    auto q = cx.conn->read_request();
    auto stray = q;
    stray.r.id = 999999;
    cx.conn->respond(stray, TK_STATUS_OK); // an answer to no request
    cx.conn->respond(q, 42, 0, 0, 0, "from the future");
    EXPECT_EQ(ping.get(), TK_ERR_PROTOCOL);
    EXPECT_NE(std::string(e.message).find("42"), std::string::npos) << e.message;
    EXPECT_EQ(e.status, 42);
}

TEST(FakeFrames, ServerMessagesAreShownOnOneLine)
{
    FakeServer fs;
    Connected cx(fs);
    tk_error e;
    auto rel = std::async(std::launch::async, [&] { return tk_release(cx.c, "k", 1, 5, &e); });
    auto q = cx.conn->read_request();
    cx.conn->respond(q, TK_STATUS_BUSY, 0, 0, TK_LIMIT_INFLIGHT, "too many\nstored outcomes");
    EXPECT_EQ(rel.get(), TK_ERR_BUSY);
    EXPECT_EQ(e.detail, uint32_t(TK_LIMIT_INFLIGHT));
    EXPECT_EQ(std::string(e.message).find('\n'), std::string::npos);
    EXPECT_NE(std::string(e.message).find("INFLIGHT"), std::string::npos) << e.message;
    tk_error last;
    EXPECT_EQ(tk_client_last_error(cx.c, &last), TK_ERR_BUSY) << "the handle remembers it";
}

TEST(FakeFork, ChildRefusesTheParentsClient)
{
    FakeServer fs;
    Connected cx(fs);
    pid_t pid = fork();
    if (pid == 0) {
        tk_error e;
        int code = 0;
        if (tk_ping(cx.c, &e) != TK_ERR_FORKED)
            code |= 1;
        tk_lock *l = nullptr;
        if (tk_acquire(cx.c, "k", 1, 100, 0, nullptr, &l, &e) != TK_ERR_FORKED)
            code |= 2;
        if (std::string(e.message).find("fork") == std::string::npos)
            code |= 4;
        tk_client_free(cx.c); // only closes the child's descriptors
        _exit(code);
    }
    ASSERT_GT(pid, 0);
    int st = 0;
    waitpid(pid, &st, 0);
    ASSERT_TRUE(WIFEXITED(st));
    EXPECT_EQ(WEXITSTATUS(st), 0);
    // the parent's connection is untouched
    tk_error e;
    auto ping = std::async(std::launch::async, [&] { return tk_ping(cx.c, &e); });
    auto q = cx.conn->read_request();
    EXPECT_EQ(q.r.op, TK_OP_PING);
    cx.conn->respond(q, TK_STATUS_OK);
    EXPECT_EQ(ping.get(), TK_OK);
}

TEST(FakeEndpoints, NextEndpointWhenTheFirstIsDown)
{
    FakeServer up;
    std::string down;
    {
        FakeServer gone; // bound then closed: nobody listens there
        down = gone.addr();
    }
    Connected cx(up, nullptr, S1, 5000, {down, up.addr()});
    SUCCEED();
}

TEST(FakeEndpoints, FirstRoundFailureIsUnavailable)
{
    std::string down;
    {
        FakeServer gone;
        down = gone.addr();
    }
    const char *eps[] = {down.c_str()};
    tk_options o{};
    o.endpoints = eps;
    o.n_endpoints = 1;
    tk_client *c = nullptr;
    tk_error e;
    auto start = std::chrono::steady_clock::now();
    EXPECT_EQ(tk_client_connect(&o, &c, &e), TK_ERR_UNAVAILABLE);
    EXPECT_LT(std::chrono::steady_clock::now() - start, 2000ms);
    EXPECT_NE(std::string(e.message).find(down), std::string::npos) << "names the endpoint: " << e.message;
    EXPECT_EQ(c, nullptr);
}

// docs/clients.md rule 1: a handshake that times out is unavailable (never timeout, which is a
// call's own timeout), whether the server never answers HELLO or stops before WELCOME.
TEST(FakeEndpoints, HalfOpenServerHitsTheDialTimeout)
{
    FakeServer silent; // accepts (kernel backlog) but never answers
    const std::string addr = silent.addr();
    const char *eps[] = {addr.c_str()};
    tk_options o{};
    o.endpoints = eps;
    o.n_endpoints = 1;
    o.dial_timeout_ms = 300;
    tk_client *c = nullptr;
    tk_error e;
    auto start = std::chrono::steady_clock::now();
    tk_err rc = tk_client_connect(&o, &c, &e);
    auto took = std::chrono::steady_clock::now() - start;
    EXPECT_EQ(rc, TK_ERR_UNAVAILABLE) << tk_strerror(rc) << ": " << e.message;
    EXPECT_EQ(e.code, TK_ERR_UNAVAILABLE);
    EXPECT_NE(std::string(e.message).find(addr + ": no handshake answer within 300 ms"), std::string::npos) << e.message;
    EXPECT_EQ(c, nullptr);
    EXPECT_GE(took, 280ms);
    EXPECT_LT(took, 2000ms);
}

TEST(FakeEndpoints, ServerThatStopsBeforeWelcomeIsUnavailable)
{
    FakeServer fs;
    const std::string addr = fs.addr();
    tk_error e;
    tk_client *c = nullptr;
    auto start = std::chrono::steady_clock::now();
    auto rc = std::async(std::launch::async, [&] {
        const char *eps[] = {addr.c_str()};
        tk_options o{};
        o.endpoints = eps;
        o.n_endpoints = 1;
        o.dial_timeout_ms = 300;
        return tk_client_connect(&o, &c, &e);
    });
    auto fc = fs.accept();
    fc->read_hello();
    fc->send_challenge();
    fc->read_auth(); // and never a WELCOME
    ASSERT_EQ(rc.wait_for(3000ms), std::future_status::ready);
    auto took = std::chrono::steady_clock::now() - start;
    EXPECT_EQ(rc.get(), TK_ERR_UNAVAILABLE);
    EXPECT_EQ(e.code, TK_ERR_UNAVAILABLE);
    EXPECT_NE(std::string(e.message).find(addr + ": no handshake answer within 300 ms"), std::string::npos) << e.message;
    EXPECT_EQ(c, nullptr);
    EXPECT_GE(took, 280ms);
    EXPECT_LT(took, 2000ms);
}

// ---- the edges every client agrees on (issue 26) ---------------------------------------------

// docs/clients.md rule 4: release of a lock already known lost answers lock-lost at once, without
// waiting for the server, and tells the server in the background (not after a NOT_HELD).
TEST(FakeEdges, ReleaseOfALostLockAnswersAtOnce)
{
    FakeServer fs;
    LostLog lost;
    Connected cx(fs, [&](tk_options &o) {
        o.on_lost = LostLog::cb;
        o.on_lost_data = &lost;
    });
    Reply a, b, c;
    acquire_async(cx.c, "a", 200, TK_WAIT_FOREVER, a);
    cx.conn->respond(cx.conn->read_request(), TK_STATUS_OK, 1, 200);
    acquire_async(cx.c, "b", 30000, TK_WAIT_FOREVER, b);
    cx.conn->respond(cx.conn->read_request(), TK_STATUS_OK, 2, 30000);
    acquire_async(cx.c, "c", 200, TK_WAIT_FOREVER, c);
    cx.conn->respond(cx.conn->read_request(), TK_STATUS_OK, 3, 200);
    ASSERT_TRUE(a.wait() && b.wait() && c.wait());
    ASSERT_TRUE(wait_until([&] { return lost.count() == 2; })) << "a and c expire locally";
    // From now on the server answers nothing: the release must not wait for it (the request
    // timeout is 10 s).
    auto start = std::chrono::steady_clock::now();
    tk_error e;
    EXPECT_EQ(tk_lock_release(a.lock, &e), TK_ERR_LOCK_LOST);
    EXPECT_LT(std::chrono::steady_clock::now() - start, 1000ms);
    EXPECT_EQ(e.reason, TK_LOST_EXPIRED);
    EXPECT_NE(std::string(e.message).find("before the release"), std::string::npos) << e.message;
    auto q = cx.conn->read_request();
    EXPECT_EQ(q.r.op, TK_OP_RELEASE) << "the server is told in the background";
    EXPECT_EQ(q.r.token, 1u);
    EXPECT_EQ(tk_lock_release(a.lock, &e), TK_ERR_LOCK_LOST) << "again: the same answer";
    EXPECT_TRUE(cx.conn->quiet_for(150ms)) << "the server is told once";
    // the destructor path (tk_lock_drop, the C++ ~Lock) tells the server too
    tk_lock_drop(c.lock);
    c.lock = nullptr;
    auto qc = cx.conn->read_request();
    EXPECT_EQ(qc.r.op, TK_OP_RELEASE);
    EXPECT_EQ(qc.r.token, 3u);
    // lost to a NOT_HELD answer: nothing is left to release, nothing is sent
    auto ext = std::async(std::launch::async, [&] {
        tk_error xe;
        return tk_lock_extend(b.lock, 30000, &xe);
    });
    auto x = cx.conn->read_request();
    EXPECT_EQ(x.r.op, TK_OP_EXTEND);
    cx.conn->respond(x, TK_STATUS_NOT_HELD);
    EXPECT_EQ(ext.get(), TK_ERR_LOCK_LOST);
    EXPECT_EQ(tk_lock_release(b.lock, &e), TK_ERR_LOCK_LOST);
    EXPECT_EQ(e.reason, TK_LOST_NOT_HELD);
    EXPECT_TRUE(cx.conn->quiet_for(150ms)) << "no RELEASE after NOT_HELD";
}

// Close withdraws every queued acquire (CANCEL) before it closes, so that a closed client is never
// granted a lock it would hold until its session ends; the waiters fail "closed" at once; a grant
// that raced the withdrawal is released; close waits for those answers.
TEST(FakeEdges, CloseWithdrawsQueuedAcquires)
{
    FakeServer fs;
    Connected cx(fs);
    Reply w1, w2;
    uint64_t id1 = 0, id2 = 0;
    acquire_async(cx.c, "k", 30000, TK_WAIT_FOREVER, w1, &id1);
    auto q1 = cx.conn->read_request();
    acquire_async(cx.c, "j", 30000, TK_WAIT_FOREVER, w2, &id2);
    auto q2 = cx.conn->read_request();
    auto closing = std::async(std::launch::async, [&] {
        auto t0 = std::chrono::steady_clock::now();
        tk_client_close(cx.c);
        return std::chrono::steady_clock::now() - t0;
    });
    auto c1 = cx.conn->read_request();
    auto c2 = cx.conn->read_request();
    EXPECT_EQ(c1.r.op, TK_OP_CANCEL);
    EXPECT_EQ(c1.r.token, id1);
    EXPECT_EQ(c2.r.op, TK_OP_CANCEL);
    EXPECT_EQ(c2.r.token, id2);
    ASSERT_TRUE(w1.wait(2000ms) && w2.wait(2000ms)) << "the waiters fail at once";
    EXPECT_EQ(w1.code, TK_ERR_CLOSED) << w1.err.message;
    EXPECT_EQ(w2.code, TK_ERR_CLOSED);
    EXPECT_NE(std::string(w1.err.message).find("withdrawn"), std::string::npos) << w1.err.message;
    EXPECT_EQ(closing.wait_for(100ms), std::future_status::timeout) << "close waits for the withdrawals";
    cx.conn->respond(q1, TK_STATUS_CANCELLED);
    cx.conn->respond(c1, TK_STATUS_OK, 0, 0, 1);
    cx.conn->respond(q2, TK_STATUS_OK, 9, 30000); // granted before the CANCEL arrived
    cx.conn->respond(c2, TK_STATUS_OK);
    auto rel = cx.conn->read_request();
    EXPECT_EQ(rel.r.op, TK_OP_RELEASE);
    EXPECT_EQ(rel.r.token, 9u);
    EXPECT_EQ(rel.key, "j");
    cx.conn->respond(rel, TK_STATUS_OK);
    ASSERT_EQ(closing.wait_for(3000ms), std::future_status::ready);
    EXPECT_LT(closing.get(), 2000ms);
    EXPECT_EQ(w2.lock, nullptr) << "a closed client holds nothing";
    EXPECT_TRUE(cx.conn->closed_by_peer());
    tk_error e;
    EXPECT_EQ(tk_ping(cx.c, &e), TK_ERR_CLOSED);
}

TEST(FakeEdges, CloseIsBoundedWhenTheServerDoesNotAnswer)
{
    FakeServer fs;
    Connected cx(fs, [](tk_options &o) { o.cleanup_timeout_ms = 300; });
    Reply w;
    uint64_t id = 0;
    acquire_async(cx.c, "k", 30000, TK_WAIT_FOREVER, w, &id);
    cx.conn->read_request();
    auto t0 = std::chrono::steady_clock::now();
    tk_client_close(cx.c);
    auto took = std::chrono::steady_clock::now() - t0;
    EXPECT_GE(took, 250ms);
    EXPECT_LT(took, 1500ms);
    auto c = cx.conn->read_request();
    EXPECT_EQ(c.r.op, TK_OP_CANCEL);
    EXPECT_EQ(c.r.token, id);
    ASSERT_TRUE(w.wait(100ms));
    EXPECT_EQ(w.code, TK_ERR_CLOSED);
}

// The non-blocking context has no thread to wait with: close writes the CANCELs if the socket
// takes them, then closes.
TEST(FakeEdges, AsyncCloseWritesTheWithdrawals)
{
    FakeServer fs;
    tk_async *ac = new_async(fs.addr());
    AsyncReply conn;
    ASSERT_EQ(tk_async_connect(ac, AsyncReply::connected, &conn), TK_OK);
    std::unique_ptr<FakeConn> fc;
    std::thread t([&] {
        fc = fs.accept();
        fc->handshake(S1, false);
    });
    ASSERT_TRUE(pump(ac, [&] { return conn.done; }));
    t.join();
    ASSERT_EQ(conn.code, TK_OK) << conn.message;
    AsyncReply r;
    uint64_t id = 0;
    ASSERT_EQ(tk_async_acquire(ac, "k", 1, 30000, TK_WAIT_FOREVER, nullptr, AsyncReply::cb, &r, &id), TK_OK);
    ASSERT_TRUE(pump(ac, [&] { return !tk_async_want_write(ac); }));
    auto q = fc->read_request();
    EXPECT_EQ(q.r.id, id);
    tk_async_close(ac);
    EXPECT_TRUE(r.done);
    EXPECT_EQ(r.code, TK_ERR_CLOSED) << r.message;
    auto c = fc->read_request();
    EXPECT_EQ(c.r.op, TK_OP_CANCEL);
    EXPECT_EQ(c.r.token, id);
    tk_async_free(ac);
}

// docs/clients.md rule 1: after a restart (a new state id) only the requests in flight on the old
// state fail "server restarted"; a call made while the client was reconnecting never reached the
// old server: it goes to the new one.
TEST(FakeEdges, CallMadeWhileReconnectingGoesToTheRestartedServer)
{
    FakeServer fs;
    Connected cx(fs);
    Reply inflight;
    acquire_async(cx.c, "w", 30000, TK_WAIT_FOREVER, inflight);
    cx.conn->read_request();
    cx.conn->close(); // the server dies
    auto n = fs.accept(); // the client noticed and reconnects; the new server has not answered yet
    tk_error pe;
    auto ping = std::async(std::launch::async, [&] { return tk_ping(cx.c, &pe); });
    n->read_hello();
    n->send_challenge();
    n->read_auth();
    n->send_welcome(S2, false); // a new state id: the server restarted
    ASSERT_TRUE(inflight.wait());
    EXPECT_EQ(inflight.code, TK_ERR_SERVER_RESTARTED) << "it was in flight on the old state";
    auto n2 = fs.accept(); // the new session
    n2->handshake(S2, false);
    auto q = n2->read_request();
    EXPECT_EQ(q.r.op, TK_OP_PING);
    n2->respond(q, TK_STATUS_OK);
    EXPECT_EQ(ping.get(), TK_OK) << pe.message;
}

// An idle client's first call after its server closed the connection (a restart) is not written
// into the dead connection: it reaches the new server. (tk_async: the client has not read the
// close yet when the call is made.)
TEST(FakeEdges, IdleClientsFirstCallAfterARestartReachesTheNewServer)
{
    FakeServer fs;
    tk_async *ac = new_async(fs.addr(), [](tk_options &o) {
        o.backoff_min_ms = 10;
        o.backoff_max_ms = 50;
    });
    AsyncReply conn;
    ASSERT_EQ(tk_async_connect(ac, AsyncReply::connected, &conn), TK_OK);
    std::unique_ptr<FakeConn> fc;
    std::thread t([&] {
        fc = fs.accept();
        fc->handshake(S1, false);
    });
    ASSERT_TRUE(pump(ac, [&] { return conn.done; }));
    t.join();
    fc->close(); // killed; the context has not looked at its socket since
    std::this_thread::sleep_for(20ms);
    AsyncReply r;
    ASSERT_EQ(tk_async_ping(ac, AsyncReply::cb, &r), TK_OK);
    std::atomic<bool> served{false};
    std::thread server([&] {
        try {
            auto n = fs.accept();
            n->handshake(S2, false); // restarted: a new state id
            auto n2 = fs.accept();
            n2->handshake(S2, false);
            auto q = n2->read_request();
            if (q.r.op == TK_OP_PING)
                n2->respond(q, TK_STATUS_OK);
            served = true;
            n2->quiet_for(200ms);
        } catch (const std::exception &) {
        }
    });
    EXPECT_TRUE(pump(ac, [&] { return r.done; }, 5000ms));
    server.join();
    EXPECT_EQ(r.code, TK_OK) << r.message;
    EXPECT_TRUE(served);
    tk_async_free(ac);
}

// docs/clients.md, the heartbeat: while a request waits, a PING goes after 250 ms of silence; one
// unanswered within min(heartbeat, 750 ms) replaces the connection without failing the call, and
// the node just left is not dialled first (a frozen leader is left about 1 s after it froze).
TEST(FakeEdges, SilentNodeIsReplacedAndTriedLast)
{
    FakeServer fs1, fs2;
    Connected cx(fs1, [](tk_options &o) { o.heartbeat_ms = 2000; }, S1, 5000, {fs1.addr(), fs2.addr()});
    Reply r;
    acquire_async(cx.c, "k", 30000, TK_WAIT_FOREVER, r);
    auto q = cx.conn->read_request();
    auto t0 = std::chrono::steady_clock::now();
    auto p = cx.conn->read_request(3000ms);
    EXPECT_EQ(p.r.op, TK_OP_PING);
    auto ping_at = std::chrono::steady_clock::now();
    EXPECT_LT(ping_at - t0, 1000ms) << "a waiting request shortens the heartbeat to 250 ms";
    // never answered
    EXPECT_TRUE(cx.conn->closed_by_peer(3000ms));
    auto gone_at = std::chrono::steady_clock::now();
    EXPECT_GE(gone_at - ping_at, 600ms);
    EXPECT_LT(gone_at - ping_at, 1800ms) << "a PING waits min(heartbeat, 750 ms)";
    auto n = fs2.accept(3000ms); // the next node first
    tk_hello h = n->handshake(S1, true);
    EXPECT_EQ(memcmp(h.session_id, cx.hello.session_id, 16), 0);
    auto rq = n->read_request();
    EXPECT_EQ(rq.r.op, TK_OP_ACQUIRE);
    EXPECT_EQ(rq.r.id, q.r.id) << "re-sent on resume";
    EXPECT_FALSE(r.is_done()) << "the call in flight was not failed";
    n->respond(rq, TK_STATUS_OK, 4, 30000);
    ASSERT_TRUE(r.wait());
    EXPECT_EQ(r.code, TK_OK) << r.err.message;
    EXPECT_THROW(fs1.accept(100ms), std::runtime_error) << "the silent node was not dialled first";
}

// docs/clients.md, rule 1: the other nodes keep naming a frozen leader until they elect another
// one; for 2 s the client follows no hint to the node it just found silent (it would accept TCP
// and cost the handshake wait) and goes on to the next endpoint.
TEST(FakeEdges, SilentNodeIsNotFollowedAsAHint)
{
    FakeServer fs1, fs2, fs3;
    Connected cx(fs1, [](tk_options &o) { o.heartbeat_ms = 2000; }, S1, 5000, {fs1.addr(), fs2.addr(), fs3.addr()});
    Reply r;
    acquire_async(cx.c, "k", 30000, TK_WAIT_FOREVER, r);
    auto q = cx.conn->read_request();
    auto p = cx.conn->read_request(3000ms);
    EXPECT_EQ(p.r.op, TK_OP_PING); // never answered
    EXPECT_TRUE(cx.conn->closed_by_peer(3000ms));
    auto n2 = fs2.accept(3000ms);
    n2->read_hello();
    n2->send_challenge(TK_STATUS_NOT_LEADER, 0, fs1.addr()); // names the silent node
    auto hinted = std::chrono::steady_clock::now();
    auto n3 = fs3.accept(3000ms);
    EXPECT_LT(std::chrono::steady_clock::now() - hinted, 1500ms) << "no handshake wait on the silent node first";
    tk_hello h = n3->handshake(S1, true);
    EXPECT_EQ(memcmp(h.session_id, cx.hello.session_id, 16), 0);
    auto rq = n3->read_request();
    EXPECT_EQ(rq.r.op, TK_OP_ACQUIRE);
    EXPECT_EQ(rq.r.id, q.r.id) << "re-sent on resume";
    n3->respond(rq, TK_STATUS_OK, 3, 30000);
    ASSERT_TRUE(r.wait());
    EXPECT_EQ(r.code, TK_OK) << r.err.message;
    EXPECT_THROW(fs1.accept(100ms), std::runtime_error) << "the hint to the silent node was not followed";
}

// docs/clients.md, the connect timeout: once TCP is connected, the handshake gets 2 s (a frozen
// node's kernel still accepts connections), not the whole dial timeout.
TEST(FakeEdges, HandshakeGetsTwoSecondsAfterTcp)
{
    FakeServer silent;
    const std::string addr = silent.addr();
    const char *eps[] = {addr.c_str()};
    tk_options o{};
    o.endpoints = eps;
    o.n_endpoints = 1;
    o.dial_timeout_ms = 10000;
    tk_client *c = nullptr;
    tk_error e;
    auto start = std::chrono::steady_clock::now();
    tk_err rc = tk_client_connect(&o, &c, &e);
    auto took = std::chrono::steady_clock::now() - start;
    EXPECT_EQ(rc, TK_ERR_UNAVAILABLE) << e.message;
    EXPECT_NE(std::string(e.message).find("within 2000 ms of the TCP connection"), std::string::npos) << e.message;
    EXPECT_GE(took, 1900ms);
    EXPECT_LT(took, 5000ms);
}

// A TIMED_OUT that carries the server's reason (its start-up wait) says so.
TEST(FakeEdges, TimedOutWithTheServersReasonShowsIt)
{
    FakeServer fs;
    Connected cx(fs);
    Reply r, plain;
    acquire_async(cx.c, "k", 30000, 300, r);
    auto q = cx.conn->read_request();
    cx.conn->respond(q, TK_STATUS_TIMED_OUT, 0, 0, 0,
                     "the server is in its start-up wait: no grant for 2700 ms more\n(leases granted before its restart may still run)");
    ASSERT_TRUE(r.wait());
    EXPECT_EQ(r.code, TK_ERR_NOT_ACQUIRED);
    std::string m = r.err.message;
    EXPECT_NE(m.find("\"k\""), std::string::npos) << m;
    EXPECT_NE(m.find("start-up wait"), std::string::npos) << m;
    EXPECT_EQ(m.find('\n'), std::string::npos) << "one line: " << m;
    acquire_async(cx.c, "k", 30000, 300, plain);
    cx.conn->respond(cx.conn->read_request(), TK_STATUS_TIMED_OUT);
    ASSERT_TRUE(plain.wait());
    EXPECT_EQ(std::string(plain.err.message), "not acquired: \"k\" still held after waiting 300 ms");
}
