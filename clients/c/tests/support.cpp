#include "support.h"

#include <arpa/inet.h>
#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <dirent.h>
#include <fcntl.h>
#include <fstream>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <set>
#include <sstream>
#include <stdexcept>
#include <sys/file.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/rand.h>
#include <openssl/x509v3.h>

extern char **environ;

namespace tt {

std::string repo_root() { return TICKETING_REPO_ROOT; }

std::string read_file(const std::string &path)
{
    std::ifstream f(path, std::ios::binary);
    if (!f)
        throw std::runtime_error("cannot read " + path);
    std::stringstream ss;
    ss << f.rdbuf();
    return ss.str();
}

Bytes from_hex(const std::string &hex)
{
    Bytes b;
    if (hex.size() % 2)
        throw std::runtime_error("odd hex length");
    for (size_t i = 0; i < hex.size(); i += 2)
        b.push_back(static_cast<uint8_t>(std::stoi(hex.substr(i, 2), nullptr, 16)));
    return b;
}

std::string to_hex(const uint8_t *p, size_t n)
{
    static const char d[] = "0123456789abcdef";
    std::string s;
    for (size_t i = 0; i < n; i++) {
        s += d[p[i] >> 4];
        s += d[p[i] & 15];
    }
    return s;
}

std::string make_temp_dir(const std::string &prefix)
{
    std::string t = "/tmp/" + prefix + "XXXXXX";
    std::vector<char> buf(t.begin(), t.end());
    buf.push_back('\0');
    if (!mkdtemp(buf.data()))
        throw std::runtime_error("mkdtemp failed");
    return buf.data();
}

void remove_tree(const std::string &path)
{
    DIR *d = opendir(path.c_str());
    if (d) {
        while (dirent *e = readdir(d)) {
            std::string n = e->d_name;
            if (n == "." || n == "..")
                continue;
            std::string p = path + "/" + n;
            struct stat st;
            if (lstat(p.c_str(), &st) == 0 && S_ISDIR(st.st_mode))
                remove_tree(p);
            else
                unlink(p.c_str());
        }
        closedir(d);
    }
    rmdir(path.c_str());
}

bool wait_until(const std::function<bool()> &pred, std::chrono::milliseconds timeout)
{
    auto end = std::chrono::steady_clock::now() + timeout;
    for (;;) {
        if (pred())
            return true;
        if (std::chrono::steady_clock::now() >= end)
            return pred();
        std::this_thread::sleep_for(5ms);
    }
}

bool stays(const std::function<bool()> &pred, std::chrono::milliseconds d)
{
    auto end = std::chrono::steady_clock::now() + d;
    while (std::chrono::steady_clock::now() < end) {
        if (!pred())
            return false;
        std::this_thread::sleep_for(5ms);
    }
    return pred();
}

std::string server_binary()
{
    const char *bin = getenv("TICKETING_BIN");
    if (bin && *bin)
        return bin;
    // Built once per build tree; a lock file keeps parallel test processes from building twice.
    std::string dir = std::string(TICKETING_TEST_CACHE) + "/test-server";
    mkdir(dir.c_str(), 0755);
    std::string path = dir + "/ticketing";
    int lk = open((dir + "/lock").c_str(), O_CREAT | O_RDWR | O_CLOEXEC, 0644);
    if (lk >= 0)
        flock(lk, LOCK_EX);
    if (access(path.c_str(), X_OK) != 0) {
        std::string cmd = "cd '" + repo_root() + "' && go build -o '" + path + ".tmp' ./cmd/ticketing && mv '" + path +
                          ".tmp' '" + path + "'";
        if (system(cmd.c_str()) != 0) {
            if (lk >= 0)
                close(lk);
            throw std::runtime_error("building the server failed: " + cmd);
        }
    }
    if (lk >= 0)
        close(lk);
    return path;
}

// ---- Server ---------------------------------------------------------------------------------

Server::Server(Env env) : env_(std::move(env))
{
    dir_ = make_temp_dir("tk-c-data-");
    start("127.0.0.1:0");
}

Server::~Server()
{
    if (pid_ > 0) {
        ::kill(pid_, SIGCONT);
        ::kill(pid_, SIGKILL);
        wait_exit();
    }
    remove_tree(dir_);
}

void Server::start(const std::string &addr)
{
    std::string bin = server_binary();
    std::map<std::string, std::string> env;
    for (char **e = environ; *e; e++) {
        std::string kv = *e;
        auto eq = kv.find('=');
        if (eq != std::string::npos && kv.compare(0, 10, "TICKETING_") != 0)
            env[kv.substr(0, eq)] = kv.substr(eq + 1);
    }
    env["TICKETING_ADDR"] = addr;
    env["TICKETING_DATA_DIR"] = dir_;
    env["TICKETING_STARTUP_GRACE"] = "0";
    for (auto &kv : env_)
        env[kv.first] = kv.second;
    std::vector<std::string> flat;
    for (auto &kv : env)
        flat.push_back(kv.first + "=" + kv.second);
    std::vector<char *> envp;
    for (auto &s : flat)
        envp.push_back(const_cast<char *>(s.c_str()));
    envp.push_back(nullptr);
    int p[2];
    if (pipe2(p, O_CLOEXEC) != 0)
        throw std::runtime_error("pipe failed");
    {
        std::lock_guard<std::mutex> g(log_mu_);
        log_.clear();
    }
    pid_t parent = getpid();
    pid_t pid = fork();
    if (pid == 0) {
        // never outlive the test process (a crashed or killed test must not leave servers behind)
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        if (getppid() != parent)
            _exit(127);
        dup2(p[1], 2);
        int devnull = open("/dev/null", O_RDWR);
        dup2(devnull, 0);
        dup2(devnull, 1);
        char *argv[] = {const_cast<char *>(bin.c_str()), const_cast<char *>("server"), nullptr};
        execve(bin.c_str(), argv, envp.data());
        _exit(127);
    }
    close(p[1]);
    if (pid < 0) {
        close(p[0]);
        throw std::runtime_error("fork failed");
    }
    pid_ = pid;
    err_fd_ = p[0];
    reader_ = std::thread([this, fd = p[0]] {
        char buf[4096];
        for (;;) {
            ssize_t n = read(fd, buf, sizeof buf);
            if (n <= 0)
                break;
            std::lock_guard<std::mutex> g(log_mu_);
            log_.append(buf, static_cast<size_t>(n));
        }
        close(fd);
    });
    std::string found;
    bool ok = wait_until(
        [&] {
            std::lock_guard<std::mutex> g(log_mu_);
            auto i = log_.find("msg=listening");
            if (i == std::string::npos)
                return false;
            auto a = log_.find("addr=", i);
            auto e = log_.find_first_of(" \n", a);
            if (a == std::string::npos || e == std::string::npos)
                return false;
            found = log_.substr(a + 5, e - a - 5);
            return true;
        },
        15000ms);
    if (!ok) {
        std::string l = log();
        ::kill(pid_, SIGKILL);
        wait_exit();
        throw std::runtime_error("the server did not start listening: " + l);
    }
    port_ = std::stoi(found.substr(found.rfind(':') + 1));
}

void Server::wait_exit()
{
    if (pid_ > 0) {
        int st;
        waitpid(pid_, &st, 0);
        pid_ = -1;
    }
    if (reader_.joinable())
        reader_.join();
}

void Server::stop_graceful()
{
    ::kill(pid_, SIGTERM);
    wait_exit();
}

void Server::kill_hard()
{
    ::kill(pid_, SIGKILL);
    wait_exit();
}

void Server::pause()
{
    ::kill(pid_, SIGSTOP);
    // kill() returns before the process is stopped: wait until /proc says every thread is (a
    // thread that has not stopped yet could still answer a request)
    std::string task = "/proc/" + std::to_string(pid_) + "/task";
    wait_until(
        [&] {
            DIR *d = opendir(task.c_str());
            if (!d)
                return true;
            bool all = true;
            while (struct dirent *e = readdir(d)) {
                if (e->d_name[0] == '.')
                    continue;
                std::string st;
                try {
                    st = read_file(task + "/" + e->d_name + "/stat");
                } catch (const std::exception &) {
                    continue; // the thread exited
                }
                auto p = st.rfind(')');
                if (p == std::string::npos || p + 2 >= st.size() || (st[p + 2] != 'T' && st[p + 2] != 't'))
                    all = false;
            }
            closedir(d);
            return all;
        },
        5000ms);
}

void Server::resume() { ::kill(pid_, SIGCONT); }

void Server::restart() { start("127.0.0.1:" + std::to_string(port_)); }

std::string Server::log() const
{
    std::lock_guard<std::mutex> g(log_mu_);
    return log_;
}

// ---- sockets --------------------------------------------------------------------------------

static int dial(const std::string &addr)
{
    auto colon = addr.rfind(':');
    sockaddr_in sa{};
    sa.sin_family = AF_INET;
    sa.sin_port = htons(static_cast<uint16_t>(std::stoi(addr.substr(colon + 1))));
    inet_pton(AF_INET, addr.substr(0, colon).c_str(), &sa.sin_addr);
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (connect(fd, reinterpret_cast<sockaddr *>(&sa), sizeof sa) != 0) {
        close(fd);
        throw std::runtime_error("connect " + addr + ": " + strerror(errno));
    }
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    return fd;
}

static void write_all(int fd, const uint8_t *p, size_t n)
{
    while (n > 0) {
        ssize_t w = send(fd, p, n, MSG_NOSIGNAL);
        if (w <= 0)
            throw std::runtime_error(std::string("write: ") + strerror(errno));
        p += w;
        n -= static_cast<size_t>(w);
    }
}

// Reads exactly n bytes into out (appending), within timeout.
static bool read_exact(int fd, Bytes &buf, size_t n, std::chrono::milliseconds timeout)
{
    auto end = std::chrono::steady_clock::now() + timeout;
    while (buf.size() < n) {
        auto left = std::chrono::duration_cast<std::chrono::milliseconds>(end - std::chrono::steady_clock::now());
        if (left.count() <= 0)
            return false;
        pollfd p{fd, POLLIN, 0};
        if (poll(&p, 1, static_cast<int>(left.count())) <= 0)
            continue;
        uint8_t tmp[65536];
        ssize_t r = recv(fd, tmp, std::min(sizeof tmp, n - buf.size()), 0);
        if (r <= 0)
            throw std::runtime_error("connection closed by the client");
        buf.insert(buf.end(), tmp, tmp + r);
    }
    return true;
}

static Bytes read_frame_fd(int fd, Bytes &pending, std::chrono::milliseconds timeout)
{
    if (!read_exact(fd, pending, 4, timeout))
        throw std::runtime_error("timed out waiting for a frame");
    uint32_t l = (uint32_t(pending[0]) << 24) | (uint32_t(pending[1]) << 16) | (uint32_t(pending[2]) << 8) | pending[3];
    if (!read_exact(fd, pending, 4 + size_t(l), timeout))
        throw std::runtime_error("timed out waiting for a frame's body");
    Bytes f(pending.begin(), pending.begin() + 4 + l);
    pending.erase(pending.begin(), pending.begin() + 4 + l);
    return f;
}

// ---- Raw ------------------------------------------------------------------------------------

Raw::Raw(const std::string &addr, const std::string &token)
{
    fd_ = dial(addr);
    tk_hello h{};
    h.version = TK_PROTOCOL_VERSION;
    RAND_bytes(h.session_id, sizeof h.session_id);
    h.session_id[0] |= 1;
    RAND_bytes(h.nonce, sizeof h.nonce);
    uint8_t hb[TK_HELLO_SIZE];
    tk_encode_hello(&h, hb);
    write_all(fd_, hb, sizeof hb);
    Bytes pending;
    Bytes ch = read_frame_fd(fd_, pending, 5000ms);
    tk_challenge c;
    size_t fl;
    if (tk_decode_challenge(ch.data(), ch.size(), &c, &fl) != TK_WIRE_OK || c.status != TK_STATUS_OK)
        throw std::runtime_error("raw: bad CHALLENGE");
    tk_auth a{};
    if (!token.empty())
        tk_client_proof(token.data(), token.size(), h.session_id, h.nonce, c.nonce, a.proof);
    uint8_t ab[TK_AUTH_SIZE];
    tk_encode_auth(&a, ab);
    write_all(fd_, ab, sizeof ab);
    Bytes w = read_frame_fd(fd_, pending, 5000ms);
    tk_welcome wl;
    if (tk_decode_welcome(w.data(), w.size(), &wl) != TK_WIRE_OK || wl.status != TK_STATUS_OK)
        throw std::runtime_error("raw: bad WELCOME");
}

Raw::~Raw()
{
    if (fd_ >= 0)
        close(fd_);
}

tk_response Raw::request(uint8_t op, const std::string &key, uint64_t token, uint32_t lease, uint32_t wait)
{
    tk_request q{};
    q.op = op;
    q.id = next_id_++;
    q.token = token;
    q.lease_ms = lease;
    q.wait_ms = wait;
    q.key = reinterpret_cast<const uint8_t *>(key.data());
    q.key_len = key.size();
    Bytes b(TK_HEADER_SIZE + key.size());
    tk_encode_request(&q, b.data(), b.size());
    write_all(fd_, b.data(), b.size());
    Bytes pending;
    for (int i = 0; i < 100; i++) {
        last_data_ = read_frame_fd(fd_, pending, 10000ms);
        tk_response r;
        size_t fl;
        if (tk_decode_response(last_data_.data(), last_data_.size(), TK_MAX_DATA_LEN, &r, &fl) != TK_WIRE_OK)
            throw std::runtime_error("raw: bad response");
        if (r.id == q.id)
            return r; // r.data points into last_data_
    }
    throw std::runtime_error("raw: no answer");
}

tk_inspect_info Raw::inspect(const std::string &key)
{
    tk_response r = request(TK_OP_INSPECT, key);
    tk_inspect_info in{};
    if (r.status != TK_STATUS_OK || r.data_len != 12)
        throw std::runtime_error("raw: INSPECT failed");
    auto u32 = [&](int o) {
        return (uint32_t(r.data[o]) << 24) | (uint32_t(r.data[o + 1]) << 16) | (uint32_t(r.data[o + 2]) << 8) | r.data[o + 3];
    };
    in.lease_left_ms = r.lease_ms;
    in.waiters = r.detail;
    in.held_for_ms = u32(0);
    in.lock_delay_ms = u32(4);
    in.flags = u32(8);
    in.held = (in.flags & TK_INSPECT_HELD) != 0;
    in.token = r.token;
    return in;
}

uint64_t Raw::acquire(const std::string &key, uint32_t lease_ms)
{
    tk_response r = request(TK_OP_ACQUIRE, key, 0, lease_ms, 0);
    return r.status == TK_STATUS_OK ? r.token : 0;
}

bool Raw::release(const std::string &key, uint64_t token)
{
    return request(TK_OP_RELEASE, key, token).status == TK_STATUS_OK;
}

// ---- the fake server ------------------------------------------------------------------------

FakeServer::FakeServer()
{
    fd_ = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    int one = 1;
    setsockopt(fd_, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    sockaddr_in sa{};
    sa.sin_family = AF_INET;
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (bind(fd_, reinterpret_cast<sockaddr *>(&sa), sizeof sa) != 0 || listen(fd_, 16) != 0)
        throw std::runtime_error("fake server: bind/listen failed");
    socklen_t sl = sizeof sa;
    getsockname(fd_, reinterpret_cast<sockaddr *>(&sa), &sl);
    port_ = ntohs(sa.sin_port);
}

FakeServer::~FakeServer() { close(fd_); }

bool FakeServer::pending(std::chrono::milliseconds timeout)
{
    pollfd p{fd_, POLLIN, 0};
    return poll(&p, 1, static_cast<int>(timeout.count())) > 0;
}

std::unique_ptr<FakeConn> FakeServer::accept(std::chrono::milliseconds timeout)
{
    pollfd p{fd_, POLLIN, 0};
    if (poll(&p, 1, static_cast<int>(timeout.count())) <= 0)
        throw std::runtime_error("fake server: no connection within the timeout");
    int c = ::accept4(fd_, nullptr, nullptr, SOCK_CLOEXEC);
    if (c < 0)
        throw std::runtime_error("fake server: accept failed");
    int one = 1;
    setsockopt(c, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    return std::make_unique<FakeConn>(c);
}

FakeConn::~FakeConn() { close(); }

void FakeConn::close()
{
    if (fd_ >= 0)
        ::close(fd_);
    fd_ = -1;
}

Bytes FakeConn::read_frame(std::chrono::milliseconds timeout) { return read_frame_fd(fd_, buf_, timeout); }

tk_hello FakeConn::read_hello()
{
    Bytes f = read_frame();
    tk_hello h;
    if (tk_decode_hello(f.data(), f.size(), &h) != TK_WIRE_OK)
        throw std::runtime_error("fake: expected HELLO");
    return h;
}

void FakeConn::send_challenge(uint8_t status, uint8_t flags, const std::string &data, const uint8_t *nonce, uint32_t detail)
{
    tk_challenge c{};
    c.status = status;
    c.version = TK_PROTOCOL_VERSION;
    c.flags = flags;
    c.detail = detail;
    if (nonce)
        memcpy(c.nonce, nonce, TK_NONCE_SIZE);
    c.data = reinterpret_cast<const uint8_t *>(data.data());
    c.data_len = data.size();
    Bytes b(TK_CHALLENGE_SIZE + data.size());
    tk_encode_challenge(&c, b.data(), b.size());
    send_raw(b);
}

tk_auth FakeConn::read_auth()
{
    Bytes f = read_frame();
    tk_auth a;
    if (tk_decode_auth(f.data(), f.size(), &a) != TK_WIRE_OK)
        throw std::runtime_error("fake: expected AUTH");
    return a;
}

void FakeConn::send_welcome(const uint8_t state[16], bool resumed, uint32_t grace_ms, uint8_t status, const uint8_t *proof)
{
    tk_welcome w{};
    w.status = status;
    w.flags = resumed ? TK_WELCOME_RESUMED : 0;
    w.session_grace_ms = grace_ms;
    if (state)
        memcpy(w.state_id, state, 16);
    if (proof)
        memcpy(w.proof, proof, TK_PROOF_SIZE);
    uint8_t b[TK_WELCOME_SIZE];
    tk_encode_welcome(&w, b);
    send_raw(Bytes(b, b + sizeof b));
}

tk_hello FakeConn::handshake(const uint8_t state[16], bool resumed, uint32_t grace_ms)
{
    tk_hello h = read_hello();
    send_challenge();
    read_auth();
    send_welcome(state, resumed, grace_ms);
    return h;
}

FakeConn::Req FakeConn::read_request(std::chrono::milliseconds timeout)
{
    Bytes f = read_frame(timeout);
    Req q;
    size_t fl;
    if (tk_decode_request(f.data(), f.size(), TK_MAX_KEY_LEN, &q.r, &fl) != TK_WIRE_OK)
        throw std::runtime_error("fake: malformed request");
    q.key.assign(reinterpret_cast<const char *>(q.r.key), q.r.key_len);
    q.r.key = nullptr;
    return q;
}

bool FakeConn::quiet_for(std::chrono::milliseconds d)
{
    try {
        Bytes f = read_frame(d);
        buf_.insert(buf_.begin(), f.begin(), f.end()); // put it back
        return false;
    } catch (const std::runtime_error &) {
        return true;
    }
}

bool FakeConn::has_frame()
{
    for (;;) {
        pollfd p{fd_, POLLIN, 0};
        if (poll(&p, 1, 0) <= 0)
            break;
        uint8_t tmp[65536];
        ssize_t r = recv(fd_, tmp, sizeof tmp, 0);
        if (r <= 0)
            break;
        buf_.insert(buf_.end(), tmp, tmp + r);
    }
    if (buf_.size() < 4)
        return false;
    uint32_t l = (uint32_t(buf_[0]) << 24) | (uint32_t(buf_[1]) << 16) | (uint32_t(buf_[2]) << 8) | buf_[3];
    return buf_.size() >= 4 + size_t(l);
}

void FakeConn::respond(const Req &q, uint8_t status, uint64_t token, uint32_t lease, uint32_t detail, const std::string &data)
{
    tk_response r{};
    r.op = q.r.op;
    r.status = status;
    r.id = q.r.id;
    r.token = token;
    r.lease_ms = lease;
    r.detail = detail;
    r.data = reinterpret_cast<const uint8_t *>(data.data());
    r.data_len = data.size();
    Bytes b(TK_HEADER_SIZE + data.size());
    tk_encode_response(&r, b.data(), b.size());
    send_raw(b);
}

void FakeConn::push(uint8_t op, uint64_t token, uint32_t detail, const std::string &data)
{
    tk_response r{};
    r.op = op;
    r.token = token;
    r.detail = detail;
    r.data = reinterpret_cast<const uint8_t *>(data.data());
    r.data_len = data.size();
    Bytes b(TK_HEADER_SIZE + data.size());
    tk_encode_response(&r, b.data(), b.size());
    send_raw(b);
}

void FakeConn::send_raw(const Bytes &b) { write_all(fd_, b.data(), b.size()); }

bool FakeConn::closed_by_peer(std::chrono::milliseconds timeout)
{
    auto end = std::chrono::steady_clock::now() + timeout;
    while (std::chrono::steady_clock::now() < end) {
        pollfd p{fd_, POLLIN, 0};
        if (poll(&p, 1, 20) <= 0)
            continue;
        uint8_t tmp[4096];
        ssize_t r = recv(fd_, tmp, sizeof tmp, 0);
        if (r <= 0)
            return true;
        buf_.insert(buf_.end(), tmp, tmp + r);
    }
    return false;
}

// ---- proxy --------------------------------------------------------------------------------

Proxy::Proxy(const std::string &upstream) : upstream_(upstream)
{
    lfd_ = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    sockaddr_in sa{};
    sa.sin_family = AF_INET;
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (bind(lfd_, reinterpret_cast<sockaddr *>(&sa), sizeof sa) != 0 || listen(lfd_, 64) != 0)
        throw std::runtime_error("proxy: bind/listen failed");
    socklen_t sl = sizeof sa;
    getsockname(lfd_, reinterpret_cast<sockaddr *>(&sa), &sl);
    port_ = ntohs(sa.sin_port);
    if (pipe2(wake_, O_CLOEXEC | O_NONBLOCK) != 0)
        throw std::runtime_error("proxy: pipe failed");
    t_ = std::thread([this] { loop(); });
}

Proxy::~Proxy()
{
    {
        std::lock_guard<std::mutex> g(mu_);
        stop_ = true;
    }
    char b = 1;
    ssize_t n = write(wake_[1], &b, 1);
    (void)n;
    t_.join();
    close(lfd_);
    close(wake_[0]);
    close(wake_[1]);
}

void Proxy::cut()
{
    std::lock_guard<std::mutex> g(mu_);
    cut_ = true;
    char b = 1;
    ssize_t n = write(wake_[1], &b, 1);
    (void)n;
}

void Proxy::hold_downstream(bool hold)
{
    std::lock_guard<std::mutex> g(mu_);
    hold_ = hold;
    char b = 1;
    ssize_t n = write(wake_[1], &b, 1);
    (void)n;
}

int Proxy::connections()
{
    std::lock_guard<std::mutex> g(mu_);
    return accepted_;
}

void Proxy::loop()
{
    struct Pair {
        int client, server;
        Bytes held; // server->client bytes held back
    };
    std::vector<Pair> pairs;
    auto reset = [](int fd) {
        linger lg{1, 0}; // close with RST
        setsockopt(fd, SOL_SOCKET, SO_LINGER, &lg, sizeof lg);
        close(fd);
    };
    for (int iter = 0; iter < 100000000; iter++) {
        bool hold;
        {
            std::lock_guard<std::mutex> g(mu_);
            if (stop_)
                break;
            if (cut_) {
                for (auto &p : pairs) {
                    reset(p.client);
                    reset(p.server);
                }
                pairs.clear();
                cut_ = false;
            }
            hold = hold_;
        }
        if (!hold) { // bytes held earlier go out as soon as holding stops
            for (auto &p : pairs) {
                if (!p.held.empty() && send(p.client, p.held.data(), p.held.size(), MSG_NOSIGNAL) >= 0)
                    p.held.clear();
            }
        }
        std::vector<pollfd> fds;
        fds.push_back({wake_[0], POLLIN, 0});
        fds.push_back({lfd_, POLLIN, 0});
        for (auto &p : pairs) {
            fds.push_back({p.client, POLLIN, 0});
            fds.push_back({p.server, POLLIN, 0});
        }
        if (poll(fds.data(), fds.size(), 200) <= 0)
            continue;
        if (fds[0].revents & POLLIN) {
            char buf[64];
            while (read(wake_[0], buf, sizeof buf) > 0) {
            }
        }
        if (fds[1].revents & POLLIN) {
            int c = accept4(lfd_, nullptr, nullptr, SOCK_CLOEXEC);
            if (c >= 0) {
                try {
                    int sfd = dial(upstream_);
                    int one = 1;
                    setsockopt(c, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
                    pairs.push_back({c, sfd, {}});
                    std::lock_guard<std::mutex> g(mu_);
                    accepted_++;
                } catch (const std::exception &) {
                    close(c);
                }
            }
        }
        std::set<size_t> dead;
        for (size_t i = 0; i < pairs.size() && 2 + 2 * i + 1 < fds.size(); i++) {
            Pair &p = pairs[i];
            uint8_t buf[65536];
            if (fds[2 + 2 * i].revents & (POLLIN | POLLHUP | POLLERR)) {
                ssize_t n = recv(p.client, buf, sizeof buf, 0);
                if (n <= 0 || send(p.server, buf, static_cast<size_t>(n), MSG_NOSIGNAL) != n)
                    dead.insert(i);
            }
            if (fds[2 + 2 * i + 1].revents & (POLLIN | POLLHUP | POLLERR)) {
                ssize_t n = recv(p.server, buf, sizeof buf, 0);
                if (n <= 0)
                    dead.insert(i);
                else
                    p.held.insert(p.held.end(), buf, buf + n);
            }
            if (!hold && !p.held.empty()) {
                if (send(p.client, p.held.data(), p.held.size(), MSG_NOSIGNAL) != ssize_t(p.held.size()))
                    dead.insert(i);
                p.held.clear();
            }
        }
        for (auto it = dead.rbegin(); it != dead.rend(); ++it) {
            close(pairs[*it].client);
            close(pairs[*it].server);
            pairs.erase(pairs.begin() + static_cast<long>(*it));
        }
    }
    for (auto &p : pairs) {
        close(p.client);
        close(p.server);
    }
}

// ---- certificates ---------------------------------------------------------------------------

namespace {
struct Issued {
    EVP_PKEY *key;
    X509 *cert;
};

void add_ext(X509 *issuer, X509 *cert, int nid, const char *value)
{
    X509V3_CTX ctx;
    X509V3_set_ctx(&ctx, issuer ? issuer : cert, cert, nullptr, nullptr, 0);
    X509_EXTENSION *ex = X509V3_EXT_conf_nid(nullptr, &ctx, nid, value);
    if (!ex)
        throw std::runtime_error("certificate extension failed");
    X509_add_ext(cert, ex, -1);
    X509_EXTENSION_free(ex);
}

Issued issue(const char *cn, const Issued *ca, bool is_ca, bool server)
{
    static long serial = 1;
    EVP_PKEY *key = EVP_EC_gen("P-256");
    X509 *x = X509_new();
    X509_set_version(x, 2);
    ASN1_INTEGER_set(X509_get_serialNumber(x), serial++ + time(nullptr) % 100000 * 100);
    X509_gmtime_adj(X509_getm_notBefore(x), -3600);
    X509_gmtime_adj(X509_getm_notAfter(x), 86400);
    X509_set_pubkey(x, key);
    X509_NAME *name = X509_get_subject_name(x);
    X509_NAME_add_entry_by_txt(name, "CN", MBSTRING_ASC, reinterpret_cast<const unsigned char *>(cn), -1, -1, 0);
    X509_set_issuer_name(x, ca ? X509_get_subject_name(ca->cert) : name);
    if (is_ca) {
        add_ext(nullptr, x, NID_basic_constraints, "critical,CA:TRUE");
        add_ext(nullptr, x, NID_key_usage, "critical,keyCertSign,cRLSign");
    } else {
        add_ext(ca->cert, x, NID_basic_constraints, "critical,CA:FALSE");
        add_ext(ca->cert, x, NID_key_usage, "critical,digitalSignature");
        add_ext(ca->cert, x, NID_ext_key_usage, server ? "serverAuth" : "clientAuth");
        if (server)
            add_ext(ca->cert, x, NID_subject_alt_name, "IP:127.0.0.1,DNS:localhost");
    }
    X509_sign(x, ca ? ca->key : key, EVP_sha256());
    return {key, x};
}

void write_pem(const std::string &path, X509 *cert, EVP_PKEY *key)
{
    FILE *f = fopen(path.c_str(), "w");
    if (!f)
        throw std::runtime_error("cannot write " + path);
    if (cert)
        PEM_write_X509(f, cert);
    if (key)
        PEM_write_PrivateKey(f, key, nullptr, nullptr, 0, nullptr, nullptr);
    fclose(f);
    chmod(path.c_str(), 0600);
}
} // namespace

Certs::Certs()
{
    dir = make_temp_dir("tk-c-certs-");
    Issued ca = issue("ticketing test CA", nullptr, true, false);
    Issued other = issue("another CA", nullptr, true, false);
    Issued srv = issue("localhost", &ca, false, true);
    Issued cli = issue("test client", &ca, false, false);
    this->ca = dir + "/ca.pem";
    other_ca = dir + "/other-ca.pem";
    server_cert = dir + "/server.pem";
    server_key = dir + "/server-key.pem";
    client_cert = dir + "/client.pem";
    client_key = dir + "/client-key.pem";
    write_pem(this->ca, ca.cert, nullptr);
    write_pem(other_ca, other.cert, nullptr);
    write_pem(server_cert, srv.cert, nullptr);
    write_pem(server_key, nullptr, srv.key);
    write_pem(client_cert, cli.cert, nullptr);
    write_pem(client_key, nullptr, cli.key);
    for (Issued *i : {&ca, &other, &srv, &cli}) {
        X509_free(i->cert);
        EVP_PKEY_free(i->key);
    }
}

Certs::~Certs() { remove_tree(dir); }

// ---- clients --------------------------------------------------------------------------------

tk_client *connect_or_die(const std::string &addr, const std::function<void(tk_options &)> &tweak)
{
    const char *eps[] = {addr.c_str()};
    tk_options o{};
    o.endpoints = eps;
    o.n_endpoints = 1;
    if (getenv("TK_TEST_LOG")) {
        o.log = [](int level, const char *msg, void *) { fprintf(stderr, "[tk %d] %s\n", level, msg); };
    }
    if (tweak)
        tweak(o);
    tk_client *c = nullptr;
    tk_error e;
    tk_err rc = tk_client_connect(&o, &c, &e);
    EXPECT_EQ(rc, TK_OK) << e.message;
    if (rc != TK_OK)
        throw std::runtime_error(std::string("connect failed: ") + e.message);
    return c;
}

void LostLog::cb(tk_lock *l, tk_lost_reason r, void *data)
{
    auto *self = static_cast<LostLog *>(data);
    std::lock_guard<std::mutex> g(self->mu);
    self->events.emplace_back(tk_lock_token(l), r);
}

size_t LostLog::count()
{
    std::lock_guard<std::mutex> g(mu);
    return events.size();
}

tk_lost_reason LostLog::reason_of(uint64_t token)
{
    std::lock_guard<std::mutex> g(mu);
    for (auto &e : events)
        if (e.first == token)
            return e.second;
    return TK_LOST_NONE;
}

} // namespace tt
