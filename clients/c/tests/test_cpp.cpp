// The C++17 wrapper against the real server: RAII locks, exceptions, std::chrono, Lockable.
#include <atomic>
#include <mutex>
#include <shared_mutex>

#include <gtest/gtest.h>

#include "support.h"
#include "ticketing/ticketing.hpp"

using namespace std::chrono_literals;
namespace tk = ticketing;

namespace {
tk::Options opts(const tt::Server &s)
{
    tk::Options o;
    o.endpoints = {s.addr()};
    return o;
}
} // namespace

TEST(Cpp, LockIsReleasedByItsDestructor)
{
    tt::Server s;
    tt::Raw r(s.addr());
    tk::Client c(opts(s));
    uint64_t t = 0;
    {
        tk::Lock l = c.acquire("k", 30s);
        t = l.token();
        EXPECT_GT(t, 0u);
        EXPECT_EQ(l.key(), "k");
        EXPECT_EQ(l.lease(), 30s);
        EXPECT_FALSE(l.lost());
        EXPECT_TRUE(r.inspect("k").held);
        tk::Lock moved = std::move(l); // move-only
        EXPECT_FALSE(l);
        EXPECT_EQ(moved.token(), t);
    }
    ASSERT_TRUE(tt::wait_until([&] { return !r.inspect("k").held; })) << "released in the background";
    EXPECT_GT(r.acquire("k", 1000), t);
}

TEST(Cpp, ErrorsAreTypedExceptions)
{
    tt::Server s;
    tt::Raw r(s.addr());
    tk::Client c(opts(s));
    uint64_t rt = r.acquire("k", 30000);
    tk::AcquireOptions wait300;
    wait300.wait = 300ms;
    EXPECT_THROW(c.acquire("k", 1s, wait300), tk::NotAcquired);
    EXPECT_FALSE(c.try_acquire("k", 1s).has_value()) << "not acquired is a value";
    EXPECT_THROW(c.acquire("", 1s), tk::InvalidArgument);
    EXPECT_THROW(c.acquire("k", 0ms), tk::InvalidArgument);
    EXPECT_THROW(c.acquire("k", -5ms), tk::InvalidArgument);
    tk::AcquireOptions negative;
    negative.wait = -5ms;
    EXPECT_THROW(c.acquire("k", 1s, negative), tk::InvalidArgument);
    EXPECT_THROW(c.release("k", rt + 100), tk::NotHeld);
    EXPECT_THROW(c.release("k", 0), tk::InvalidArgument);
    try {
        c.acquire("k", 1s, wait300);
        FAIL() << "expected NotAcquired";
    } catch (const tk::Error &e) {
        EXPECT_EQ(e.code(), TK_ERR_NOT_ACQUIRED);
        EXPECT_STREQ(e.kind(), "not_acquired");
        EXPECT_NE(std::string(e.what()).find("\"k\""), std::string::npos) << e.what();
    }
    tk::Options bad = opts(s);
    bad.token = "nope";
    EXPECT_THROW(tk::Client x(bad), tk::AuthFailed);
    tk::Options none;
    {
        tt::FakeServer gone;
        none.endpoints = {gone.addr()};
    }
    EXPECT_THROW(tk::Client x(none), tk::Unavailable);
}

TEST(Cpp, MutexWorksWithStandardLocks)
{
    tt::Server s;
    tt::Raw r(s.addr());
    tk::Client c(opts(s));
    tk::Mutex m(c, "resource", 10s);
    {
        std::lock_guard<tk::Mutex> g(m);
        EXPECT_GT(m.token(), 0u);
        EXPECT_TRUE(r.inspect("resource").held);
    }
    EXPECT_FALSE(r.inspect("resource").held);
    {
        std::unique_lock<tk::Mutex> ul(m, std::try_to_lock);
        EXPECT_TRUE(ul.owns_lock());
        tk::Mutex other(c, "resource", 10s);
        EXPECT_FALSE(other.try_lock()) << "held (by the same client: the owner is the token)";
        EXPECT_FALSE(other.try_lock_for(100ms));
        ul.unlock();
        EXPECT_TRUE(other.try_lock_for(1s));
        other.unlock();
    }
    std::unique_lock<tk::Mutex> timed(m, 500ms); // TimedLockable
    EXPECT_TRUE(timed.owns_lock());
}

TEST(Cpp, WithLockReportsALostLock)
{
    tt::Server s;
    tt::Raw r(s.addr());
    tk::Client c(opts(s));
    int ran = c.with_lock("k", 2s, [&](tk::Lock &l) {
        EXPECT_GT(l.token(), 0u);
        return 42;
    });
    EXPECT_EQ(ran, 42);
    EXPECT_FALSE(r.inspect("k").held);
    try {
        c.with_lock("k", 300ms, [] { std::this_thread::sleep_for(900ms); }); // outlives its lease
        FAIL() << "expected LockLost";
    } catch (const tk::LockLost &e) {
        EXPECT_EQ(e.reason(), tk::LostReason::Expired);
        EXPECT_STREQ(e.kind(), "lock_lost");
    }
    // the documented opt-out
    EXPECT_NO_THROW(c.with_lock("k", 100ms, [] { std::this_thread::sleep_for(300ms); }, {}, false));
}

