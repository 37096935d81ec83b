// ticketing/ticketing.hpp - the header-only C++17 wrapper of the Ticketing C client.
//
//   ticketing::Client client({.endpoints = {"127.0.0.1:7070"}});      // connects (throws on failure)
//   {
//       ticketing::Lock lock = client.acquire("order-1234", std::chrono::seconds(30));
//       write_with_fence(lock.token());                                // pass the fencing token on
//   }                                                                  // released by the destructor
//
// Errors are exceptions: every failure throws a subclass of ticketing::Error (one per condition,
// NotAcquired, LockLost, Timeout...), in the way of redis-plus-plus and std::system_error. Values
// that are not failures are values: try_acquire returns std::optional<Lock> (empty when the key is
// taken). Durations are std::chrono; a lease below 1 ms is rejected.
//
// Lock is move-only RAII: its destructor releases the lock in the background if it is still held
// (it never blocks or throws). Call release() to release now and learn the outcome. Mutex adapts
// one key to the standard Lockable concepts, so std::unique_lock / std::lock_guard work with it.
//
// C++20: where the standard library has std::jthread (TICKETING_HAS_STOP_TOKEN), acquire,
// with_lock and PendingAcquire::get also take a std::stop_token; request_stop() withdraws the
// waiting acquire, which throws Cancelled.
//
// Threads: a Client may be used by any number of threads. A Lock is used by one thread at a time
// (its reads - token, lost - are safe from any thread). on_lost callbacks run on the client's I/O
// thread; keep them short.
#ifndef TICKETING_TICKETING_HPP
#define TICKETING_TICKETING_HPP

#include <array>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>
#if __has_include(<version>)
#include <version>
#endif
#if defined(__cpp_lib_jthread)
#include <stop_token>
/// 1 when the std::stop_token overloads (C++20, <stop_token>) are available, else 0.
#define TICKETING_HAS_STOP_TOKEN 1
#else
#define TICKETING_HAS_STOP_TOKEN 0
#endif

#include "ticketing/ticketing.h"

