// The C++ wrapper under C++20: acquire with a std::stop_token, against the real server.
// ticketing.hpp comes first: it must find <stop_token> by itself.
#include "ticketing/ticketing.hpp"

#include <atomic>
#include <optional>
#include <thread>
#include <version>

#include <gtest/gtest.h>

#include "support.h"

#if defined(__cpp_lib_jthread) && !TICKETING_HAS_STOP_TOKEN
#error "the standard library has std::jthread, but ticketing.hpp did not enable its std::stop_token overloads"
#endif

using namespace std::chrono_literals;
namespace tk = ticketing;

#if TICKETING_HAS_STOP_TOKEN
namespace {
tk::Options opts(const tt::Server &s)
{
    tk::Options o;
    o.endpoints = {s.addr()};
    return o;
}
using Clock = std::chrono::steady_clock;
} // namespace

TEST(Cpp20, RequestStopWithdrawsTheWaitingAcquire)
{
    tt::Server s;
    tt::Raw r(s.addr());
    tk::Client c(opts(s));
    uint64_t held = r.acquire("k", 30000);
    ASSERT_GT(held, 0u);
    std::atomic<bool> cancelled{false};
    std::string what;
    Clock::time_point stopped;
    {
        std::jthread waiter([&](std::stop_token st) {
            try {
                tk::Lock l = c.acquire("k", 30s, st);
            } catch (const tk::Cancelled &e) {
                what = e.what();
                cancelled = true;
            }
        });
        ASSERT_TRUE(tt::wait_until([&] { return r.inspect("k").waiters == 1; })) << "the acquire waits";
        waiter.request_stop();
        stopped = Clock::now();
    } // joined
    EXPECT_LT(Clock::now() - stopped, 2s) << "request_stop woke the waiting acquire";
    EXPECT_TRUE(cancelled) << "the acquire failed with Cancelled";
    EXPECT_NE(what.find("\"k\""), std::string::npos) << what;
    EXPECT_EQ(r.inspect("k").waiters, 0u) << "the request was withdrawn from the queue";
    EXPECT_TRUE(r.release("k", held));
    EXPECT_TRUE(tt::stays([&] { return !r.inspect("k").held; }, 300ms)) << "the cancelled client was not granted";
    c.ping(); // the client is still usable
}

TEST(Cpp20, DestroyingTheJthreadStopsItsAcquire)
{
    tt::Server s;
    tt::Raw r(s.addr());
    tk::Client c(opts(s));
    uint64_t held = r.acquire("k", 30000);
    ASSERT_GT(held, 0u);
    std::atomic<bool> cancelled{false};
    auto waiter = std::make_unique<std::jthread>([&](std::stop_token st) {
        try {
            c.with_lock("k", 30s, st, [] { ADD_FAILURE() << "the body ran"; });
        } catch (const tk::Cancelled &) {
            cancelled = true;
        }
    });
    ASSERT_TRUE(tt::wait_until([&] { return r.inspect("k").waiters == 1; }));
    auto t0 = Clock::now();
    waiter.reset(); // ~jthread: request_stop, then join
    EXPECT_LT(Clock::now() - t0, 2s);
    EXPECT_TRUE(cancelled);
    EXPECT_EQ(r.inspect("k").waiters, 0u);
}

TEST(Cpp20, AStoppedTokenFailsWithoutSending)
{
    tt::Server s;
    tt::Raw r(s.addr());
    tk::Client c(opts(s));
    std::stop_source src;
    src.request_stop();
    try {
        c.acquire("free", 1s, src.get_token());
        FAIL() << "expected Cancelled";
    } catch (const tk::Cancelled &e) {
        EXPECT_EQ(e.code(), TK_ERR_CANCELLED);
        EXPECT_STREQ(e.kind(), "cancelled");
        EXPECT_NE(std::string(e.what()).find("before it was sent"), std::string::npos) << e.what();
    }
    EXPECT_FALSE(r.inspect("free").held) << "nothing was acquired";
}

