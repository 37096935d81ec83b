// The codec against protocol/vectors.json and the code tables against protocol/constants.json,
// both read at test time: every vector is encoded and decoded, both proofs computed, every
// malformed frame rejected, and every code of constants.json matched by this library.
#include <cstring>
#include <map>
#include <set>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "support.h"
#include "ticketing/wire.h"

using json = nlohmann::json;
using tt::Bytes;
using tt::from_hex;
using tt::to_hex;

namespace {

const json &vectors()
{
    static json j = json::parse(tt::read_file(tt::repo_root() + "/protocol/vectors.json"));
    return j;
}

const json &constants()
{
    static json j = json::parse(tt::read_file(tt::repo_root() + "/protocol/constants.json"));
    return j;
}

uint64_t u64(const json &v) { return std::stoull(v.get<std::string>()); }

// The library's code tables, by the names of constants.json.
const std::map<std::string, std::map<std::string, unsigned>> &our_tables()
{
    static const std::map<std::string, std::map<std::string, unsigned>> t = {
        {"ops",
         {{"HELLO", TK_OP_HELLO}, {"CHALLENGE", TK_OP_CHALLENGE}, {"AUTH", TK_OP_AUTH}, {"WELCOME", TK_OP_WELCOME},
          {"ACQUIRE", TK_OP_ACQUIRE}, {"RELEASE", TK_OP_RELEASE}, {"EXTEND", TK_OP_EXTEND}, {"CANCEL", TK_OP_CANCEL},
          {"PING", TK_OP_PING}, {"INSPECT", TK_OP_INSPECT}, {"ACK", TK_OP_ACK}, {"EXPIRED", TK_OP_EXPIRED},
          {"GOAWAY", TK_OP_GOAWAY}}},
        {"statuses",
         {{"OK", TK_STATUS_OK}, {"TIMED_OUT", TK_STATUS_TIMED_OUT}, {"NOT_HELD", TK_STATUS_NOT_HELD},
          {"INVALID", TK_STATUS_INVALID}, {"NOT_LEADER", TK_STATUS_NOT_LEADER}, {"BUSY", TK_STATUS_BUSY},
          {"SHUTTING_DOWN", TK_STATUS_SHUTTING_DOWN}, {"AUTH_FAILED", TK_STATUS_AUTH_FAILED},
          {"UNSUPPORTED_VERSION", TK_STATUS_UNSUPPORTED_VERSION}, {"CANCELLED", TK_STATUS_CANCELLED}}},
        {"invalid_fields",
         {{"LENGTH", TK_FIELD_LENGTH}, {"OP", TK_FIELD_OP}, {"FLAGS", TK_FIELD_FLAGS}, {"KEY", TK_FIELD_KEY},
          {"LEASE", TK_FIELD_LEASE}, {"WAIT", TK_FIELD_WAIT}, {"TOKEN", TK_FIELD_TOKEN},
          {"REQUEST_ID", TK_FIELD_REQUEST_ID}, {"HANDSHAKE", TK_FIELD_HANDSHAKE}, {"SESSION", TK_FIELD_SESSION}}},
        {"busy_limits",
         {{"CONNECTIONS", TK_LIMIT_CONNECTIONS}, {"WAITERS_PER_KEY", TK_LIMIT_WAITERS_PER_KEY},
          {"WAITERS_TOTAL", TK_LIMIT_WAITERS_TOTAL}, {"LOCKS", TK_LIMIT_LOCKS}, {"INFLIGHT", TK_LIMIT_INFLIGHT},
          {"STORAGE", TK_LIMIT_STORAGE}, {"SESSIONS", TK_LIMIT_SESSIONS}}},
        {"expired_reasons", {{"LEASE", TK_EXPIRED_LEASE}, {"STOPPING", TK_EXPIRED_STOPPING}}},
        {"goaway_reasons", {{"LEADERSHIP", TK_GOAWAY_LEADERSHIP}, {"STOPPING", TK_GOAWAY_STOPPING}}},
        {"inspect_flags",
         {{"HELD", TK_INSPECT_HELD}, {"TOKEN_MATCH", TK_INSPECT_TOKEN_MATCH}, {"SESSION", TK_INSPECT_SESSION},
          {"STALLED", TK_INSPECT_STALLED}, {"STARTUP", TK_INSPECT_STARTUP}}},
    };
    return t;
}

const char *name_of(const std::string &table, unsigned v)
{
    if (table == "ops")
        return tk_op_name(v);
    if (table == "statuses")
        return tk_status_name(v);
    if (table == "invalid_fields")
        return tk_invalid_field_name(v);
    if (table == "busy_limits")
        return tk_busy_limit_name(v);
    if (table == "expired_reasons")
        return tk_expired_reason_name(v);
    if (table == "goaway_reasons")
        return tk_goaway_reason_name(v);
    if (table == "inspect_flags")
        return tk_inspect_flag_name(v);
    return nullptr;
}

unsigned op_value(const std::string &name)
{
    if (name.rfind("0x", 0) == 0)
        return static_cast<unsigned>(std::stoul(name, nullptr, 16));
    auto &ops = our_tables().at("ops");
    auto it = ops.find(name);
    if (it == ops.end())
        throw std::runtime_error("unknown op " + name);
    return it->second;
}

unsigned status_value(const std::string &name) { return our_tables().at("statuses").at(name); }

} // namespace

