// Test support: the real server as a child process, a scriptable fake server, test certificates,
// hex helpers and bounded polling.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "ticketing/ticketing.h"

namespace tt {

using Bytes = std::vector<uint8_t>;
using namespace std::chrono_literals;

std::string repo_root();
std::string read_file(const std::string &path);
Bytes from_hex(const std::string &hex);
std::string to_hex(const uint8_t *p, size_t n);
inline std::string to_hex(const Bytes &b) { return to_hex(b.data(), b.size()); }
std::string make_temp_dir(const std::string &prefix);
void remove_tree(const std::string &path);

/// Polls pred every few ms until it holds or timeout passes; returns its last value.
bool wait_until(const std::function<bool()> &pred, std::chrono::milliseconds timeout = 5000ms);

/// True when pred holds throughout d (polled): for checks that something does NOT happen.
bool stays(const std::function<bool()> &pred, std::chrono::milliseconds d);

/// The real server binary: TICKETING_BIN, else built once (go build) into the build tree.
std::string server_binary();

using Env = std::map<std::string, std::string>;

/// The real server, started on 127.0.0.1 with a free port and a fresh data dir.
class Server {
public:
    explicit Server(Env env = Env());
    ~Server();
    Server(const Server &) = delete;
    Server &operator=(const Server &) = delete;

    std::string addr() const { return "127.0.0.1:" + std::to_string(port_); }
    int port() const { return port_; }
    pid_t pid() const { return pid_; }
    const std::string &data_dir() const { return dir_; }

    void stop_graceful();      ///< SIGTERM and wait for the exit
    void kill_hard();          ///< SIGKILL and wait
    void pause();              ///< SIGSTOP
    void resume();             ///< SIGCONT
    void restart();            ///< start again on the same port and data dir (after a stop)
    bool running() const { return pid_ > 0; }
    std::string log() const;   ///< what the server wrote to stderr

private:
    void start(const std::string &addr);
    void wait_exit();
    std::map<std::string, std::string> env_;
    std::string dir_;
    int port_ = 0;
    pid_t pid_ = -1;
    int err_fd_ = -1;
    std::thread reader_;
    mutable std::mutex log_mu_;
    std::string log_;
    std::string listen_addr_;
};

/// A raw protocol connection to a server (the test's observer "R").
class Raw {
public:
    explicit Raw(const std::string &addr, const std::string &token = "");
    ~Raw();
    tk_response request(uint8_t op, const std::string &key, uint64_t token = 0, uint32_t lease = 0, uint32_t wait = 0);
    tk_inspect_info inspect(const std::string &key);
    uint64_t acquire(const std::string &key, uint32_t lease_ms); ///< token, 0 if not granted at once
    bool release(const std::string &key, uint64_t token);

private:
    int fd_ = -1;
    uint64_t next_id_ = 1;
    Bytes last_data_;
};

/// One accepted connection of the fake server. Reads block with a deadline; a failure throws.
class FakeConn {
public:
    explicit FakeConn(int fd) : fd_(fd) {}
    ~FakeConn();
    Bytes read_frame(std::chrono::milliseconds timeout = 5000ms); ///< one whole frame (length included)
    tk_hello read_hello();
    void send_challenge(uint8_t status = TK_STATUS_OK, uint8_t flags = 0, const std::string &data = "",
                        const uint8_t *nonce = nullptr, uint32_t detail = 0);
    tk_auth read_auth();
    void send_welcome(const uint8_t state[16], bool resumed, uint32_t grace_ms = 5000, uint8_t status = TK_STATUS_OK,
                      const uint8_t *proof = nullptr);
    /// HELLO / CHALLENGE (no auth) / AUTH / WELCOME; returns the HELLO.
    tk_hello handshake(const uint8_t state[16], bool resumed, uint32_t grace_ms = 5000);
    struct Req {
        tk_request r;
        std::string key;
    };
    Req read_request(std::chrono::milliseconds timeout = 5000ms);
    /// True when no frame arrives within d.
    bool quiet_for(std::chrono::milliseconds d);
    /// True when a whole frame is ready to read now (never blocks).
    bool has_frame();
    void respond(const Req &q, uint8_t status, uint64_t token = 0, uint32_t lease = 0, uint32_t detail = 0,
                 const std::string &data = "");
    void push(uint8_t op, uint64_t token, uint32_t detail, const std::string &data);
    void send_raw(const Bytes &b);
    bool closed_by_peer(std::chrono::milliseconds timeout = 3000ms); ///< waits for EOF
    void close();

private:
    int fd_;
    Bytes buf_;
};

/// A scriptable server socket on 127.0.0.1:0.
class FakeServer {
public:
    FakeServer();
    ~FakeServer();
    std::string addr() const { return "127.0.0.1:" + std::to_string(port_); }
    std::unique_ptr<FakeConn> accept(std::chrono::milliseconds timeout = 5000ms);
    bool pending(std::chrono::milliseconds timeout); ///< a connection is waiting to be accepted

private:
    int fd_ = -1;
    int port_ = 0;
};

/// A TCP proxy the test controls: cut every connection (RST), or hold back server->client bytes.
class Proxy {
public:
    explicit Proxy(const std::string &upstream);
    ~Proxy();
    std::string addr() const { return "127.0.0.1:" + std::to_string(port_); }
    void cut();                       ///< resets every proxied connection (new ones are accepted)
    void hold_downstream(bool hold);  ///< while held, server->client bytes are queued (dropped by cut)
    int connections();                ///< connections accepted so far

private:
    void loop();
    std::string upstream_;
    int lfd_ = -1, port_ = 0, wake_[2] = {-1, -1};
    std::thread t_;
    std::mutex mu_;
    bool stop_ = false, cut_ = false, hold_ = false;
    int accepted_ = 0;
};

/// CA, server and client certificates (PEM files in a temp dir; keys never leave it).
struct Certs {
    Certs();
    ~Certs();
    std::string dir, ca, server_cert, server_key, client_cert, client_key, other_ca;
};

/// A blocking client with the given endpoint and tweaks; fails the test on error.
tk_client *connect_or_die(const std::string &addr, const std::function<void(tk_options &)> &tweak = nullptr);

/// Records lost callbacks (thread-safe).
struct LostLog {
    std::mutex mu;
    std::vector<std::pair<uint64_t, tk_lost_reason>> events;
    static void cb(tk_lock *l, tk_lost_reason r, void *data);
    size_t count();
    tk_lost_reason reason_of(uint64_t token);
};

} // namespace tt