namespace ticketing {

/// Durations are whole milliseconds on the wire; std::chrono::seconds and coarser convert implicitly.
using Milliseconds = std::chrono::milliseconds;

/// Why a lock was lost (see PROTOCOL.md, "The lost signal").
enum class LostReason {
    Expired = TK_LOST_EXPIRED,                  ///< the local deadline passed, or EXPIRED (LEASE)
    NotHeld = TK_LOST_NOT_HELD,                 ///< NOT_HELD answered an extend or release
    ServerRestarted = TK_LOST_SERVER_RESTARTED, ///< a reconnect found a new state id
    ServerStopping = TK_LOST_SERVER_STOPPING,   ///< EXPIRED with reason STOPPING
};

/// INSPECT flags (KeyInfo::flags), as PROTOCOL.md names them.
enum class InspectFlag : std::uint32_t {
    Held = TK_INSPECT_HELD,              ///< somebody holds the key
    TokenMatch = TK_INSPECT_TOKEN_MATCH, ///< the token asked about is the holder's
    Session = TK_INSPECT_SESSION,        ///< the asking session holds the key
    Stalled = TK_INSPECT_STALLED,        ///< the key waits for storage before its next grant
    Startup = TK_INSPECT_STARTUP,        ///< the server is in its start-up wait (lock_delay: the time left)
};

/// "expired", "not held", "server restarted", "server stopping".
inline const char *to_string(LostReason r) noexcept { return tk_lost_reason_str(static_cast<tk_lost_reason>(r)); }

/// Base of every exception of this library. code() is the C error code.
class Error : public std::runtime_error {
public:
    /// Wraps a C error.
    explicit Error(const tk_error &e)
        : std::runtime_error(e.message[0] ? e.message : tk_strerror(e.code)), code_(e.code), status_(e.status),
          detail_(e.detail), reason_(e.reason)
    {
    }
    /// The C error code (TK_ERR_...).
    tk_err code() const noexcept { return code_; }
    /// The conformance kind: "not_acquired", "lock_lost", "timeout"...
    const char *kind() const noexcept { return tk_err_kind(code_); }
    /// The server's status when the error is its answer, else -1.
    int status() const noexcept { return status_; }
    /// INVALID: the field code; BUSY: the limit code; else 0.
    std::uint32_t detail() const noexcept { return detail_; }

protected:
    tk_lost_reason lost_reason() const noexcept { return reason_; }

private:
    tk_err code_;
    int status_;
    std::uint32_t detail_;
    tk_lost_reason reason_;
};

/// The wait timeout passed, or a try found the key taken: nothing is held.
class NotAcquired : public Error {
public:
    using Error::Error;
};

/// The acquire was cancelled.
class Cancelled : public Error {
public:
    using Error::Error;
};

/// The token does not hold the key (release or extend by token): nothing changed.
class NotHeld : public Error {
public:
    using Error::Error;
};

/// An argument was rejected before sending, or by the server (detail(): the field code).
class InvalidArgument : public Error {
public:
    using Error::Error;
};

/// refuse_held was set and this client already holds the key.
class AlreadyHeld : public Error {
public:
    using Error::Error;
};

/// Wrong token, a token the server requires, or a server that cannot prove it holds the token.
class AuthFailed : public Error {
public:
    using Error::Error;
};

/// The server does not speak protocol version 1.
class UnsupportedVersion : public Error {
public:
    using Error::Error;
};

/// No endpoint could be connected to.
class Unavailable : public Error {
public:
    using Error::Error;
};

/// The TLS handshake failed (also TLS spoken to a plaintext server, and back).
class TlsError : public Error {
public:
    using Error::Error;
};

/// A request timeout or dial timeout passed.
class Timeout : public Error {
public:
    using Error::Error;
};

/// The connection dropped and the session could not be resumed.
class ConnectionLost : public Error {
public:
    using Error::Error;
};

/// The server restarted (a new state id) while the call was in flight.
class ServerRestarted : public Error {
public:
    using Error::Error;
};

/// A server limit was reached (detail(): the limit code).
class Busy : public Error {
public:
    using Error::Error;
};

/// The server is stopping.
class ShuttingDown : public Error {
public:
    using Error::Error;
};

/// The client was closed.
class Closed : public Error {
public:
    using Error::Error;
};

/// The server broke the protocol, or another unexpected failure.
class ProtocolError : public Error {
public:
    using Error::Error;
};


/// The lock is lost; reason() says why.
class LockLost : public Error {
public:
    using Error::Error;
    /// Why the lock was lost.
    LostReason reason() const noexcept
    {
        tk_lost_reason r = lost_reason();
        return r == TK_LOST_NONE ? LostReason::Expired : static_cast<LostReason>(r);
    }
};

/// Throws the exception class of e.code (never returns).
[[noreturn]] inline void throw_error(const tk_error &e)
{
    switch (e.code) {
    case TK_ERR_NOT_ACQUIRED: throw NotAcquired(e);
    case TK_ERR_CANCELLED: throw Cancelled(e);
    case TK_ERR_NOT_HELD: throw NotHeld(e);
    case TK_ERR_LOCK_LOST: throw LockLost(e);
    case TK_ERR_INVALID_ARGUMENT: throw InvalidArgument(e);
    case TK_ERR_ALREADY_HELD: throw AlreadyHeld(e);
    case TK_ERR_AUTH_FAILED: throw AuthFailed(e);
    case TK_ERR_UNSUPPORTED_VERSION: throw UnsupportedVersion(e);
    case TK_ERR_UNAVAILABLE: throw Unavailable(e);
    case TK_ERR_TLS: throw TlsError(e);
    case TK_ERR_TIMEOUT: throw Timeout(e);
    case TK_ERR_CONNECTION_LOST: throw ConnectionLost(e);
    case TK_ERR_SERVER_RESTARTED: throw ServerRestarted(e);
    case TK_ERR_BUSY: throw Busy(e);
    case TK_ERR_SHUTTING_DOWN: throw ShuttingDown(e);
    case TK_ERR_CLOSED: throw Closed(e);
    default: throw ProtocolError(e);
    }
}

namespace detail {
inline void check(tk_err rc, const tk_error &e)
{
    if (rc != TK_OK)
        throw_error(e);
}

inline std::int64_t to_ms(Milliseconds d) noexcept { return static_cast<std::int64_t>(d.count()); }

using LostFn = std::function<void(LostReason)>;

inline void call_lost(tk_lock *, tk_lost_reason reason, void *data)
{
    auto *fn = static_cast<LostFn *>(data);
    try {
        (*fn)(static_cast<LostReason>(reason));
    } catch (...) {
        // an exception must not cross into C: a throwing lost callback is ignored
    }
}

inline void free_lost(void *data) { delete static_cast<LostFn *>(data); }
} // namespace detail

/// TLS settings: a CA bundle to verify the server (empty: the system's), and for mutual TLS a
/// client certificate and key (PEM files).
struct TlsOptions {
    std::string ca_file;     ///< PEM CA bundle; empty = the system's
    std::string cert_file;   ///< PEM client certificate (mutual TLS); empty = none
    std::string key_file;    ///< PEM key of cert_file
    std::string server_name; ///< name (or IP) to verify; empty = the endpoint's host
};

/// Client options; every field has the documented default.
struct Options {
    std::vector<std::string> endpoints{"127.0.0.1:7070"}; ///< tried in order; the leader hint first
    std::optional<std::string> token;                      ///< shared auth token; default none
    std::optional<TlsOptions> tls;                         ///< TLS; default off
    Milliseconds dial_timeout{5000};                       ///< TCP + TLS + handshake per endpoint (handshake: 2 s at most after TCP)
    Milliseconds request_timeout{10000};                   ///< every answer except queued time (short = fail fast while disconnected)
    Milliseconds heartbeat{2000};                          ///< PING after this long idle (250 ms while a request waits); 0 = off
    Milliseconds backoff_min{50};                          ///< reconnect backoff start
    Milliseconds backoff_max{2000};                        ///< reconnect backoff cap
    Milliseconds cleanup_timeout{5000};                    ///< a cancelled acquire waits this long for its clean-up
    bool release_on_close = false;                         ///< close() releases every lock still held
};

/// Per-acquire options.
struct AcquireOptions {
    std::optional<Milliseconds> wait;        ///< queue wait; nullopt = without limit (default); 0 = try once
    bool keepalive = false;                  ///< extend every lease/3 until release or loss
    std::optional<Milliseconds> max_hold;    ///< keep-alive stops after this long
    bool refuse_held = false;                ///< fail AlreadyHeld if this client holds the key
    std::function<void(LostReason)> on_lost; ///< called once when the lock is lost (on the I/O thread)
};

/// A key's state as the server reports it (INSPECT).
struct KeyInfo {
    bool held = false;          ///< somebody holds the key
    std::uint64_t token = 0;    ///< the holder's token, only to its session or with a matching token
    Milliseconds lease_left{0}; ///< left on the holder's lease
    std::uint32_t waiters = 0;  ///< acquires queued
    Milliseconds held_for{0};   ///< since the grant
    Milliseconds lock_delay{0}; ///< lock-delay left; with startup, the start-up wait left
    bool token_match = false;   ///< the token asked about holds it
    bool session = false;       ///< this client's session holds it
    bool stalled = false;       ///< the key waits for the server's storage before its next grant
    bool startup = false;       ///< the server is in its start-up wait: nothing is granted before it ends
    std::uint32_t flags = 0;    ///< every INSPECT flag (InspectFlag bits)
    /// True when flag f is set.
    bool has(InspectFlag f) const noexcept { return (flags & static_cast<std::uint32_t>(f)) != 0; }
};

/// A held lock (move-only). The destructor releases it in the background when still held.
class Lock {
public:
    /// An empty Lock (holds nothing).
    Lock() noexcept = default;
    /// Takes ownership of a C handle.
    explicit Lock(tk_lock *l) noexcept : l_(l) {}
    Lock(const Lock &) = delete;
    Lock &operator=(const Lock &) = delete;
    /// Moves the handle; other becomes empty.
    Lock(Lock &&other) noexcept : l_(std::exchange(other.l_, nullptr)) {}
    /// Releases (in the background) what this Lock held, then takes other's handle.
    Lock &operator=(Lock &&other) noexcept
    {
        if (this != &other) {
            reset();
            l_ = std::exchange(other.l_, nullptr);
        }
        return *this;
    }
    /// Releases in the background if still held; never blocks, never throws.
    ~Lock() { reset(); }