TEST(Constants, EveryCodeTableMatchesConstantsJson)
{
    const json &c = constants();
    EXPECT_EQ(c.at("version").get<int>(), TK_PROTOCOL_VERSION);
    for (const auto &[table, ours] : our_tables()) {
        SCOPED_TRACE(table);
        const json &entries = c.at(table);
        std::set<std::string> seen;
        for (const json &e : entries) {
            std::string name = e.at("name");
            unsigned value = e.at("value");
            seen.insert(name);
            ASSERT_TRUE(ours.count(name)) << table << " lacks " << name;
            EXPECT_EQ(ours.at(name), value) << name;
            const char *n = name_of(table, value);
            ASSERT_NE(n, nullptr) << name;
            EXPECT_STREQ(n, name.c_str());
        }
        for (const auto &[name, value] : ours)
            EXPECT_TRUE(seen.count(name)) << table << " has " << name << " (" << value << ") not in constants.json";
    }
}

TEST(Constants, SizesAndClientRulesMatchConstantsJson)
{
    const std::map<std::string, uint64_t> sizes = {
        {"AUTH", TK_AUTH_SIZE}, {"CHALLENGE", TK_CHALLENGE_SIZE}, {"CHALLENGE_AUTH_REQUIRED", TK_CHALLENGE_AUTH_REQUIRED},
        {"HEADER", TK_HEADER_SIZE}, {"HELLO", TK_HELLO_SIZE}, {"INSPECT_DATA", TK_INSPECT_DATA_SIZE},
        {"MAX_CHALLENGE_DATA", TK_MAX_CHALLENGE_DATA}, {"MAX_DATA_LEN", TK_MAX_DATA_LEN}, {"MAX_KEY_LEN", TK_MAX_KEY_LEN},
        {"NONCE", TK_NONCE_SIZE}, {"PROOF", TK_PROOF_SIZE}, {"SESSION_ID", TK_SESSION_ID_SIZE},
        {"STATE_ID", TK_STATE_ID_SIZE}, {"WAIT_FOREVER", TK_WAIT_FOREVER_MS}, {"WELCOME", TK_WELCOME_SIZE},
        {"WELCOME_RESUMED", TK_WELCOME_RESUMED}};
    const json &js = constants().at("sizes");
    EXPECT_EQ(js.size(), sizes.size());
    for (auto it = js.begin(); it != js.end(); ++it) {
        ASSERT_TRUE(sizes.count(it.key())) << "sizes." << it.key() << " unknown to this client";
        EXPECT_EQ(sizes.at(it.key()), it.value().get<uint64_t>()) << it.key();
    }
    const json &rules = constants().at("client_rules");
    EXPECT_EQ(rules.at("ACK_EVERY").get<int>(), TK_ACK_EVERY);
    EXPECT_EQ(rules.at("CLOCK_RATE_BOUND_PPM").get<int>(), TK_CLOCK_RATE_BOUND_PPM);
    EXPECT_EQ(rules.at("LOST_CHECK_MS").get<int>(), TK_LOST_CHECK_MS);
    EXPECT_EQ(rules.at("LOST_MARGIN_MS").get<int>(), TK_LOST_MARGIN_MS);
    EXPECT_EQ(rules.size(), 4u);
}

