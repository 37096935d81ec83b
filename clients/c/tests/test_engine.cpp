// Unit tests of the engine's pure parts: the lost deadline, the clock, the timer heap, key formatting,
// argument checks, endpoint parsing, error names, and option validation.
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>

#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

extern "C" {
#include "internal.h"
}

TEST(Deadline, FollowsTheProtocolFormula)
{
    // deadline = t_first + (detail + lease) * (1 - 2 * 0.001)
    EXPECT_EQ(tk__deadline_us(0, 0, 1000), 998000);
    EXPECT_EQ(tk__deadline_us(5000000, 1500, 1), 5000000 + 1501 * 998);
    EXPECT_EQ(tk__deadline_us(0, 0, 30000), 29940000);
    // the largest values do not overflow
    EXPECT_EQ(tk__deadline_us(0, UINT32_MAX, UINT32_MAX), int64_t((uint64_t(UINT32_MAX) * 2) * 998));
}

TEST(Deadline, MarginIsFiveMsOrATenthOfTheLease)
{
    EXPECT_EQ(tk__lost_margin_us(30000), 5000);
    EXPECT_EQ(tk__lost_margin_us(50), 5000);
    EXPECT_EQ(tk__lost_margin_us(40), 4000);
    EXPECT_EQ(tk__lost_margin_us(1), 100);
}

// The fallback clock (no CLOCK_BOOTTIME): each interval between two looks counts as the larger
// of the monotonic clock's and the wall clock's advance.
TEST(Clock, FallbackCountsTheWallClocksLargerAdvance)
{
    tk_clock_pair last{};
    EXPECT_EQ(tk__clock_missed_us(&last, 10000000, 100000000), 0) << "the first look has nothing to compare";
    EXPECT_EQ(tk__clock_missed_us(&last, 11000000, 101000000), 0) << "both advanced alike";
    // a 30 s suspend: the monotonic clock advanced 1 s, the wall clock 31 s
    EXPECT_EQ(tk__clock_missed_us(&last, 12000000, 132000000), 30000000);
    EXPECT_EQ(tk__clock_missed_us(&last, 12500000, 132400000), 0) << "a slower wall clock adds nothing";
}

TEST(Clock, FallbackIgnoresAWallClockSteppedBack)
{
    tk_clock_pair last{};
    tk__clock_missed_us(&last, 10000000, 100000000);
    EXPECT_EQ(tk__clock_missed_us(&last, 11000000, 40000000), 0) << "stepped back 61 s";
    // the next interval counts from the stepped-back reading, not from the one before it
    EXPECT_EQ(tk__clock_missed_us(&last, 12000000, 41000000), 0);
    EXPECT_EQ(tk__clock_missed_us(&last, 13000000, 47000000), 5000000);
}

// The engine's clock is CLOCK_BOOTTIME on Linux: in a time namespace whose boottime runs
// 100,000 s ahead of its monotonic clock (what a long suspend looks like), tk__now_us agrees with
// /proc/uptime, not with the monotonic clock. The test runs itself again in such a namespace.
TEST(Clock, IsBoottime)
{
    if (getenv("TICKETING_CLOCK_CHILD")) {
        double uptime = 0;
        FILE *f = fopen("/proc/uptime", "r");
        ASSERT_NE(f, nullptr);
        ASSERT_EQ(fscanf(f, "%lf", &uptime), 1);
        fclose(f);
        double now = double(tk__now_us()) / 1e6;
        EXPECT_GT(uptime, 100000.0) << "not in the namespace";
        EXPECT_NEAR(now, uptime, 1.0) << "tk__now_us is not CLOCK_BOOTTIME";
        return;
    }
    if (system("unshare --time --fork --boottime 100000 true > /dev/null 2>&1") != 0)
        GTEST_SKIP() << "unshare --time is refused here (needs root and time namespaces): the clock source is not checked";
    char self[4096];
    ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
    ASSERT_GT(n, 0);
    self[n] = '\0';
    std::string cmd = std::string("TICKETING_CLOCK_CHILD=1 unshare --time --fork --boottime 100000 '") + self +
                      "' --gtest_filter=Clock.IsBoottime 2>&1";
    FILE *p = popen(cmd.c_str(), "r");
    ASSERT_NE(p, nullptr);
    std::string out;
    char buf[512];
    while (fgets(buf, sizeof buf, p))
        out += buf;
    int status = pclose(p);
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << out;
}