    /// True when this Lock has a handle.
    explicit operator bool() const noexcept { return l_ != nullptr; }
    /// The fencing token (0 for an empty Lock).
    std::uint64_t token() const noexcept { return tk_lock_token(l_); }
    /// The key.
    std::string key() const
    {
        std::size_t n = 0;
        const std::uint8_t *k = tk_lock_key(l_, &n);
        return k ? std::string(reinterpret_cast<const char *>(k), n) : std::string();
    }
    /// The lease last granted.
    Milliseconds lease() const noexcept { return Milliseconds(tk_lock_lease_ms(l_)); }
    /// Why the lock was lost, or nullopt while it is not.
    std::optional<LostReason> lost() const noexcept
    {
        tk_lost_reason r = tk_lock_lost(l_);
        if (r == TK_LOST_NONE)
            return std::nullopt;
        return static_cast<LostReason>(r);
    }
    /// Time until the lost signal fires by the local deadline.
    Milliseconds remaining() const noexcept { return Milliseconds(tk_lock_remaining_ms(l_)); }
    /// Time from now to the local deadline itself (lost fires up to 5 ms before it); negative
    /// once it has passed.
    std::chrono::microseconds deadline_in() const noexcept
    {
        return std::chrono::microseconds(tk_lock_deadline_in_us(l_));
    }
    /// Releases now. Throws LockLost when the server answers NOT_HELD, or at once (without
    /// waiting for the server) when the lock had been lost earlier; the server is then told in
    /// the background. A second release is a no-op.
    void release()
    {
        tk_error e;
        detail::check(tk_lock_release(l_, &e), e);
    }
    /// Extends the lease to lease from now; returns the lease granted. Throws LockLost.
    Milliseconds extend(Milliseconds lease)
    {
        tk_error e;
        detail::check(tk_lock_extend(l_, detail::to_ms(lease), &e), e);
        return this->lease();
    }
    /// Asks the server whether this lock still holds its key.
    bool verify()
    {
        int held = 0;
        tk_error e;
        detail::check(tk_lock_verify(l_, &held, &e), e);
        return held != 0;
    }
    /// The C handle (owned by this Lock).
    tk_lock *native_handle() const noexcept { return l_; }
    /// Gives up the handle without releasing: the caller owns it (tk_lock_free / tk_lock_drop).
    tk_lock *detach() noexcept { return std::exchange(l_, nullptr); }

private:
    void reset() noexcept
    {
        if (l_)
            tk_lock_drop(std::exchange(l_, nullptr));
    }
    tk_lock *l_ = nullptr;
};

/// An acquire in progress (Client::acquire_async): wait for it, or cancel it. It must not be
/// used after its Client is destroyed. Dropping it without get() does not cancel the wait: a lock
/// granted later is released in the background.
class PendingAcquire {
    struct State {
        std::mutex m;
        std::condition_variable cv;
        bool done = false;
        tk_error err{};
        tk_lock *lock = nullptr;
        ~State()
        {
            if (lock)
                tk_lock_drop(lock); // nobody took it: release it in the background
        }
    };

public:
    /// The request id (for logs).
    std::uint64_t request_id() const noexcept { return id_; }