TEST(Vectors, EveryRequestEncodesAndDecodes)
{
    const json &list = vectors().at("requests");
    ASSERT_FALSE(list.empty());
    for (const json &v : list) {
        SCOPED_TRACE(v.at("name").get<std::string>());
        const json &f = v.at("fields");
        Bytes key = from_hex(f.at("key_hex"));
        tk_request q{};
        q.op = static_cast<uint8_t>(op_value(f.at("op")));
        q.flags = f.at("flags").get<uint8_t>();
        q.id = u64(f.at("id"));
        q.token = u64(f.at("token"));
        q.lease_ms = f.at("lease_ms").get<uint32_t>();
        q.wait_ms = f.at("wait_ms").get<uint32_t>();
        q.key = key.data();
        q.key_len = key.size();
        Bytes out(tk_encode_request(&q, nullptr, 0));
        ASSERT_EQ(tk_encode_request(&q, out.data(), out.size()), out.size());
        EXPECT_EQ(to_hex(out), v.at("hex").get<std::string>());

        Bytes in = from_hex(v.at("hex"));
        tk_request d{};
        size_t fl = 0;
        ASSERT_EQ(tk_decode_request(in.data(), in.size(), TK_MAX_KEY_LEN, &d, &fl), TK_WIRE_OK);
        EXPECT_EQ(fl, in.size());
        EXPECT_EQ(d.op, q.op);
        EXPECT_EQ(d.flags, q.flags);
        EXPECT_EQ(d.id, q.id);
        EXPECT_EQ(d.token, q.token);
        EXPECT_EQ(d.lease_ms, q.lease_ms);
        EXPECT_EQ(d.wait_ms, q.wait_ms);
        EXPECT_EQ(to_hex(d.key, d.key_len), f.at("key_hex").get<std::string>());
    }
}

TEST(Vectors, EveryResponseEncodesAndDecodes)
{
    const json &list = vectors().at("responses");
    ASSERT_FALSE(list.empty());
    for (const json &v : list) {
        SCOPED_TRACE(v.at("name").get<std::string>());
        const json &f = v.at("fields");
        Bytes data = from_hex(f.at("data_hex"));
        tk_response r{};
        r.op = static_cast<uint8_t>(op_value(f.at("op")));
        r.status = static_cast<uint8_t>(status_value(f.at("status")));
        r.id = u64(f.at("id"));
        r.token = u64(f.at("token"));
        r.lease_ms = f.at("lease_ms").get<uint32_t>();
        r.detail = f.at("detail").get<uint32_t>();
        r.data = data.data();
        r.data_len = data.size();
        Bytes out(tk_encode_response(&r, nullptr, 0));
        ASSERT_EQ(tk_encode_response(&r, out.data(), out.size()), out.size());
        EXPECT_EQ(to_hex(out), v.at("hex").get<std::string>());

        Bytes in = from_hex(v.at("hex"));
        tk_response d{};
        size_t fl = 0;
        ASSERT_EQ(tk_decode_response(in.data(), in.size(), TK_MAX_DATA_LEN, &d, &fl), TK_WIRE_OK);
        EXPECT_EQ(fl, in.size());
        EXPECT_EQ(d.op, r.op);
        EXPECT_EQ(d.status, r.status);
        EXPECT_EQ(d.id, r.id);
        EXPECT_EQ(d.token, r.token);
        EXPECT_EQ(d.lease_ms, r.lease_ms);
        EXPECT_EQ(d.detail, r.detail);
        EXPECT_EQ(to_hex(d.data, d.data_len), f.at("data_hex").get<std::string>());
    }
}