// pop_all_in_order takes every armed timer off h, checking they come out in deadline order and
// end disarmed; it returns how many there were.
static size_t pop_all_in_order(tk_heap *h)
{
    int64_t last = -1;
    size_t n = 0;
    while (tk_timer *top = tk__heap_top(h)) {
        EXPECT_GE(top->at, last);
        last = top->at;
        tk__heap_del(h, top);
        EXPECT_FALSE(tk__timer_armed(top));
        n++;
    }
    return n;
}

TEST(Heap, PopsInOrderAfterRandomSetsAndDeletes)
{
    tk_heap h{};
    std::vector<tk_timer> t(200);
    std::mt19937 rng(7);
    for (auto &x : t) {
        tk__timer_init(&x, 1);
        ASSERT_EQ(tk__heap_set(&h, &x, rng() % 1000), 0);
    }
    for (int i = 0; i < 100; i++) {
        tk__heap_set(&h, &t[rng() % t.size()], rng() % 1000); // move
        tk__heap_del(&h, &t[rng() % t.size()]);              // delete (maybe twice)
    }
    size_t n = pop_all_in_order(&h);
    EXPECT_GT(n, 100u);
    tk__heap_free(&h);
}

// Kinds with a sorted lane (request deadlines, lost signals) next to heap-only kinds: mostly
// increasing deadlines (the lanes' case) mixed with earlier ones, moves and deletes; the timers
// still come out in deadline order and end disarmed.
TEST(Heap, LanesAndHeapPopInOrder)
{
    tk_heap h{};
    std::vector<tk_timer> t(600);
    std::mt19937 rng(11);
    const uint8_t kinds[] = {TK__T_REQ_DEADLINE, TK__T_REQ_CLEANUP, TK__T_LOCK_LOST, TK__T_LOCK_KEEPALIVE};
    int64_t clock = 0;
    for (size_t i = 0; i < t.size(); i++) {
        tk__timer_init(&t[i], kinds[i % 4]);
        clock += rng() % 10;
        int64_t at = rng() % 5 == 0 ? int64_t(rng() % 3000) : clock + 1000; // some out of order
        ASSERT_EQ(tk__heap_set(&h, &t[i], at), 0);
        EXPECT_TRUE(tk__timer_armed(&t[i]));
        if (i % 7 == 3)
            tk__heap_del(&h, &t[rng() % (i + 1)]);
        if (i % 11 == 5)
            tk__heap_set(&h, &t[rng() % (i + 1)], rng() % 4000); // move, or arm again
    }
    size_t armed = 0;
    for (auto &x : t)
        armed += tk__timer_armed(&x);
    size_t n = pop_all_in_order(&h);
    EXPECT_EQ(n, armed);
    for (auto &x : t)
        EXPECT_FALSE(tk__timer_armed(&x));
    // tk__heap_free disarms what is left, in the lanes too
    for (size_t i = 0; i < 50; i++)
        ASSERT_EQ(tk__heap_set(&h, &t[i], int64_t(i % 2 ? i : 100 - i)), 0);
    tk__heap_free(&h);
    for (size_t i = 0; i < 50; i++)
        EXPECT_FALSE(tk__timer_armed(&t[i]));
}