    /// Waits for the outcome: the Lock, or the exception of the failure (Cancelled after cancel()).
    Lock get()
    {
        refuse_on_io_thread();
        std::unique_lock<std::mutex> g(s_->m);
        s_->cv.wait(g, [&] { return s_->done; });
        if (s_->err.code != TK_OK)
            throw_error(s_->err);
        return Lock(std::exchange(s_->lock, nullptr));
    }

#if TICKETING_HAS_STOP_TOKEN
    /// get() that stop can interrupt: stop.request_stop() withdraws the acquire (as cancel()
    /// does) and get then throws Cancelled, unless the outcome came first. C++20.
    Lock get(std::stop_token stop)
    {
        refuse_on_io_thread();
        if (stop.stop_possible()) {
            std::stop_callback on_stop(stop, [this]() noexcept { cancel(); });
            return get();
        }
        return get();
    }
#endif

    /// Waits up to d; true when the outcome is there (get() then returns at once).
    template <class Rep, class Period> bool wait_for(std::chrono::duration<Rep, Period> d)
    {
        std::unique_lock<std::mutex> g(s_->m);
        return s_->cv.wait_for(g, d, [&] { return s_->done; });
    }

    /// Withdraws the acquire (CANCEL; a grant that raced it is released). get() then throws
    /// Cancelled. Returns false when the acquire had already completed.
    bool cancel()
    {
        tk_error e;
        return tk_client_cancel(c_, id_, &e) == TK_OK;
    }

private:
    friend class Client;
    // Waiting on the I/O thread would wait forever: the outcome is delivered by that thread.
    void refuse_on_io_thread() const
    {
        if (!tk_client_on_io_thread(c_))
            return;
        tk_error e{};
        e.code = TK_ERR_INVALID_ARGUMENT;
        e.status = -1;
        std::snprintf(e.message, sizeof e.message, "%s",
                      "a blocking call inside a callback on the client's I/O thread would wait forever; use "
                      "another thread");
        throw InvalidArgument(e);
    }
    static void on_reply(tk_async *, const tk_reply *r, void *data)
    {
        auto *sp = static_cast<std::shared_ptr<State> *>(data);
        {
            std::lock_guard<std::mutex> g((*sp)->m);
            (*sp)->err = *r->error;
            (*sp)->lock = r->lock;
            (*sp)->done = true;
        }
        (*sp)->cv.notify_all();
        delete sp;
    }
    tk_client *c_ = nullptr;
    std::uint64_t id_ = 0;
    std::shared_ptr<State> s_ = std::make_shared<State>();
};

/// A connection to a Ticketing server or cluster; safe for concurrent use by many threads.
/// The destructor closes it (locks are not released unless Options::release_on_close).
class Client {
public:
    /// Connects (one round over the endpoints). Throws Unavailable, AuthFailed, TlsError...
    /// During an election (a node answered NOT_LEADER) it retries at the shortest backoff until
    /// the request timeout has passed, then throws Unavailable.
    explicit Client(const Options &o = Options())
    {
        std::vector<const char *> eps;
        for (const auto &s : o.endpoints)
            eps.push_back(s.c_str());
        tk_options co{};
        co.endpoints = eps.data();
        co.n_endpoints = eps.size();
        if (o.token) {
            co.token = o.token->data();
            co.token_len = o.token->size();
            if (co.token_len == 0)
                throw InvalidArgument(make_error(TK_ERR_INVALID_ARGUMENT, "invalid token: empty"));
        }
        if (o.tls) {
            co.tls = 1;
            co.tls_ca_file = o.tls->ca_file.empty() ? nullptr : o.tls->ca_file.c_str();
            co.tls_cert_file = o.tls->cert_file.empty() ? nullptr : o.tls->cert_file.c_str();
            co.tls_key_file = o.tls->key_file.empty() ? nullptr : o.tls->key_file.c_str();
            co.tls_server_name = o.tls->server_name.empty() ? nullptr : o.tls->server_name.c_str();
        }
        co.dial_timeout_ms = positive(o.dial_timeout, "dial_timeout");
        co.request_timeout_ms = positive(o.request_timeout, "request_timeout");
        co.heartbeat_ms = o.heartbeat.count() == 0 ? TK_OFF : positive(o.heartbeat, "heartbeat");
        co.backoff_min_ms = positive(o.backoff_min, "backoff_min");
        co.backoff_max_ms = positive(o.backoff_max, "backoff_max");
        co.cleanup_timeout_ms = positive(o.cleanup_timeout, "cleanup_timeout");
        co.release_on_close = o.release_on_close;
        tk_error e;
        detail::check(tk_client_connect(&co, &c_, &e), e);
    }
    Client(const Client &) = delete;
    Client &operator=(const Client &) = delete;
    /// Moves the connection; other becomes closed.
    Client(Client &&other) noexcept : c_(std::exchange(other.c_, nullptr)) {}
    /// Closes this client, then takes other's connection.
    Client &operator=(Client &&other) noexcept
    {
        if (this != &other) {
            tk_client_free(c_);
            c_ = std::exchange(other.c_, nullptr);
        }
        return *this;
    }
    /// Closes and frees the client. Locks still alive stay valid; their operations throw Closed.
    ~Client() { tk_client_free(c_); }

