// The conformance driver of the C/C++ client (tests/conformance/DRIVER.md): JSON commands on
// stdin, one per line; replies and events on stdout, one per line. Every command runs on its own
// thread, on top of the public C++ API (ticketing.hpp); all checking happens in the runner.
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <iostream>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "ticketing/ticketing.hpp"

using json = nlohmann::json;
namespace tk = ticketing;
using std::chrono::milliseconds;

namespace {

std::mutex out_mu;

void emit(const json &j)
{
    std::string line = j.dump();
    std::lock_guard<std::mutex> g(out_mu);
    std::fwrite(line.data(), 1, line.size(), stdout);
    std::fputc('\n', stdout);
    std::fflush(stdout);
}

const char *reason_name(tk::LostReason r)
{
    switch (r) {
    case tk::LostReason::Expired: return "expired";
    case tk::LostReason::NotHeld: return "not_held";
    case tk::LostReason::ServerRestarted: return "server_restarted";
    case tk::LostReason::ServerStopping: return "server_stopping";
    }
    return "expired";
}

struct LockEntry {
    tk::Lock lock;
};

struct State {
    std::mutex mu;
    std::map<std::string, std::shared_ptr<tk::Client>> clients;
    std::map<std::string, std::shared_ptr<LockEntry>> locks;
    std::map<int64_t, std::shared_ptr<tk::PendingAcquire>> pending; // command id -> acquire
    std::condition_variable idle;                                    // running reaches 0
    int running = 0;                                                 // commands in progress
} st;

// A failure reply that names the runner's error kind.
struct Failure {
    std::string kind, message, reason;
};

std::shared_ptr<tk::Client> client_of(const json &c)
{
    std::lock_guard<std::mutex> g(st.mu);
    auto it = st.clients.find(c.at("client").get<std::string>());
    if (it == st.clients.end())
        throw Failure{"closed", "no such client (closed or reset)", ""};
    return it->second;
}

std::shared_ptr<LockEntry> lock_of(const json &c)
{
    std::lock_guard<std::mutex> g(st.mu);
    auto it = st.locks.find(c.at("lock").get<std::string>());
    if (it == st.locks.end())
        throw Failure{"other", "no such lock handle", ""};
    return it->second;
}

std::string key_of(const json &c)
{
    if (c.contains("key_hex") && !c.at("key_hex").is_null()) {
        std::string hex = c.at("key_hex"), out;
        for (size_t i = 0; i + 1 < hex.size(); i += 2)
            out.push_back(static_cast<char>(std::stoi(hex.substr(i, 2), nullptr, 16)));
        return out;
    }
    return c.at("key").get<std::string>();
}

milliseconds ms_of(const json &v) { return milliseconds(v.get<int64_t>()); }

std::string hex16(const std::array<uint8_t, 16> &b)
{
    static const char d[] = "0123456789abcdef";
    std::string s;
    for (uint8_t x : b) {
        s += d[x >> 4];
        s += d[x & 15];
    }
    return s;
}

json do_connect(const json &c)
{
    tk::Options o;
    o.endpoints.clear();
    for (const auto &e : c.at("endpoints"))
        o.endpoints.push_back(e.get<std::string>());
    if (c.contains("token") && !c.at("token").is_null())
        o.token = c.at("token").get<std::string>();
    if (c.contains("tls") && !c.at("tls").is_null()) {
        const json &t = c.at("tls");
        tk::TlsOptions tls;
        auto str = [&](const char *k) { return t.contains(k) && !t.at(k).is_null() ? t.at(k).get<std::string>() : ""; };
        tls.ca_file = str("ca");
        tls.cert_file = str("cert");
        tls.key_file = str("key");
        tls.server_name = str("server_name");
        o.tls = tls;
    }
    if (c.contains("request_timeout_ms") && !c.at("request_timeout_ms").is_null())
        o.request_timeout = ms_of(c.at("request_timeout_ms"));
    if (c.contains("heartbeat_ms") && !c.at("heartbeat_ms").is_null())
        o.heartbeat = ms_of(c.at("heartbeat_ms"));
    if (c.contains("dial_timeout_ms") && !c.at("dial_timeout_ms").is_null())
        o.dial_timeout = ms_of(c.at("dial_timeout_ms"));
    auto client = std::make_shared<tk::Client>(o);
    std::string sid = hex16(client->session_id());
    {
        std::lock_guard<std::mutex> g(st.mu);
        st.clients[c.at("client").get<std::string>()] = client;
    }
    return {{"session_id", sid}};
}

json do_acquire(const json &c, int64_t id)
{
    auto client = client_of(c);
    std::string name = c.at("lock");
    tk::AcquireOptions o;
    if (c.contains("wait_ms") && !c.at("wait_ms").is_null())
        o.wait = ms_of(c.at("wait_ms"));
    o.keepalive = c.value("keepalive", false);
    o.refuse_held = c.value("refuse_held", false);
    o.on_lost = [name](tk::LostReason r) { emit({{"event", "lost"}, {"lock", name}, {"reason", reason_name(r)}}); };
    auto p = std::make_shared<tk::PendingAcquire>(client->acquire_async(key_of(c), ms_of(c.at("lease_ms")), o));
    {
        std::lock_guard<std::mutex> g(st.mu);
        st.pending[id] = p;
    }
    struct Forget {
        int64_t id;
        ~Forget()
        {
            std::lock_guard<std::mutex> g(st.mu);
            st.pending.erase(id);
        }
    } forget{id};
    auto entry = std::make_shared<LockEntry>();
    entry->lock = p->get();
    json r = {{"token", std::to_string(entry->lock.token())}, {"lease_ms", entry->lock.lease().count()}};
    std::lock_guard<std::mutex> g(st.mu);
    st.locks[name] = entry;
    return r;
}

json do_try_acquire(const json &c)
{
    auto client = client_of(c);
    std::string name = c.at("lock");
    tk::AcquireOptions o;
    o.on_lost = [name](tk::LostReason r) { emit({{"event", "lost"}, {"lock", name}, {"reason", reason_name(r)}}); };
    auto l = client->try_acquire(key_of(c), ms_of(c.at("lease_ms")), o);
    if (!l)
        return {{"acquired", false}};
    auto entry = std::make_shared<LockEntry>();
    entry->lock = std::move(*l);
    json r = {{"acquired", true}, {"token", std::to_string(entry->lock.token())}};
    std::lock_guard<std::mutex> g(st.mu);
    st.locks[name] = entry;
    return r;
}

json do_cancel(const json &c)
{
    int64_t target = c.at("target");
    std::shared_ptr<tk::PendingAcquire> p;
    {
        std::lock_guard<std::mutex> g(st.mu);
        auto it = st.pending.find(target);
        if (it != st.pending.end())
            p = it->second;
    }
    if (p)
        p->cancel(); // false when it completed meanwhile: its reply stands
    return json::object();
}

json do_with_lock(const json &c)
{
    auto client = client_of(c);
    milliseconds hold = ms_of(c.at("hold_ms"));
    client->with_lock(key_of(c), ms_of(c.at("lease_ms")), [hold] { std::this_thread::sleep_for(hold); });
    return json::object();
}

json do_reset()
{
    std::map<std::string, std::shared_ptr<tk::Client>> clients;
    std::map<std::string, std::shared_ptr<LockEntry>> locks;
    {
        std::lock_guard<std::mutex> g(st.mu);
        clients.swap(st.clients);
        locks.swap(st.locks);
    }
    for (auto &kv : clients)
        kv.second->close(); // locks are not released
    locks.clear();
    clients.clear();
    return json::object();
}

json run(const json &c, int64_t id)
{
    std::string op = c.at("op");
    if (op == "hello")
        return {{"language", "c"},
                {"client_version", TK_VERSION},
                {"features",
                 {"locks", "cancel", "keepalive", "with_lock", "verify", "refuse_held", "tls", "mtls", "request_timeout",
                  "lost_events", "connect_election"}}};
    if (op == "connect")
        return do_connect(c);
    if (op == "close") {
        std::shared_ptr<tk::Client> client;
        {
            std::lock_guard<std::mutex> g(st.mu);
            auto it = st.clients.find(c.at("client").get<std::string>());
            if (it != st.clients.end()) {
                client = it->second;
                st.clients.erase(it);
            }
        }
        if (client)
            client->close();
        return json::object();
    }
    if (op == "acquire")
        return do_acquire(c, id);
    if (op == "try_acquire")
        return do_try_acquire(c);
    if (op == "cancel")
        return do_cancel(c);
    if (op == "release") {
        lock_of(c)->lock.release();
        return json::object();
    }
    if (op == "extend")
        return {{"lease_ms", lock_of(c)->lock.extend(ms_of(c.at("lease_ms"))).count()}};
    if (op == "lock_state") {
        auto e = lock_of(c);
        auto lost = e->lock.lost();
        json r = {{"lost", lost.has_value()}, {"token", std::to_string(e->lock.token())},
                  {"deadline_in_ms", e->lock.deadline_in().count() / 1000.0}};
        if (lost)
            r["reason"] = reason_name(*lost);
        return r;
    }
    if (op == "verify")
        return {{"held", lock_of(c)->lock.verify()}};
    if (op == "release_token") {
        uint64_t token = std::stoull(c.at("token").get<std::string>());
        client_of(c)->release(key_of(c), token);
        return json::object();
    }
    if (op == "inspect") {
        tk::KeyInfo k = client_of(c)->inspect(key_of(c));
        return {{"held", k.held}, {"waiters", k.waiters}, {"lease_left_ms", k.lease_left.count()}};
    }
    if (op == "ping") {
        client_of(c)->ping();
        return json::object();
    }
    if (op == "with_lock")
        return do_with_lock(c);
    if (op == "reset")
        return do_reset();
    throw Failure{"other", "unknown op " + op, ""};
}

void handle(const json &c)
{
    int64_t id = c.value("id", int64_t(0));
    json reply;
    try {
        json r = run(c, id);
        reply = {{"id", id}, {"ok", true}};
        for (auto it = r.begin(); it != r.end(); ++it)
            reply[it.key()] = it.value();
    } catch (const tk::LockLost &e) {
        reply = {{"id", id},
                 {"ok", false},
                 {"error", {{"kind", "lock_lost"}, {"message", e.what()}, {"reason", reason_name(e.reason())}}}};
    } catch (const tk::Error &e) {
        reply = {{"id", id}, {"ok", false}, {"error", {{"kind", e.kind()}, {"message", e.what()}}}};
    } catch (const Failure &f) {
        reply = {{"id", id}, {"ok", false}, {"error", {{"kind", f.kind}, {"message", f.message}}}};
    } catch (const std::exception &e) {
        reply = {{"id", id}, {"ok", false}, {"error", {{"kind", "other"}, {"message", e.what()}}}};
    }
    emit(reply);
}

} // namespace

int main()
{
    std::ios::sync_with_stdio(false);
    std::string line;
    bool exiting = false;
    while (!exiting && std::getline(std::cin, line)) {
        if (line.empty())
            continue;
        json c;
        try {
            c = json::parse(line);
        } catch (const std::exception &e) {
            std::fprintf(stderr, "driver: bad command line: %s\n", e.what());
            continue;
        }
        if (c.value("op", "") == "exit") {
            handle(json{{"id", c.value("id", int64_t(0))}, {"op", "reset"}});
            exiting = true;
            break;
        }
        {
            std::lock_guard<std::mutex> g(st.mu);
            st.running++;
        }
        std::thread([c] {
            handle(c);
            std::lock_guard<std::mutex> g(st.mu);
            if (--st.running == 0)
                st.idle.notify_all();
        }).detach();
    }
    do_reset(); // closing every client ends every call still waiting
    std::unique_lock<std::mutex> g(st.mu);
    if (!st.idle.wait_for(g, std::chrono::seconds(10), [] { return st.running == 0; }))
        std::_Exit(0); // a command still sleeps (with_lock): its reply no longer matters
    return 0;
}