TEST(Buf, AppendConsumeCompact)
{
    tk_buf b{};
    std::string all;
    for (int i = 0; i < 1000; i++) {
        std::string s = std::to_string(i) + ",";
        ASSERT_EQ(tk__buf_append(&b, s.data(), s.size()), 0);
        all += s;
        if (i % 3 == 0) {
            size_t n = std::min<size_t>(5, tk__buf_size(&b));
            ASSERT_EQ(std::string(reinterpret_cast<char *>(tk__buf_data(&b)), n), all.substr(0, n));
            tk__buf_consume(&b, n);
            all.erase(0, n);
        }
    }
    EXPECT_EQ(std::string(reinterpret_cast<char *>(tk__buf_data(&b)), tk__buf_size(&b)), all);
    tk__buf_free(&b);
}

TEST(Format, KeysAsTextOrHex)
{
    char out[128];
    tk__fmt_key(out, sizeof out, reinterpret_cast<const uint8_t *>("order-1234"), 10);
    EXPECT_STREQ(out, "\"order-1234\"");
    const uint8_t bin[] = {0x00, 0xff, 0x10, 0xc3, 0xbc};
    tk__fmt_key(out, sizeof out, bin, sizeof bin);
    EXPECT_STREQ(out, "0x00ff10c3bc");
    const char *utf = "k\xc3\xbcsse"; // valid UTF-8
    tk__fmt_key(out, sizeof out, reinterpret_cast<const uint8_t *>(utf), strlen(utf));
    EXPECT_STREQ(out, "\"k\xc3\xbcsse\"");
    std::string longkey(500, 'a');
    tk__fmt_key(out, sizeof out, reinterpret_cast<const uint8_t *>(longkey.data()), longkey.size());
    EXPECT_LT(strlen(out), sizeof out);
    // cut to 64 bytes, with the key's length (as the Go client does): never the whole key
    EXPECT_EQ(std::string(out), "\"" + std::string(64, 'a') + "\"...(500 bytes)");
    std::string longbin(300, '\x01');
    tk__fmt_key(out, sizeof out, reinterpret_cast<const uint8_t *>(longbin.data()), longbin.size());
    std::string hexcut = "0x";
    for (int i = 0; i < 32; i++)
        hexcut += "01";
    EXPECT_EQ(std::string(out), hexcut + "...(300 bytes)");
    std::string exact(64, 'b'); // 64 bytes: shown whole
    tk__fmt_key(out, sizeof out, reinterpret_cast<const uint8_t *>(exact.data()), exact.size());
    EXPECT_EQ(std::string(out), "\"" + exact + "\"");
    tk__fmt_key(out, 4, bin, sizeof bin); // tiny buffers stay terminated
    EXPECT_EQ(out[0], '\0');
}

TEST(Checks, KeysLeasesAndWaits)
{
    tk_error e;
    EXPECT_EQ(tk__check_key("k", 1, &e), TK_OK);
    EXPECT_EQ(tk__check_key("", 0, &e), TK_ERR_INVALID_ARGUMENT);
    EXPECT_NE(std::string(e.message).find("empty"), std::string::npos);
    EXPECT_EQ(tk__check_key(nullptr, 3, &e), TK_ERR_INVALID_ARGUMENT);
    std::string big(TK_MAX_KEY_LEN + 1, 'x');
    EXPECT_EQ(tk__check_key(big.data(), big.size(), &e), TK_ERR_INVALID_ARGUMENT);
    EXPECT_EQ(tk__check_key(big.data(), TK_MAX_KEY_LEN, &e), TK_OK);

    EXPECT_EQ(tk__check_lease(1, "lease", &e), TK_OK);
    EXPECT_EQ(tk__check_lease(UINT32_MAX, "lease", &e), TK_OK);
    EXPECT_EQ(tk__check_lease(0, "lease", &e), TK_ERR_INVALID_ARGUMENT);
    EXPECT_NE(std::string(e.message).find("milliseconds"), std::string::npos) << "names the unit";
    EXPECT_EQ(tk__check_lease(-5, "lease", &e), TK_ERR_INVALID_ARGUMENT);
    EXPECT_EQ(tk__check_lease(int64_t(UINT32_MAX) + 1, "lease", &e), TK_ERR_INVALID_ARGUMENT);

    EXPECT_EQ(tk__check_wait(0, &e), TK_OK);
    EXPECT_EQ(tk__check_wait(TK_WAIT_FOREVER, &e), TK_OK);
    EXPECT_EQ(tk__check_wait(-5, &e), TK_ERR_INVALID_ARGUMENT);
    EXPECT_EQ(tk__check_wait(TK_WAIT_FOREVER + 1, &e), TK_ERR_INVALID_ARGUMENT);
}