    /// Acquires key for lease, waiting in the FIFO queue (see AcquireOptions). Throws NotAcquired
    /// when the wait passed, and the other errors.
    Lock acquire(std::string_view key, Milliseconds lease, const AcquireOptions &o = AcquireOptions())
    {
        Opts co(o);
        tk_lock *l = nullptr;
        tk_error e;
        detail::check(tk_acquire(c_, key.data(), key.size(), detail::to_ms(lease), co.wait, &co.c, &l, &e), e);
        return Lock(l);
    }

#if TICKETING_HAS_STOP_TOKEN
    /// acquire() that stop can interrupt (C++20): stop.request_stop() from any thread wakes the
    /// waiting call, which withdraws its request (CANCEL; a grant that raced it is released) and
    /// throws Cancelled; a token already stopped throws Cancelled without sending anything. A
    /// grant that arrived before the stop is returned. std::jthread passes its token:
    ///     std::jthread worker([&](std::stop_token st) { auto lock = client.acquire("k", 30s, st); ... });
    ///     worker.request_stop();   // or let ~jthread do it
    Lock acquire(std::string_view key, Milliseconds lease, std::stop_token stop,
                 const AcquireOptions &o = AcquireOptions())
    {
        if (!stop.stop_possible())
            return acquire(key, lease, o);
        if (stop.stop_requested())
            throw Cancelled(make_error(TK_ERR_CANCELLED, ("acquire of " + quote(key) +
                                                          " cancelled before it was sent (stop requested)")
                                                             .c_str()));
        if (tk_client_on_io_thread(c_))
            return acquire(key, lease, o); // refused by the C library with its message
        return acquire_async(key, lease, o).get(std::move(stop));
    }