TEST(Cpp20, AGrantBeforeTheStopIsKept)
{
    tt::Server s;
    tt::Raw r(s.addr());
    tk::Client c(opts(s));
    std::stop_source src;
    tk::Lock l = c.acquire("k", 30s, src.get_token());
    ASSERT_TRUE(l);
    src.request_stop(); // after the grant: changes nothing
    EXPECT_TRUE(r.inspect("k").held);
    EXPECT_FALSE(l.lost());
    l.release();
    EXPECT_FALSE(r.inspect("k").held);

    tk::Lock none = c.acquire("k2", 30s, std::stop_token()); // no stop state: a plain acquire
    EXPECT_TRUE(none);
    std::stop_source src2;
    int v = c.with_lock("w", 5s, src2.get_token(), [](tk::Lock &lock) { return lock.token() > 0 ? 7 : 0; });
    EXPECT_EQ(v, 7);
    EXPECT_FALSE(r.inspect("w").held);
}

TEST(Cpp20, PendingAcquireGetWithAStopToken)
{
    tt::Server s;
    tt::Raw r(s.addr());
    tk::Client c(opts(s));
    uint64_t held = r.acquire("k", 30000);
    ASSERT_GT(held, 0u);
    tk::PendingAcquire p = c.acquire_async("k", 30s);
    ASSERT_TRUE(tt::wait_until([&] { return r.inspect("k").waiters == 1; }));
    std::stop_source src;
    std::jthread stopper([&] {
        std::this_thread::sleep_for(100ms);
        src.request_stop();
    });
    EXPECT_THROW(p.get(src.get_token()), tk::Cancelled);
    EXPECT_EQ(r.inspect("k").waiters, 0u);
}

TEST(Cpp20, AStopRacingTheGrantNeverLeavesTheKeyHeld)
{
    tt::Server s;
    tt::Raw r(s.addr());
    tk::Client c(opts(s));
    int granted = 0, cancelled = 0;
    for (int i = 0; i < 10; i++) {
        uint64_t held = r.acquire("race", 30000);
        ASSERT_GT(held, 0u);
        std::optional<tk::Lock> got;
        bool was_cancelled = false;
        {
            std::jthread waiter([&](std::stop_token st) {
                try {
                    got = c.acquire("race", 30s, st);
                } catch (const tk::Cancelled &) {
                    was_cancelled = true;
                }
            });
            ASSERT_TRUE(tt::wait_until([&] { return r.inspect("race").waiters == 1; }));
            ASSERT_TRUE(r.release("race", held)); // grants the waiter ...
            waiter.request_stop();                // ... while it is being stopped
        }
        if (got) {
            granted++;
            EXPECT_TRUE(r.inspect("race").held);
            got->release();
        } else {
            ASSERT_TRUE(was_cancelled);
            cancelled++;
        }
        ASSERT_TRUE(tt::wait_until([&] { return !r.inspect("race").held; })) << "round " << i << ": the key stays held";
    }
    std::printf("stop racing the grant: %d granted, %d cancelled\n", granted, cancelled);
}
TEST(Cpp20, NoWaitingOnTheIoThread)
{
    tt::Server s;
    tk::Client c(opts(s));
    std::stop_source src;
    std::atomic<int> refused{0};
    tk::AcquireOptions o;
    o.on_lost = [&](tk::LostReason) { // runs on the client's I/O thread
        try {
            c.acquire("other", 1s, src.get_token());
        } catch (const tk::InvalidArgument &) {
            refused |= 1;
        } catch (...) {
        }
        try {
            c.acquire_async("other2", 1s).get(src.get_token());
        } catch (const tk::InvalidArgument &e) {
            if (std::string(e.what()).find("I/O thread") != std::string::npos)
                refused |= 2;
        } catch (...) {
        }
    };
    tk::Lock l = c.acquire("k", 100ms, o);
    EXPECT_TRUE(tt::wait_until([&] { return refused.load() == 3; }, 3000ms))
        << "both waits were refused on the I/O thread instead of waiting forever (" << refused.load() << ")";
}
#else
TEST(Cpp20, StopTokenOverloads) { GTEST_SKIP() << "this standard library has no std::jthread"; }
#endif