TEST(Vectors, EveryHandshakeFrameEncodesAndDecodes)
{
    const json &list = vectors().at("handshake");
    std::set<std::string> ops;
    for (const json &v : list) {
        std::string name = v.at("name");
        SCOPED_TRACE(name);
        std::string op = v.at("op");
        ops.insert(op);
        Bytes in = from_hex(v.at("hex"));
        std::string status = v.at("status");
        if (op == "HELLO") {
            tk_hello h{};
            h.version = v.at("version").get<uint8_t>();
            h.flags = v.at("flags").get<uint16_t>();
            Bytes sid = from_hex(v.at("session_id_hex")), nonce = from_hex(v.at("nonce_hex"));
            ASSERT_EQ(sid.size(), 16u);
            ASSERT_EQ(nonce.size(), 32u);
            memcpy(h.session_id, sid.data(), 16);
            memcpy(h.nonce, nonce.data(), 32);
            uint8_t out[TK_HELLO_SIZE];
            tk_encode_hello(&h, out);
            EXPECT_EQ(to_hex(out, sizeof out), v.at("hex").get<std::string>());
            tk_hello d;
            ASSERT_EQ(tk_decode_hello(in.data(), in.size(), &d), TK_WIRE_OK);
            EXPECT_EQ(d.version, h.version);
            EXPECT_EQ(d.flags, h.flags);
            EXPECT_EQ(to_hex(d.session_id, 16), v.at("session_id_hex").get<std::string>());
            EXPECT_EQ(to_hex(d.nonce, 32), v.at("nonce_hex").get<std::string>());
        } else if (op == "CHALLENGE") {
            Bytes nonce = from_hex(v.at("nonce_hex")), data = from_hex(v.at("data_hex"));
            tk_challenge c{};
            c.status = static_cast<uint8_t>(status_value(status));
            c.version = v.at("version").get<uint8_t>();
            c.flags = v.at("flags").get<uint8_t>();
            c.detail = v.at("detail").get<uint32_t>();
            if (!nonce.empty())
                memcpy(c.nonce, nonce.data(), 32);
            c.data = data.data();
            c.data_len = data.size();
            Bytes out(tk_encode_challenge(&c, nullptr, 0));
            tk_encode_challenge(&c, out.data(), out.size());
            EXPECT_EQ(to_hex(out), v.at("hex").get<std::string>());
            tk_challenge d;
            size_t fl = 0;
            ASSERT_EQ(tk_decode_challenge(in.data(), in.size(), &d, &fl), TK_WIRE_OK);
            EXPECT_EQ(fl, in.size());
            EXPECT_EQ(d.status, c.status);
            EXPECT_EQ(d.version, c.version);
            EXPECT_EQ(d.flags, c.flags);
            EXPECT_EQ(d.detail, c.detail);
            EXPECT_EQ(memcmp(d.nonce, c.nonce, 32), 0);
            EXPECT_EQ(to_hex(d.data, d.data_len), v.at("data_hex").get<std::string>());
        } else if (op == "AUTH") {
            Bytes proof = from_hex(v.at("proof_hex"));
            tk_auth a{};
            if (!proof.empty())
                memcpy(a.proof, proof.data(), 32);
            uint8_t out[TK_AUTH_SIZE];
            tk_encode_auth(&a, out);
            EXPECT_EQ(to_hex(out, sizeof out), v.at("hex").get<std::string>());
            tk_auth d;
            ASSERT_EQ(tk_decode_auth(in.data(), in.size(), &d), TK_WIRE_OK);
            EXPECT_EQ(memcmp(d.proof, a.proof, 32), 0);
        } else if (op == "WELCOME") {
            Bytes state = from_hex(v.at("state_id_hex")), proof = from_hex(v.at("proof_hex"));
            tk_welcome w{};
            w.status = static_cast<uint8_t>(status_value(status));
            w.flags = v.at("flags").get<uint8_t>();
            w.detail = v.at("detail").get<uint32_t>();
            w.session_grace_ms = v.at("session_grace_ms").get<uint32_t>();
            if (!state.empty())
                memcpy(w.state_id, state.data(), 16);
            if (!proof.empty())
                memcpy(w.proof, proof.data(), 32);
            uint8_t out[TK_WELCOME_SIZE];
            tk_encode_welcome(&w, out);
            EXPECT_EQ(to_hex(out, sizeof out), v.at("hex").get<std::string>());
            tk_welcome d;
            ASSERT_EQ(tk_decode_welcome(in.data(), in.size(), &d), TK_WIRE_OK);
            EXPECT_EQ(d.status, w.status);
            EXPECT_EQ(d.flags, w.flags);
            EXPECT_EQ(d.detail, w.detail);
            EXPECT_EQ(d.session_grace_ms, w.session_grace_ms);
            EXPECT_EQ(memcmp(d.state_id, w.state_id, 16), 0);
            EXPECT_EQ(memcmp(d.proof, w.proof, 32), 0);
        } else {
            ADD_FAILURE() << "unknown handshake op " << op;
        }
    }
    EXPECT_EQ(ops, (std::set<std::string>{"HELLO", "CHALLENGE", "AUTH", "WELCOME"}));
}