    /// with_lock() whose acquire stop can interrupt (see acquire with a std::stop_token). C++20.
    template <class F>
    decltype(auto) with_lock(std::string_view key, Milliseconds lease, std::stop_token stop, F &&body,
                             const AcquireOptions &o = AcquireOptions(), bool raise_on_lost = true)
    {
        Lock lock = acquire(key, lease, std::move(stop), o);
        return run_scope(lock, std::forward<F>(body), raise_on_lost);
    }
#endif

    /// Tries once: the Lock, or nullopt when the key is taken.
    std::optional<Lock> try_acquire(std::string_view key, Milliseconds lease, const AcquireOptions &o = AcquireOptions())
    {
        Opts co(o);
        tk_lock *l = nullptr;
        tk_error e;
        detail::check(tk_try_acquire(c_, key.data(), key.size(), detail::to_ms(lease), &co.c, &l, &e), e);
        if (!l)
            return std::nullopt;
        return Lock(l);
    }

    /// Starts an acquire and returns at once; wait with get(), withdraw with cancel().
    PendingAcquire acquire_async(std::string_view key, Milliseconds lease, const AcquireOptions &o = AcquireOptions())
    {
        Opts co(o);
        PendingAcquire p;
        p.c_ = c_;
        auto *sp = new std::shared_ptr<PendingAcquire::State>(p.s_);
        tk_error e;
        tk_err rc = tk_client_acquire_async(c_, key.data(), key.size(), detail::to_ms(lease), co.wait, &co.c,
                                            &PendingAcquire::on_reply, sp, &p.id_, &e);
        if (rc != TK_OK) {
            delete sp;
            throw_error(e);
        }
        return p;
    }

    /// Releases key held with token (from any client: the owner is the token). Throws NotHeld.
    void release(std::string_view key, std::uint64_t token)
    {
        tk_error e;
        detail::check(tk_release(c_, key.data(), key.size(), token, &e), e);
    }

    /// Extends key held with token to lease from now; returns the lease granted. Throws NotHeld.
    Milliseconds extend(std::string_view key, std::uint64_t token, Milliseconds lease)
    {
        std::uint32_t granted = 0;
        tk_error e;
        detail::check(tk_extend(c_, key.data(), key.size(), token, detail::to_ms(lease), &granted, &e), e);
        return Milliseconds(granted);
    }

