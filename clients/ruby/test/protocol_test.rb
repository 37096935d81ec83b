# frozen_string_literal: true

require_relative "test_helper"

# Every vector of protocol/vectors.json, both directions, and every code table against
# protocol/constants.json (both files are read at test time).
class ProtocolTest < Minitest::Test
  include TestHelper
  P = Ticketing::Protocol

  def op_value(name)
    name.start_with?("0x") ? Integer(name, 16) : P::Op.const_get(name)
  end

  def status_value(name)
    P::Status.const_get(name)
  end

  def test_vector_file_is_complete
    v = vectors
    assert_equal 1, v["version"]
    %w[requests responses handshake auth malformed].each { |k| refute_empty v[k], k }
  end

  def test_requests_encode_and_decode
    vectors["requests"].each do |vec|
      f = vec["fields"]
      req = P::Request.new(op: op_value(f["op"]), flags: f["flags"], id: Integer(f["id"]),
                           token: Integer(f["token"]), lease_ms: f["lease_ms"], wait_ms: f["wait_ms"],
                           key: hex(f["key_hex"]))
      assert_equal vec["hex"], P.encode_request(req).unpack1("H*"), vec["name"]
      decoded, size = P.decode_request(hex(vec["hex"]))
      assert_equal vec["hex"].size / 2, size, vec["name"]
      assert_equal req.to_h.merge(key: req.key.b), decoded.to_h, vec["name"]
    end
  end

  def test_responses_encode_and_decode
    vectors["responses"].each do |vec|
      f = vec["fields"]
      resp = P::Response.new(op: op_value(f["op"]), status: status_value(f["status"]), id: Integer(f["id"]),
                             token: Integer(f["token"]), lease_ms: f["lease_ms"], detail: f["detail"],
                             data: hex(f["data_hex"]))
      assert_equal vec["hex"], P.encode_response(resp).unpack1("H*"), vec["name"]
      decoded, size = P.decode_response(hex(vec["hex"]))
      assert_equal vec["hex"].size / 2, size, vec["name"]
      assert_equal resp.to_h, decoded.to_h, vec["name"]
    end
  end

  def test_responses_decode_back_to_back_and_split
    stream = vectors["responses"].map { |v| hex(v["hex"]) }.join
    frames = []
    offset = 0
    while (d = P.decode_response(stream, offset))
      frames << d[0]
      offset += d[1]
    end
    assert_equal vectors["responses"].size, frames.size
    assert_equal stream.bytesize, offset
    # Every prefix of a frame is "short", never an error.
    one = hex(vectors["responses"].first["hex"])
    (0...one.bytesize).each { |n| assert_nil P.decode_response(one.byteslice(0, n)), "prefix #{n}" }
  end

  def test_handshake_frames
    vectors["handshake"].each do |vec|
      bytes = hex(vec["hex"])
      name = vec["name"]
      case vec["op"]
      when "HELLO"
        assert_equal bytes, P.encode_hello(session_id: hex(vec["session_id_hex"]), nonce: hex(vec["nonce_hex"]),
                                           version: vec["version"], flags: vec["flags"]), name
        h = P.decode_hello(bytes)
        assert_equal [vec["version"], vec["flags"], vec["session_id_hex"], vec["nonce_hex"]],
                     [h.version, h.flags, h.session_id.unpack1("H*"), h.nonce.unpack1("H*")], name
      when "CHALLENGE"
        assert_equal bytes, P.encode_challenge(status: status_value(vec["status"]), version: vec["version"],
                                               flags: vec["flags"], detail: vec["detail"],
                                               nonce: hex(vec["nonce_hex"]), data: hex(vec["data_hex"])), name
        c = P.decode_challenge(bytes)
        assert_equal [status_value(vec["status"]), vec["version"], vec["flags"], vec["detail"], vec["nonce_hex"],
                      vec["data_hex"]],
                     [c.status, c.version, c.flags, c.detail, c.nonce.unpack1("H*"), c.data.unpack1("H*")], name
        assert_equal vec["flags"].odd?, c.auth_required?, name
      when "AUTH"
        assert_equal bytes, P.encode_auth(proof: hex(vec["proof_hex"])), name
        assert_equal vec["proof_hex"], P.decode_auth(bytes).proof.unpack1("H*"), name
      when "WELCOME"
        state = vec["state_id_hex"].empty? ? nil : hex(vec["state_id_hex"])
        assert_equal bytes, P.encode_welcome(status: status_value(vec["status"]), flags: vec["flags"],
                                             detail: vec["detail"], session_grace_ms: vec["session_grace_ms"],
                                             state_id: state, proof: hex(vec["proof_hex"])), name
        w = P.decode_welcome(bytes)
        assert_equal [status_value(vec["status"]), vec["flags"], vec["detail"], vec["session_grace_ms"],
                      vec["proof_hex"]],
                     [w.status, w.flags, w.detail, w.session_grace_ms, w.proof.unpack1("H*")], name
        assert_equal(vec["state_id_hex"].empty? ? "00" * 16 : vec["state_id_hex"], w.state_id.unpack1("H*"), name)
        assert_equal vec["flags"].odd?, w.resumed?, name
      else
        flunk "unknown handshake op #{vec['op']}"
      end
    end
  end

  def test_handshake_decoders_reject_bad_layouts
    hello = hex(vectors["handshake"].find { |v| v["op"] == "HELLO" }["hex"])
    assert_raises(P::FrameError) { P.decode_hello(hello.byteslice(0, 55)) }
    assert_raises(P::FrameError) { P.decode_challenge(hello) }
    challenge = hex(vectors["handshake"].find { |v| v["name"] == "challenge_not_leader" }["hex"])
    bad = challenge.dup
    bad.setbyte(13, 99) # data_len disagrees
    assert_raises(P::FrameError) { P.decode_challenge(bad) }
  end

  def test_auth_proofs
    vectors["auth"].each do |vec|
      sid = hex(vec["session_id_hex"])
      cn = hex(vec["client_nonce_hex"])
      sn = hex(vec["server_nonce_hex"])
      token = vec["token_utf8"]
      assert_equal vec["client_proof_hex"], P.client_proof(token, sid, cn, sn).unpack1("H*"), vec["name"]
      welcome = P.encode_welcome(flags: vec["welcome_flags"], session_grace_ms: vec["session_grace_ms"],
                                 state_id: hex(vec["state_id_hex"]))
      proof = P.server_proof(token, sid, cn, sn, P.welcome_signed_part(welcome))
      assert_equal vec["server_proof_hex"], proof.unpack1("H*"), vec["name"]
      assert P.secure_equal?(proof, hex(vec["server_proof_hex"]))
      refute P.secure_equal?(proof, proof.reverse)
    end
  end

  def test_malformed
    vectors["malformed"].each do |vec|
      bytes = hex(vec["hex"])
      decode = ->(b) { vec["kind"] == "request" ? P.decode_request(b, max_var: vec["max_var"]) : P.decode_response(b, max_var: vec["max_var"]) }
      if vec["error"] == "short"
        assert_nil decode.(bytes), vec["name"]
      else
        err = assert_raises(P::FrameError, vec["name"]) { decode.(bytes) }
        assert_equal vec["error"].to_sym, err.kind, vec["name"]
        if vec["error"] == "too_large"
          # Detected from the 4-byte length alone.
          err = assert_raises(P::FrameError) { decode.(bytes.byteslice(0, 4)) }
          assert_equal :too_large, err.kind
        end
      end
    end
  end

  def test_code_tables_match_constants_json
    c = constants
    assert_equal P::VERSION, c["version"]
    P::TABLES.each do |json_name, table|
      entries = c.fetch(json_name)
      assert_equal entries.map { |e| e["name"] }.sort, table.constants.map(&:to_s).sort, json_name
      entries.each { |e| assert_equal e["value"], table.const_get(e["name"]), "#{json_name} #{e['name']}" }
    end
    assert_equal c["sizes"].keys.sort, P::Size.constants.map(&:to_s).sort
    c["sizes"].each { |name, value| assert_equal value, P::Size.const_get(name), name }
    assert_equal c["client_rules"].keys.sort, P::ClientRule.constants.map(&:to_s).sort
    c["client_rules"].each { |name, value| assert_equal value, P::ClientRule.const_get(name), name }
    assert_equal (c.keys - %w[comment version sizes client_rules]).sort, P::TABLES.keys.sort
  end

  def test_errors_map_every_status
    P::Status.constants.each do |name|
      value = P::Status.const_get(name)
      next if value == P::Status::OK || value == P::Status::NOT_LEADER

      resp = P::Response.new(op: P::Op::ACQUIRE, status: value, id: 1, token: 0, lease_ms: 0, detail: 1, data: "why")
      err = Ticketing::Errors.from_response("ACQUIRE", resp, key: "k")
      assert_kind_of Ticketing::Error, err
      refute_instance_of Ticketing::ServerError, err, name.to_s
      refute_includes err.message, "\n"
    end
    unknown = P::Response.new(op: 0x10, status: 77, id: 1, token: 0, lease_ms: 0, detail: 0, data: "")
    err = Ticketing::Errors.from_response("ACQUIRE", unknown)
    assert_instance_of Ticketing::ServerError, err
    assert_equal 77, err.status
    busy = P::Response.new(op: 0x10, status: P::Status::BUSY, id: 1, token: 0, lease_ms: 0, detail: 5, data: "")
    assert_equal :inflight, Ticketing::Errors.from_response("ACQUIRE", busy).limit
  end

  # A run of at least +n+ bytes that occurs twice in +msg+ without overlapping (nil if none),
  # outside runs of one repeated byte: the conformance runner's check (error_messages).
  def repeated_phrase(msg, n = 16)
    msg = msg.b
    (0..(msg.bytesize - n)).each do |i|
      p = msg.byteslice(i, n)
      next if p.count(p[0]) == n
      return p if msg.byteslice(i + n, msg.bytesize).include?(p)
    end
    nil
  end

  # docs/clients.md rule 6: one line, no doubled phrase (the server's own words after ours).
  def test_messages_say_nothing_twice_and_stay_on_one_line
    server_words = {
      P::Status::SHUTTING_DOWN => "server shutting down", P::Status::AUTH_FAILED => "authentication failed",
      P::Status::UNSUPPORTED_VERSION => "unsupported protocol version", P::Status::NOT_HELD => "not held",
      P::Status::INVALID => "lease 3600001 ms is outside the server's range (1 ms to 1 h)",
      P::Status::BUSY => "too many waiters on this key", P::Status::TIMED_OUT => "start-up wait\nsecond line"
    }
    server_words.each do |status, data|
      resp = P::Response.new(op: P::Op::ACQUIRE, status: status, id: 1, token: 0, lease_ms: 0, detail: 5, data: data)
      msg = Ticketing::Errors.from_response("ACQUIRE", resp, key: "k").message
      assert_nil repeated_phrase(msg), "#{msg.inspect} says a phrase twice"
      refute_match(/[\r\n]/, msg)
      assert_includes msg, data.lines.first.chomp
    end
    down = P::Response.new(op: P::Op::ACQUIRE, status: P::Status::SHUTTING_DOWN, id: 1, token: 0, lease_ms: 0,
                           detail: 0, data: "server shutting down")
    assert_equal 'ACQUIRE key "k": server shutting down', Ticketing::Errors.from_response("ACQUIRE", down, key: "k").message
  end

  # A key in a message is cut to 64 bytes (never inside a character), with its length.
  def test_keys_in_messages_are_cut_to_64_bytes
    assert_equal 'key "k"', Ticketing::Errors.describe_key("k")
    assert_equal "key \"#{'k' * 64}\"", Ticketing::Errors.describe_key("k" * 64)
    assert_equal "key \"#{'k' * 64}\"\u2026(5000 bytes)", Ticketing::Errors.describe_key("k" * 5000)
    assert_equal "key \"a#{"\u00e9" * 31}\"\u2026(81 bytes)", Ticketing::Errors.describe_key("a#{"\u00e9" * 40}")
    assert_equal "key 0x#{'00ff' * 32}\u2026(5000 bytes)", Ticketing::Errors.describe_key("\x00\xff".b * 2500)
    resp = P::Response.new(op: P::Op::ACQUIRE, status: P::Status::INVALID, id: 1, token: 0, lease_ms: 0, detail: 4,
                           data: "key of 5000 bytes is longer than the server's max key length (256)")
    msg = Ticketing::Errors.from_response("ACQUIRE", resp, key: "k" * 5000).message
    assert_operator msg.bytesize, :<, 200
    assert_includes msg, "(256)"
  end
end