TEST(Endpoints, HostPortParsing)
{
    char h[256], p[8];
    EXPECT_EQ(tk__split_hostport("127.0.0.1:7070", h, sizeof h, p, sizeof p), 0);
    EXPECT_STREQ(h, "127.0.0.1");
    EXPECT_STREQ(p, "7070");
    EXPECT_EQ(tk__split_hostport("[::1]:80", h, sizeof h, p, sizeof p), 0);
    EXPECT_STREQ(h, "::1");
    EXPECT_EQ(tk__split_hostport("localhost:1", h, sizeof h, p, sizeof p), 0);
    for (const char *bad : {"", ":80", "host", "host:", "host:0", "host:65536", "host:8x", "::1:80", "[::1]80", "[]:1"})
        EXPECT_EQ(tk__split_hostport(bad, h, sizeof h, p, sizeof p), -1) << bad;
}

TEST(Errors, NamesAndKinds)
{
    EXPECT_STREQ(tk_err_kind(TK_ERR_NOT_ACQUIRED), "not_acquired");
    EXPECT_STREQ(tk_err_kind(TK_ERR_LOCK_LOST), "lock_lost");
    EXPECT_STREQ(tk_err_kind(TK_ERR_TLS), "tls");
    EXPECT_STREQ(tk_err_kind(TK_ERR_PROTOCOL), "other");
    EXPECT_STREQ(tk_strerror(TK_ERR_CONNECTION_LOST), "connection lost");
    EXPECT_STREQ(tk_lost_reason_str(TK_LOST_SERVER_RESTARTED), "server restarted");
    EXPECT_STREQ(tk_lost_reason_str(TK_LOST_NOT_HELD), "not held");
    for (int c = TK_OK; c <= TK_ERR_NO_MEMORY; c++) {
        EXPECT_STRNE(tk_strerror(static_cast<tk_err>(c)), "unknown error") << c;
        EXPECT_NE(tk_err_kind(static_cast<tk_err>(c)), nullptr);
    }
}

TEST(Options, BadOptionsAreRejectedWithoutConnecting)
{
    tk_error e;
    const char *bad[] = {"nohost"};
    tk_options o{};
    o.endpoints = bad;
    o.n_endpoints = 1;
    EXPECT_EQ(tk_async_new(&o, &e), nullptr);
    EXPECT_EQ(e.code, TK_ERR_INVALID_ARGUMENT);
    EXPECT_NE(std::string(e.message).find("nohost"), std::string::npos);

    tk_options o2{};
    o2.n_endpoints = 2; // without endpoints
    EXPECT_EQ(tk_async_new(&o2, &e), nullptr);
    tk_options o3{};
    o3.request_timeout_ms = -1;
    EXPECT_EQ(tk_async_new(&o3, &e), nullptr);
    tk_options o4{};
    o4.tls = 1;
    o4.tls_ca_file = "/nonexistent/ca.pem";
    EXPECT_EQ(tk_async_new(&o4, &e), nullptr);
    EXPECT_EQ(e.code, TK_ERR_TLS);
    tk_options o5{};
    o5.tls = 1;
    o5.tls_cert_file = "/nonexistent/cert.pem"; // without a key
    EXPECT_EQ(tk_async_new(&o5, &e), nullptr);
    EXPECT_EQ(e.code, TK_ERR_INVALID_ARGUMENT);

    tk_client *c = nullptr;
    EXPECT_EQ(tk_client_connect(&o, &c, &e), TK_ERR_INVALID_ARGUMENT);
    EXPECT_EQ(c, nullptr);
}