    /// The key's state (token: 0, or a token to check). Changes nothing.
    KeyInfo inspect(std::string_view key, std::uint64_t token = 0)
    {
        tk_inspect_info in{};
        tk_error e;
        detail::check(tk_inspect(c_, key.data(), key.size(), token, &in, &e), e);
        KeyInfo k;
        k.held = in.held != 0;
        k.token = in.token;
        k.lease_left = Milliseconds(in.lease_left_ms);
        k.waiters = in.waiters;
        k.held_for = Milliseconds(in.held_for_ms);
        k.lock_delay = Milliseconds(in.lock_delay_ms);
        k.token_match = in.token_match != 0;
        k.session = in.session != 0;
        k.flags = in.flags;
        k.stalled = (in.flags & TK_INSPECT_STALLED) != 0;
        k.startup = (in.flags & TK_INSPECT_STARTUP) != 0;
        return k;
    }

    /// Round trip to the server.
    void ping()
    {
        tk_error e;
        detail::check(tk_ping(c_, &e), e);
    }

    /// Scoped helper: acquires key, runs body (with the Lock, or without arguments), releases.
    /// Throws LockLost when the lock was lost while body ran (after body returns), unless
    /// raise_on_lost is false. If body throws, the lock is released in the background and the
    /// exception propagates.
    template <class F>
    decltype(auto) with_lock(std::string_view key, Milliseconds lease, F &&body,
                             const AcquireOptions &o = AcquireOptions(), bool raise_on_lost = true)
    {
        Lock lock = acquire(key, lease, o);
        return run_scope(lock, std::forward<F>(body), raise_on_lost);
    }

    /// Closes now (see tk_client_close): queued acquires are withdrawn (their get() throws
    /// Closed), held locks are kept until their lease ends unless release_on_close. Later calls
    /// throw Closed.
    void close() noexcept { tk_client_close(c_); }

    /// The 16-byte session id.
    std::array<std::uint8_t, TK_SESSION_ID_SIZE> session_id() const
    {
        std::array<std::uint8_t, TK_SESSION_ID_SIZE> s{};
        if (tk_client_session_id(c_, s.data()) != TK_OK)
            throw Closed(make_error(TK_ERR_CLOSED, "the client is closed"));
        return s;
    }

    /// The C handle (owned by this Client).
    tk_client *native_handle() const noexcept { return c_; }

private:
    // with_lock's body and release, on a lock already acquired.
    template <class F> static decltype(auto) run_scope(Lock &lock, F &&body, bool raise_on_lost)
    {
        if constexpr (std::is_invocable_v<F, Lock &>) {
            using R = std::invoke_result_t<F, Lock &>;
            if constexpr (std::is_void_v<R>) {
                std::forward<F>(body)(lock);
                finish_scope(lock, raise_on_lost);
            } else {
                R r = std::forward<F>(body)(lock);
                finish_scope(lock, raise_on_lost);
                return r;
            }
        } else {
            using R = std::invoke_result_t<F>;
            if constexpr (std::is_void_v<R>) {
                std::forward<F>(body)();
                finish_scope(lock, raise_on_lost);
            } else {
                R r = std::forward<F>(body)();
                finish_scope(lock, raise_on_lost);
                return r;
            }
        }
    }

    // A key for a message: as text when printable, else its length.
    static std::string quote(std::string_view key)
    {
        char buf[160];
        std::string k(key.substr(0, 64));
        bool printable = true;
        for (unsigned char ch : k)
            printable = printable && ch >= 0x20 && ch < 0x7f && ch != '"';
        if (!printable)
            std::snprintf(buf, sizeof buf, "a key of %zu bytes", key.size());
        else if (key.size() > 64)
            std::snprintf(buf, sizeof buf, "\"%s\"...(%zu bytes)", k.c_str(), key.size());
        else
            std::snprintf(buf, sizeof buf, "\"%s\"", k.c_str());
        return buf;
    }

    // C acquire options built from AcquireOptions.
    struct Opts {
        tk_acquire_opts c{};
        std::int64_t wait = TK_WAIT_FOREVER;
        explicit Opts(const AcquireOptions &o)
        {
            if (o.wait)
                wait = detail::to_ms(*o.wait);
            c.keepalive = o.keepalive;
            c.max_hold_ms = o.max_hold ? detail::to_ms(*o.max_hold) : 0;
            if (o.max_hold && c.max_hold_ms <= 0)
                throw InvalidArgument(make_error(TK_ERR_INVALID_ARGUMENT, "invalid max_hold: at least 1 ms"));
            c.refuse_held = o.refuse_held;
            if (o.on_lost) {
                c.on_lost = &detail::call_lost;
                c.on_lost_data = new detail::LostFn(o.on_lost);
                c.on_lost_data_free = &detail::free_lost;
            }
        }
        // the C library frees on_lost_data exactly once, whatever the outcome of the call
        Opts(const Opts &) = delete;
        Opts &operator=(const Opts &) = delete;
    };

