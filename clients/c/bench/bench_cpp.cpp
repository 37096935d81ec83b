// ticketing-bench-cpp: acquire+release pairs per second through the C++ wrapper's blocking API,
// N std::threads sharing one ticketing::Client (one connection, the client's one I/O thread).
//
//   ticketing-bench-cpp [--addr host:port] [--callers N] [--seconds S] [--warmup W] [--api cpp]
//
// Each caller loops: try_acquire its own key (bench-cpp-<pid>-<caller>, lease 10 s, try once),
// then Lock::release(). W seconds (default 1) of warm-up are not counted, then S seconds are.
// Prints one JSON line: {"pairs_per_sec": R, "errors": E, ...}; exits 1 when more than 1% of the
// attempts failed. Send it only to a server on loopback that you started for it.
#include <ticketing/ticketing.hpp>

#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <string>
#include <thread>
#include <vector>

namespace {

struct alignas(64) Counter {
    std::atomic<long> pairs{0};
    std::atomic<long> errors{0};
};

[[noreturn]] void usage(const char *argv0)
{
    std::fprintf(stderr, "usage: %s [--addr host:port] [--callers N] [--seconds S] [--warmup W] [--api cpp]\n", argv0);
    std::exit(2);
}

} // namespace

int main(int argc, char **argv)
{
    std::string addr = "127.0.0.1:7070";
    int callers = 16;
    double seconds = 5, warmup = 1;
    for (int i = 1; i < argc; i++) {
        std::string a = argv[i];
        auto value = [&]() -> const char * {
            if (i + 1 >= argc)
                usage(argv[0]);
            return argv[++i];
        };
        if (a == "--addr")
            addr = value();
        else if (a == "--callers")
            callers = std::atoi(value());
        else if (a == "--seconds")
            seconds = std::atof(value());
        else if (a == "--warmup")
            warmup = std::atof(value());
        else if (a == "--api") {
            if (std::strcmp(value(), "cpp") != 0)
                usage(argv[0]);
        } else
            usage(argv[0]);
    }
    if (callers < 1 || callers > 10000 || seconds <= 0 || seconds > 3600 || warmup < 0 || warmup > 60) {
        std::fprintf(stderr, "ticketing-bench-cpp: callers 1..10000, seconds 0..3600, warmup 0..60\n");
        return 2;
    }
    ticketing::Options o;
    o.endpoints = {addr};
    std::optional<ticketing::Client> client;
    try {
        client.emplace(o);
    } catch (const ticketing::Error &e) {
        std::fprintf(stderr, "ticketing-bench-cpp: connect: %s\n", e.what());
        return 1;
    }
    std::atomic<bool> stop{false};
    std::vector<Counter> counts(static_cast<std::size_t>(callers));
    std::vector<std::thread> threads;
    const long pid = static_cast<long>(getpid());
    for (int w = 0; w < callers; w++) {
        threads.emplace_back([&, w] {
            const std::string key = "bench-cpp-" + std::to_string(pid) + "-" + std::to_string(w);
            Counter &n = counts[static_cast<std::size_t>(w)];
            while (!stop.load(std::memory_order_relaxed)) {
                try {
                    auto lock = client->try_acquire(key, std::chrono::seconds(10));
                    if (!lock) {
                        n.errors.fetch_add(1, std::memory_order_relaxed);
                        continue;
                    }
                    lock->release();
                    n.pairs.fetch_add(1, std::memory_order_relaxed);
                } catch (const ticketing::Error &) {
                    n.errors.fetch_add(1, std::memory_order_relaxed);
                }
            }
        });
    }
    auto total = [&](bool pairs) {
        long t = 0;
        for (auto &c : counts)
            t += pairs ? c.pairs.load(std::memory_order_relaxed) : c.errors.load(std::memory_order_relaxed);
        return t;
    };
    std::this_thread::sleep_for(std::chrono::duration<double>(warmup));
    const long p0 = total(true), e0 = total(false);
    const auto t0 = std::chrono::steady_clock::now();
    std::this_thread::sleep_for(std::chrono::duration<double>(seconds));
    const long p1 = total(true), e1 = total(false);
    const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    stop.store(true);
    for (auto &t : threads)
        t.join();
    client.reset();
    const long pairs = p1 - p0, errors = e1 - e0;
    std::printf("{\"pairs_per_sec\": %.1f, \"errors\": %ld, \"client\": \"cpp\", \"callers\": %d, \"pairs\": %ld, \"seconds\": %.3f}\n",
                pairs / took, errors, callers, pairs, took);
    return errors * 100 > pairs + errors ? 1 : 0;
}