TEST(Vectors, BothAuthProofs)
{
    const json &list = vectors().at("auth");
    ASSERT_FALSE(list.empty());
    for (const json &v : list) {
        SCOPED_TRACE(v.at("name").get<std::string>());
        std::string token = v.at("token_utf8");
        Bytes sid = from_hex(v.at("session_id_hex")), cn = from_hex(v.at("client_nonce_hex")),
              sn = from_hex(v.at("server_nonce_hex")), state = from_hex(v.at("state_id_hex"));
        uint8_t proof[TK_PROOF_SIZE];
        ASSERT_EQ(tk_client_proof(token.data(), token.size(), sid.data(), cn.data(), sn.data(), proof), 0);
        EXPECT_EQ(to_hex(proof, 32), v.at("client_proof_hex").get<std::string>());
        tk_welcome w{};
        w.status = TK_STATUS_OK;
        w.flags = v.at("welcome_flags").get<uint8_t>();
        w.session_grace_ms = v.at("session_grace_ms").get<uint32_t>();
        memcpy(w.state_id, state.data(), 16);
        ASSERT_EQ(tk_server_proof(token.data(), token.size(), sid.data(), cn.data(), sn.data(), &w, proof), 0);
        EXPECT_EQ(to_hex(proof, 32), v.at("server_proof_hex").get<std::string>());
        Bytes want = from_hex(v.at("server_proof_hex"));
        EXPECT_TRUE(tk_proof_equal(proof, want.data()));
        proof[31] ^= 1;
        EXPECT_FALSE(tk_proof_equal(proof, want.data()));
    }
}

TEST(Vectors, MalformedFramesAreRejected)
{
    const json &list = vectors().at("malformed");
    ASSERT_FALSE(list.empty());
    for (const json &v : list) {
        SCOPED_TRACE(v.at("name").get<std::string>());
        Bytes in = from_hex(v.at("hex"));
        size_t max_var = v.at("max_var");
        std::string want = v.at("error");
        tk_wire_result expect = want == "short" ? TK_WIRE_SHORT : want == "length" ? TK_WIRE_LENGTH : TK_WIRE_TOO_LARGE;
        ASSERT_TRUE(want == "short" || want == "length" || want == "too_large") << want;
        size_t fl = 0;
        if (v.at("kind") == "request") {
            tk_request r;
            EXPECT_EQ(tk_decode_request(in.data(), in.size(), max_var, &r, &fl), expect);
        } else {
            tk_response r;
            EXPECT_EQ(tk_decode_response(in.data(), in.size(), max_var, &r, &fl), expect);
        }
    }
}