TEST(Cpp, AsyncAcquireCanBeCancelled)
{
    tt::Server s;
    tt::Raw r(s.addr());
    uint64_t rt = r.acquire("k", 30000);
    tk::Client c(opts(s));
    tk::PendingAcquire p = c.acquire_async("k", 10s);
    ASSERT_TRUE(tt::wait_until([&] { return r.inspect("k").waiters == 1; }));
    EXPECT_FALSE(p.wait_for(50ms));
    EXPECT_TRUE(p.cancel());
    EXPECT_THROW(p.get(), tk::Cancelled);
    EXPECT_EQ(r.inspect("k").waiters, 0u);
    r.release("k", rt);
    tk::PendingAcquire q = c.acquire_async("k", 10s);
    tk::Lock l = q.get();
    EXPECT_GT(l.token(), rt);
    EXPECT_FALSE(q.cancel()) << "already granted";
}

TEST(Cpp, LostCallbackAndExtend)
{
    tt::Server s;
    tk::Client c(opts(s));
    std::atomic<int> calls{0};
    std::atomic<int> reason{-1};
    tk::AcquireOptions o;
    o.on_lost = [&](tk::LostReason why) {
        calls++;
        reason = static_cast<int>(why);
    };
    tk::Lock l = c.acquire("k", 300ms, o);
    EXPECT_EQ(l.extend(1s), 1s);
    EXPECT_TRUE(l.verify());
    c.release("k", l.token()); // by token, from the same client
    EXPECT_FALSE(l.verify());
    EXPECT_TRUE(tt::stays([&] { return calls == 0; }, 100ms)) << "a release by token is not a loss";
    tk::Lock l2 = c.acquire("k2", 200ms, o);
    ASSERT_TRUE(tt::wait_until([&] { return calls == 1; }, 2000ms));
    EXPECT_EQ(reason.load(), static_cast<int>(tk::LostReason::Expired));
    ASSERT_TRUE(l2.lost());
    EXPECT_EQ(*l2.lost(), tk::LostReason::Expired);
    EXPECT_THROW(l2.release(), tk::LockLost);
    EXPECT_THROW(l2.extend(1s), tk::LockLost);
}

TEST(Cpp, InspectPingSessionAndClose)
{
    tt::Server s;
    tk::Client c(opts(s));
    c.ping();
    auto sid = c.session_id();
    EXPECT_NE(sid, (std::array<uint8_t, 16>{}));
    tk::Lock l = c.acquire("k", 5s);
    tk::KeyInfo k = c.inspect("k");
    EXPECT_TRUE(k.held);
    EXPECT_TRUE(k.session);
    EXPECT_EQ(k.token, l.token());
    EXPECT_GT(k.lease_left, 4s);
    EXPECT_EQ(c.extend("k", l.token(), 6s), 6s);
    c.close();
    EXPECT_THROW(c.ping(), tk::Closed);
    EXPECT_THROW(l.release(), tk::Closed);
    tk::Client moved = std::move(c); // a closed client moves too
    EXPECT_THROW(moved.ping(), tk::Closed);
}

// The RAII side of issue 26: a lost lock's release() throws LockLost at once (the server frozen),
// close() withdraws a queued acquire_async (get() throws Closed), INSPECT shows STARTUP.
TEST(Cpp, LostReleaseIsImmediateAndCloseWithdrawsWaiters)
{
    tt::Server s;
    tt::Raw r(s.addr());
    {
        tk::Client c(opts(s));
        tk::Lock l = c.acquire("k", 300ms);
        ASSERT_TRUE(tt::wait_until([&] { return l.lost().has_value(); }, 2000ms));
        s.pause();
        auto t0 = std::chrono::steady_clock::now();
        EXPECT_THROW(l.release(), tk::LockLost);
        EXPECT_LT(std::chrono::steady_clock::now() - t0, 1000ms);
        s.resume();
    }
    uint64_t t = r.acquire("q", 30000);
    ASSERT_GT(t, 0u);
    tk::Client c(opts(s));
    tk::PendingAcquire p = c.acquire_async("q", 10s);
    ASSERT_TRUE(tt::wait_until([&] { return r.inspect("q").waiters == 1; }));
    c.close();
    ASSERT_TRUE(p.wait_for(100ms));
    EXPECT_THROW(p.get(), tk::Closed);
    EXPECT_EQ(r.inspect("q").waiters, 0u);
}

TEST(Cpp, InspectShowsTheStartupWait)
{
    tt::Server s(tt::Env{{"TICKETING_STARTUP_GRACE", "3s"}});
    tk::Client c(opts(s));
    tk::KeyInfo k = c.inspect("k");
    EXPECT_TRUE(k.startup);
    EXPECT_TRUE(k.has(tk::InspectFlag::Startup));
    EXPECT_FALSE(k.stalled);
    EXPECT_GT(k.lock_delay, 0ms);
    tk::AcquireOptions o;
    o.wait = 300ms;
    try {
        c.acquire("k", 5s, o);
        FAIL() << "expected NotAcquired";
    } catch (const tk::NotAcquired &e) {
        EXPECT_NE(std::string(e.what()).find("start-up wait"), std::string::npos) << e.what();
    }
}