    static tk_error make_error(tk_err code, const char *msg)
    {
        tk_error e{};
        e.code = code;
        e.status = -1;
        std::snprintf(e.message, sizeof e.message, "%s", msg);
        return e;
    }

    static std::int64_t positive(Milliseconds d, const char *what)
    {
        if (d.count() <= 0) {
            std::string m = std::string("invalid ") + what + ": " + std::to_string(d.count()) + " ms (at least 1 ms)";
            throw InvalidArgument(make_error(TK_ERR_INVALID_ARGUMENT, m.c_str()));
        }
        return detail::to_ms(d);
    }

    static void finish_scope(Lock &lock, bool raise_on_lost)
    {
        std::optional<LostReason> lost = lock.lost();
        if (!lost) {
            lock.release();
            return;
        }
        try {
            lock.release(); // tells the server anyway; reports lock lost
        } catch (const Error &) {
        }
        if (raise_on_lost) {
            tk_error e = make_error(TK_ERR_LOCK_LOST, "");
            e.reason = static_cast<tk_lost_reason>(*lost);
            std::string m = std::string("lock lost (") + to_string(*lost) + ") while the body ran: " + lock.key() +
                            " token " + std::to_string(lock.token());
            std::snprintf(e.message, sizeof e.message, "%s", m.c_str());
            throw LockLost(e);
        }
    }

    tk_client *c_ = nullptr;
};

/// One key as a standard Lockable: std::unique_lock<ticketing::Mutex> / std::lock_guard work.
/// lock() waits without limit, try_lock() tries once, try_lock_for() waits up to a duration;
/// unlock() releases (and does not throw: a lost lock's release error is dropped; check lost()).
class Mutex {
public:
    /// A mutex for key on client, with lease per hold and the given acquire options.
    Mutex(Client &client, std::string key, Milliseconds lease, AcquireOptions options = AcquireOptions())
        : client_(client), key_(std::move(key)), lease_(lease), opts_(std::move(options))
    {
    }
    Mutex(const Mutex &) = delete;
    Mutex &operator=(const Mutex &) = delete;

    /// Acquires, waiting without limit.
    void lock()
    {
        AcquireOptions o = opts_;
        o.wait.reset();
        lock_ = client_.acquire(key_, lease_, o);
    }
    /// Tries once.
    bool try_lock()
    {
        auto l = client_.try_acquire(key_, lease_, opts_);
        if (!l)
            return false;
        lock_ = std::move(*l);
        return true;
    }
    /// Waits up to d.
    template <class Rep, class Period> bool try_lock_for(std::chrono::duration<Rep, Period> d)
    {
        AcquireOptions o = opts_;
        o.wait = std::chrono::ceil<Milliseconds>(d);
        try {
            lock_ = client_.acquire(key_, lease_, o);
            return true;
        } catch (const NotAcquired &) {
            return false;
        }
    }
    /// Waits until t.
    template <class Clock, class Duration> bool try_lock_until(std::chrono::time_point<Clock, Duration> t)
    {
        auto d = t - Clock::now();
        return try_lock_for(d.count() > 0 ? d : decltype(d)::zero());
    }
    /// Releases the lock held (no-op when none).
    void unlock() noexcept
    {
        try {
            if (lock_)
                lock_.release();
        } catch (...) {
        }
        lock_ = Lock();
    }
    /// The Lock held now (empty when not locked): its token is the fencing token.
    const Lock &held() const noexcept { return lock_; }
    /// The fencing token of the current hold (0 when not locked).
    std::uint64_t token() const noexcept { return lock_.token(); }

private:
    Client &client_;
    std::string key_;
    Milliseconds lease_;
    AcquireOptions opts_;
    Lock lock_;
};

} // namespace ticketing

#endif // TICKETING_TICKETING_HPP