TEST(Options, SessionIdsAreRandomAndNonZero)
{
    tk_async *a = tk_async_new(nullptr, nullptr);
    tk_async *b = tk_async_new(nullptr, nullptr);
    ASSERT_NE(a, nullptr);
    ASSERT_NE(b, nullptr);
    uint8_t sa[16], sb[16], zero[16] = {0};
    tk_async_session_id(a, sa);
    tk_async_session_id(b, sb);
    EXPECT_NE(memcmp(sa, zero, 16), 0);
    EXPECT_NE(memcmp(sa, sb, 16), 0);
    tk_async_free(a);
    tk_async_free(b);
}

TEST(Options, NullArgumentsNeverCrash)
{
    tk_error e;
    EXPECT_EQ(tk_acquire(nullptr, "k", 1, 100, 0, nullptr, nullptr, &e), TK_ERR_INVALID_ARGUMENT);
    tk_lock *l = nullptr;
    EXPECT_EQ(tk_acquire(nullptr, "k", 1, 100, 0, nullptr, &l, &e), TK_ERR_INVALID_ARGUMENT);
    EXPECT_EQ(tk_ping(nullptr, &e), TK_ERR_INVALID_ARGUMENT);
    EXPECT_EQ(tk_lock_release(nullptr, &e), TK_ERR_INVALID_ARGUMENT);
    EXPECT_EQ(tk_lock_token(nullptr), 0u);
    EXPECT_EQ(tk_lock_lost(nullptr), TK_LOST_NONE);
    EXPECT_EQ(tk_async_fd(nullptr), -1);
    EXPECT_EQ(tk_async_timeout_ms(nullptr), -1);
    EXPECT_EQ(tk_async_process(nullptr, 0), TK_ERR_INVALID_ARGUMENT);
    tk_lock_free(nullptr);
    tk_lock_drop(nullptr);
    tk_client_close(nullptr);
    tk_client_free(nullptr);
    tk_async_free(nullptr);
}

static void noop_reply(tk_async *, const tk_reply *, void *) {}

// The process id is read once per process: a context made before fork() refuses every call in
// the child, one made in the child works there, and a grandchild refuses that one in turn.
TEST(Fork, CachedProcessIdFollowsEveryFork)
{
    tk_async *ac = tk_async_new(nullptr, nullptr);
    ASSERT_NE(ac, nullptr);
    ASSERT_EQ(tk_async_ping(ac, noop_reply, nullptr), TK_OK);
    pid_t pid = fork();
    if (pid == 0) {
        int code = 0;
        if (tk_async_ping(ac, noop_reply, nullptr) != TK_ERR_FORKED)
            code |= 1;
        tk_async *mine = tk_async_new(nullptr, nullptr);
        if (!mine || tk_async_ping(mine, noop_reply, nullptr) != TK_OK)
            code |= 2;
        pid_t g = fork();
        if (g == 0) {
            int gc = 0;
            if (tk_async_ping(mine, noop_reply, nullptr) != TK_ERR_FORKED)
                gc |= 1;
            if (tk_async_ping(ac, noop_reply, nullptr) != TK_ERR_FORKED)
                gc |= 2;
            _exit(gc);
        }
        int st = 0;
        if (g < 0 || waitpid(g, &st, 0) != g || !WIFEXITED(st) || WEXITSTATUS(st) != 0)
            code |= 4;
        if (tk_async_ping(mine, noop_reply, nullptr) != TK_OK) // still this process's
            code |= 8;
        _exit(code);
    }
    ASSERT_GT(pid, 0);
    int st = 0;
    ASSERT_EQ(waitpid(pid, &st, 0), pid);
    ASSERT_TRUE(WIFEXITED(st));
    EXPECT_EQ(WEXITSTATUS(st), 0);
    EXPECT_EQ(tk_async_ping(ac, noop_reply, nullptr), TK_OK) << "the parent's context is untouched";
    tk_async_free(ac);
}