TEST(Vectors, FramesSplitAnywhereAreShortUntilWhole)
{
    for (const char *list : {"requests", "responses"}) {
        for (const json &v : vectors().at(list)) {
            Bytes in = from_hex(v.at("hex"));
            for (size_t n = 0; n < in.size(); n++) {
                size_t fl;
                if (std::string(list) == "requests") {
                    tk_request r;
                    ASSERT_EQ(tk_decode_request(in.data(), n, TK_MAX_KEY_LEN, &r, &fl), TK_WIRE_SHORT) << n;
                } else {
                    tk_response r;
                    ASSERT_EQ(tk_decode_response(in.data(), n, TK_MAX_DATA_LEN, &r, &fl), TK_WIRE_SHORT) << n;
                }
            }
        }
    }
}

TEST(Wire, HandshakeDecodersRejectWrongSizesAndOps)
{
    const json &list = vectors().at("handshake");
    for (const json &v : list) {
        Bytes in = from_hex(v.at("hex"));
        std::string op = v.at("op");
        SCOPED_TRACE(v.at("name").get<std::string>());
        Bytes longer = in;
        longer.push_back(0);
        Bytes wrong_op = in;
        wrong_op[4] = 0x7f;
        if (op == "HELLO") {
            tk_hello h;
            EXPECT_EQ(tk_decode_hello(in.data(), in.size() - 1, &h), TK_WIRE_SHORT);
            EXPECT_EQ(tk_decode_hello(longer.data(), longer.size(), &h), TK_WIRE_LENGTH);
            EXPECT_EQ(tk_decode_hello(wrong_op.data(), wrong_op.size(), &h), TK_WIRE_WRONG_OP);
        } else if (op == "WELCOME") {
            tk_welcome w;
            EXPECT_EQ(tk_decode_welcome(in.data(), in.size() - 1, &w), TK_WIRE_SHORT);
            EXPECT_EQ(tk_decode_welcome(wrong_op.data(), wrong_op.size(), &w), TK_WIRE_WRONG_OP);
        } else if (op == "CHALLENGE") {
            tk_challenge c;
            size_t fl;
            EXPECT_EQ(tk_decode_challenge(in.data(), in.size() - 1, &c, &fl), TK_WIRE_SHORT);
            EXPECT_EQ(tk_decode_challenge(wrong_op.data(), wrong_op.size(), &c, &fl), TK_WIRE_WRONG_OP);
            Bytes bad = in;
            bad[13] ^= 1; // data_len disagrees with the length field
            EXPECT_EQ(tk_decode_challenge(bad.data(), bad.size(), &c, &fl), TK_WIRE_LENGTH);
        } else if (op == "AUTH") {
            tk_auth a;
            EXPECT_EQ(tk_decode_auth(wrong_op.data(), wrong_op.size(), &a), TK_WIRE_WRONG_OP);
        }
    }
    // a CHALLENGE claiming more than the format allows is too large from its first 4 bytes
    uint8_t big[4] = {0, 0, 0x10, 0};
    tk_challenge c;
    size_t fl;
    EXPECT_EQ(tk_decode_challenge(big, 4, &c, &fl), TK_WIRE_TOO_LARGE);
}

TEST(Wire, EncodersRefuseOversizeParts)
{
    std::vector<uint8_t> key(TK_MAX_KEY_LEN + 1, 'k');
    tk_request q{};
    q.op = TK_OP_ACQUIRE;
    q.key = key.data();
    q.key_len = key.size();
    EXPECT_EQ(tk_encode_request(&q, nullptr, 0), 0u);
    q.key_len = TK_MAX_KEY_LEN;
    EXPECT_EQ(tk_encode_request(&q, nullptr, 0), size_t(TK_HEADER_SIZE + TK_MAX_KEY_LEN));
    tk_challenge c{};
    c.data = key.data();
    c.data_len = TK_MAX_CHALLENGE_DATA + 1;
    EXPECT_EQ(tk_encode_challenge(&c, nullptr, 0), 0u);
}
