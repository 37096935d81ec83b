# frozen_string_literal: true

require "minitest/mock"
require "timeout"
require_relative "fake_server"

# The protocol paths a real single node cannot easily produce, against FakeServer.
class FakeServerTest < Minitest::Test
  include TestHelper
  P = Ticketing::Protocol
  TOKEN = "s3cret token"

  def setup
    @servers = []
    @clients = []
  end

  def teardown
    @clients.each(&:close)
    @servers.each(&:close)
  end

  def server(**opts, &handler)
    FakeServer.new(**opts, &handler).tap { |s| @servers << s }
  end

  def client(srv, **opts)
    endpoints = opts.delete(:endpoints) || [srv.endpoint]
    Ticketing::Client.new(endpoints: endpoints, request_timeout: 2.0, connect_timeout: 2.0,
                          reconnect_delay: 0.01, reconnect_delay_max: 0.05, **opts).tap { |c| @clients << c }
  end

  # ---- handshake ------------------------------------------------------------------------------

  def test_handshake_with_token_verifies_both_proofs
    srv = server(token: TOKEN)
    c = client(srv, token: TOKEN).connect
    assert c.connected?
    hello = srv.hellos.first
    assert_equal c.session_id, hello.session_id
    assert_equal 1, hello.version
    refute_equal "\0" * 16, hello.session_id
    assert_equal 32, hello.nonce.bytesize
    assert_in_delta 0, c.ping, 1.0
  end

  def test_server_with_wrong_proof_is_refused
    srv = server(token: TOKEN)
    srv.proof_token = "another token"
    err = assert_raises(Ticketing::AuthFailedError) { client(srv, token: TOKEN).connect }
    assert_match(/proof did not verify/, err.message)
  end

  def test_token_refuses_a_server_without_auth
    srv = server
    err = assert_raises(Ticketing::AuthFailedError) { client(srv, token: TOKEN).connect }
    assert_match(/does not require a token/, err.message)
  end

  def test_wrong_token_and_missing_token
    srv = server(token: TOKEN)
    err = assert_raises(Ticketing::AuthFailedError) { client(srv, token: "wrong").connect }
    assert_match(/wrong token/, err.message)
    err = assert_raises(Ticketing::AuthFailedError) { client(srv).connect }
    assert_match(/requires a token/, err.message)
  end

  def test_challenge_errors
    srv = server
    srv.challenge_override = { status: P::Status::UNSUPPORTED_VERSION, data: "unsupported protocol version" }
    assert_raises(Ticketing::UnsupportedVersionError) { client(srv).connect }
    srv.challenge_override = { status: P::Status::BUSY, detail: 1, data: "too many connections" }
    err = assert_raises(Ticketing::BusyError) { client(srv).connect }
    assert_equal :connections, err.limit
  end

  def test_challenge_not_leader_hint_is_followed
    leader = server
    follower = server
    follower.challenge_override = { status: P::Status::NOT_LEADER, data: leader.endpoint }
    leader.state_id = follower.state_id
    c = client(follower).connect
    assert c.connected?
    assert_equal 1, leader.hellos.size
    refute_nil c.acquire("k", lease: 5)
  end

  def test_unreachable_is_unavailable
    port = TCPServer.open("127.0.0.1", 0) { |s| s.addr[1] }
    started = now
    err = assert_raises(Ticketing::UnavailableError) do
      Ticketing::Client.new(endpoints: ["127.0.0.1:#{port}"], connect_timeout: 1).connect
    end
    assert_match(/127.0.0.1:#{port}/, err.message)
    assert_operator now - started, :<, 2
  end

  # docs/clients.md rule 1: a handshake that times out is unavailable, whether the server never
  # answers HELLO (accepts and says nothing) or stops before WELCOME; TimeoutError stays a call's
  # own timeout.
  def test_handshake_timeout_is_unavailable
    listener = TCPServer.new("127.0.0.1", 0)
    mute = "127.0.0.1:#{listener.addr[1]}"
    stalled = server
    stalled.stall_before_welcome = true
    [mute, stalled.endpoint].each do |endpoint|
      started = now
      err = assert_raises(Ticketing::UnavailableError) do
        Ticketing::Client.new(endpoints: [endpoint], connect_timeout: 0.5).tap { |c| @clients << c }.connect
      end
      refute_kind_of Ticketing::TimeoutError, err
      assert_equal "#{endpoint}: no handshake answer within 500 ms of the TCP connection " \
                   "(is the server frozen, or not a Ticketing server?)", err.message
      assert_in_delta 0.5, now - started, 0.4
    end
    assert_equal 1, stalled.hellos.size, "the stalled server got HELLO and sent CHALLENGE"
    assert_equal 0, stalled.requests.size
  ensure
    listener&.close
  end

  def test_call_timeout_while_the_handshake_times_out_is_timeout_naming_it
    srv = server
    c = client(srv, request_timeout: 0.5, connect_timeout: 0.2).connect
    srv.stall_before_welcome = true
    srv.drop_all
    assert(eventually { !c.connected? }, "disconnected")
    started = now
    err = assert_raises(Ticketing::TimeoutError) { c.ping }
    assert_match(/PING: no answer within 0.5 s \(not connected; last error: #{srv.endpoint}: no handshake answer within 200 ms/,
                 err.message)
    assert_instance_of Ticketing::UnavailableError, err.cause
    assert_in_delta 0.5, now - started, 0.4
    srv.stall_before_welcome = false
    assert_in_delta 0, c.ping, 2.0 # reconnects once the server answers again
  end

  def test_tls_answer_to_plaintext_says_so
    listener = TCPServer.new("127.0.0.1", 0)
    t = Thread.new do
      s = listener.accept
      s.write("\x15\x03\x03\x00\x02\x02\x32".b)
      sleep 0.5
      s.close
    end
    err = assert_raises(Ticketing::TLSError) do
      Ticketing::Client.new(endpoints: ["127.0.0.1:#{listener.addr[1]}"], connect_timeout: 2).connect
    end
    assert_match(/is the server using TLS/, err.message)
  ensure
    t&.join(2)
    listener&.close
  end

  # ---- requests ---------------------------------------------------------------------------------

  def test_request_ids_in_send_order_and_pipelining
    srv = server do |s, _conn, req|
      req.op == P::Op::ACQUIRE && req.key == "slow" ? :silent : s.default_answer(req)
    end
    c = client(srv).connect
    waiter = Thread.new { c.acquire("slow", lease: 5) }
    srv.wait_request { |r| r.key == "slow" }
    5.times { c.ping }                        # answered while the acquire waits
    lock = c.acquire("fast", lease: 5)
    assert_equal 101, lock.token
    ids = srv.requests.map(&:id)
    assert_equal (1..ids.size).to_a, ids
    assert waiter.alive?
  ensure
    waiter&.kill
  end

  def test_acquire_returns_lock_with_deadline_from_send_time
    srv = server { |_s, _c, req| req.op == P::Op::ACQUIRE ? [{ token: 7, lease_ms: 2000, detail: 300 }] : :default }
    c = client(srv).connect
    before = now
    lock = c.acquire("k", lease: 2)
    after = now
    assert_equal 7, lock.token
    assert_equal 2.0, lock.lease
    assert_equal "k", lock.key
    # deadline = t_send + (queued + lease) * (1 - 2 rho), with t_send between before and after
    assert_operator lock.deadline, :>=, before + (2.3 * 0.998) - 1e-6
    assert_operator lock.deadline, :<=, after + (2.3 * 0.998) + 1e-6
    refute lock.lost?
  end

  def test_wait_timeout_returns_nil_and_lock_bang_raises
    srv = server { |_s, _c, req| req.op == P::Op::ACQUIRE ? [{ status: P::Status::TIMED_OUT }] : :default }
    c = client(srv).connect
    assert_nil c.acquire("k", lease: 1, timeout: 0.2)
    assert_nil c.try_acquire("k", lease: 1)
    assert_equal 200, srv.requests(P::Op::ACQUIRE).first.wait_ms
    assert_equal 0, srv.requests(P::Op::ACQUIRE).last.wait_ms
    assert_raises(Ticketing::NotAcquiredError) { c.lock!("k", lease: 1, timeout: 0) { flunk } }
    assert_nil(c.lock("k", lease: 1, timeout: 0) { |l| l })
  end

  def test_status_errors
    srv = server do |_s, _c, req|
      case req.key
      when "busy" then [{ status: P::Status::BUSY, detail: 2, data: "too many waiters on this key" }]
      when "bad" then [{ status: P::Status::INVALID, detail: 4, data: "key too long" }]
      when "odd" then [{ status: 42, data: "new status" }]
      else :default
      end
    end
    c = client(srv).connect
    err = assert_raises(Ticketing::BusyError) { c.acquire("busy", lease: 1) }
    assert_equal :waiters_per_key, err.limit
    assert_match(/busy.*waiters_per_key|WAITERS_PER_KEY/i, err.message)
    err = assert_raises(Ticketing::InvalidArgumentError) { c.acquire("bad", lease: 1) }
    assert_equal :key, err.field
    err = assert_raises(Ticketing::ServerError) { c.acquire("odd", lease: 1) }
    assert_equal 42, err.status
  end

  # ---- resume -----------------------------------------------------------------------------------

  def test_resume_resends_unanswered_requests_with_their_ids_first
    dropped = false
    srv = server do |s, _conn, req|
      if req.op == P::Op::ACQUIRE && !dropped
        dropped = true
        :drop # the answer is lost with the connection
      else
        s.default_answer(req)
      end
    end
    c = client(srv).connect
    lock = c.acquire("k", lease: 5)
    refute_nil lock
    acquires = srv.requests(P::Op::ACQUIRE)
    assert_equal 2, acquires.size
    assert_equal acquires[0].id, acquires[1].id, "re-sent with its original id"
    assert_equal 2, srv.hellos.size
    assert_equal srv.hellos[0].session_id, srv.hellos[1].session_id
    assert_equal srv.received.last.conn, srv.last_conn
    c.ping
    assert_operator srv.requests.last.id, :>, acquires[1].id
  end

  # PROTOCOL.md, "The lost signal": every ACQUIRE OK sets t_first + (detail + lease)(1 - 2 rho),
  # t_first being the request's first send. Here the grant was decided (100 ms after the request
  # arrived, full lease) before the connection dropped, and reaches the client only after its
  # re-send, 300 ms later: counting the lease from the re-send would put the deadline after the
  # server's lease end.
  def test_grant_read_after_the_resend_counts_from_the_first_send
    srv = server do |s, _conn, req|
      next :default unless req.op == P::Op::ACQUIRE
      # The first transmission's answer is lost with the connection; the re-send gets it.
      s.requests(P::Op::ACQUIRE).size == 1 ? :silent : [{ token: 7, lease_ms: 2000, detail: 100 }]
    end
    c = client(srv).connect
    before = now
    waiter = Thread.new { c.acquire("k", lease: 2) }
    srv.wait_request { |r| r.op == P::Op::ACQUIRE }
    sleep 0.3
    srv.drop_all
    lock = waiter.value
    first, resent = srv.received.select { |r| r.req.op == P::Op::ACQUIRE }
    assert_equal first.req.id, resent.req.id
    assert_operator resent.at - first.at, :>=, 0.3
    rule = (0.1 + 2.0) * 0.998
    assert_operator lock.deadline, :<=, first.at + rule + 1e-6, "not after the server's lease end"
    assert_operator lock.deadline, :>=, before + rule - 1e-6
  end

  # A waiter re-sent after a reconnect and granted a second later: its detail counts from the
  # first arrival, and the deadline from the first send (from the re-send without the queued
  # time, it would be a second early).
  def test_waiter_granted_long_after_its_resend_counts_its_queued_time
    srv = server { |_s, _conn, req| req.op == P::Op::ACQUIRE ? :silent : :default }
    c = client(srv).connect
    before = now
    waiter = Thread.new { c.acquire("k", lease: 2) }
    srv.wait_request { |r| r.op == P::Op::ACQUIRE }
    sleep 0.05
    srv.drop_all
    assert(eventually { srv.requests(P::Op::ACQUIRE).size == 2 }, "re-sent")
    sleep 1
    first, resent = srv.received.select { |r| r.req.op == P::Op::ACQUIRE }
    detail = ((now - first.at) * 1000).floor
    resent.conn.send_frame(op: P::Op::ACQUIRE, id: resent.req.id, token: 9, lease_ms: 2000, detail: detail)
    lock = waiter.value
    rule = (detail + 2000) / 1000.0 * 0.998
    assert_operator lock.deadline, :<=, first.at + rule + 1e-6, "not after the server's lease end"
    assert_operator lock.deadline, :>=, before + rule - 1e-6, "the time queued before the re-send counts"
  end

  def test_not_resumed_fails_unanswered_requests_connection_lost
    dropped = false
    srv = server(resume: false) do |s, _conn, req|
      if req.op == P::Op::RELEASE && !dropped
        dropped = true
        :drop
      else
        s.default_answer(req)
      end
    end
    c = client(srv).connect
    lock = c.acquire("k", lease: 30)
    err = assert_raises(Ticketing::ConnectionLostError) { c.release("other", 5) }
    assert_match(/could not be resumed/, err.message)
    refute lock.lost?, "held locks keep their deadlines"
  end

  def test_changed_state_id_loses_every_lock_and_starts_a_new_session
    srv = server { |s, _c, req| req.key == "wait" ? :silent : s.default_answer(req) }
    c = client(srv).connect
    lost = Queue.new
    lock = c.acquire("k", lease: 30)
    lock.on_lost { |l, reason| lost << [l.token, reason] }
    waiter = Thread.new do
      c.acquire("wait", lease: 5)
    rescue Ticketing::Error => e
      e
    end
    srv.wait_request { |r| r.key == "wait" }
    old_session = c.session_id
    srv.state_id = SecureRandom.random_bytes(16)
    srv.drop_all
    assert_instance_of Ticketing::ServerRestartedError, waiter.value
    assert_equal [lock.token, :server_restarted], lost.pop
    assert_equal :server_restarted, lock.lost_reason
    assert(eventually { srv.hellos.size >= 3 }, "srv.hellos.size >= 3")
    refute_equal old_session, srv.hellos.last.session_id
    assert_equal c.session_id, srv.hellos.last.session_id
    # Never re-queued: the waiting acquire was sent once.
    assert_equal 1, srv.requests.count { |r| r.key == "wait" }
    err = assert_raises(Ticketing::LockLostError) { lock.release }
    assert_equal :server_restarted, err.reason
    refute_nil c.acquire("k2", lease: 1)
    assert_equal 1, srv.requests.last.id, "the new session counts ids from 1"
  end

  def test_session_grace_passing_fails_pending_calls
    srv = server(grace_ms: 200) { |_s, _c, req| req.op == P::Op::ACQUIRE ? :silent : :default }
    c = client(srv).connect
    waiter = Thread.new do
      c.acquire("k", lease: 5)
    rescue Ticketing::Error => e
      e
    end
    srv.wait_request { |r| r.op == P::Op::ACQUIRE }
    srv.close # nobody answers any more
    started = now
    assert_instance_of Ticketing::ConnectionLostError, waiter.value
    assert_operator now - started, :<, 3
  end

  # ---- redirects ----------------------------------------------------------------------------------

  def test_not_leader_answer_is_resent_with_the_same_id_to_the_leader
    leader = server
    follower = server do |_s, _c, req|
      [{ status: P::Status::NOT_LEADER, data: leader.endpoint }] if req.op == P::Op::ACQUIRE
    end
    leader.state_id = follower.state_id # one cluster: one state id, replicated sessions
    leader.sessions = follower.sessions
    c = client(follower).connect
    lock = c.acquire("k", lease: 5)
    refute_nil lock
    assert_equal follower.requests(P::Op::ACQUIRE).first.id, leader.requests(P::Op::ACQUIRE).first.id
    assert_equal follower.hellos.first.session_id, leader.hellos.first.session_id
  end

  def test_goaway_moves_to_the_hinted_leader_and_keeps_locks
    leader = server
    old = server
    leader.state_id = old.state_id
    leader.sessions = old.sessions
    c = client(old).connect
    lock = c.acquire("k", lease: 30)
    old.push(op: P::Op::GOAWAY, detail: 1, data: leader.endpoint)
    assert(eventually { leader.hellos.size == 1 }, "leader.hellos.size == 1")
    assert_equal c.session_id, leader.hellos.first.session_id
    refute lock.lost?
    c.ping
    assert_equal 1, leader.requests.size
  end

  # ---- reconnecting ---------------------------------------------------------------------------------

  def test_after_a_round_with_not_leader_the_next_pause_is_the_shortest
    leader = server
    follower = server
    follower.state_id = leader.state_id
    follower.challenge_override = { status: P::Status::NOT_LEADER } # electing: no leader known yet
    c = client(leader, endpoints: [leader.endpoint, follower.endpoint], reconnect_delay: 0.05, reconnect_delay_max: 2.0)
    lock = c.connect.acquire("k", lease: 30)
    leader.close # refused from now on
    assert(eventually(2) { follower.hellos.size >= 1 }, "the client reconnects")
    before = follower.hellos.size
    sleep 2
    rounds = follower.hellos.size - before
    # Pauses of 25-50 ms: about 40-80 rounds in 2 s; doubling (50, 100, 200, 400, 800, 1600 ms,
    # with jitter) would give at most 7. (Over 1 s a loaded machine fell short.)
    assert_operator rounds, :>=, 12, "#{rounds} rounds in 2 s: the backoff grew during the election"
    refute lock.lost?
  end

  def test_a_call_timing_out_while_reconnecting_names_the_last_connect_error
    srv = server { |s, _c, req| req.op == P::Op::PING ? :silent : s.default_answer(req) }
    c = client(srv, request_timeout: 0.5).connect
    sent = Thread.new do
      c.ping
    rescue Ticketing::Error => e
      e
    end
    srv.wait_request { |r| r.op == P::Op::PING }
    srv.close # refused from now on: every reconnect round fails, and no call fails with it
    err = sent.value
    assert_instance_of Ticketing::TimeoutError, err
    assert_match(/PING: no answer within 0.5 s \(the connection was lost and not re-established; last error: .*#{srv.endpoint}/,
                 err.message)
    assert_instance_of Ticketing::UnavailableError, err.cause
    # Calls made while reconnecting (a request, an acquire): the same.
    err = assert_raises(Ticketing::TimeoutError) { c.ping }
    assert_match(/\(not connected; last error: .*#{srv.endpoint}/, err.message)
    assert_instance_of Ticketing::UnavailableError, err.cause
    started = now
    err = assert_raises(Ticketing::TimeoutError) { c.acquire("k", lease: 5, timeout: 0.1) }
    assert_match(/ACQUIRE key "k": no answer within 0.5 s \(not connected; last error: /, err.message)
    assert_instance_of Ticketing::UnavailableError, err.cause
    assert_in_delta 0.5, now - started, 0.4
  end

  def test_handshake_closed_reset_or_refused_not_leader_is_unavailable
    listener = TCPServer.new("127.0.0.1", 0)
    endpoint = "127.0.0.1:#{listener.addr[1]}"
    t = Thread.new do
      2.times do |i|
        s = listener.accept
        s.readpartial(56) # the HELLO
        s.setsockopt(Socket::SOL_SOCKET, Socket::SO_LINGER, [1, 0].pack("ii")) if i == 1 # reset, not closed
        s.close
      end
    end
    2.times do
      err = assert_raises(Ticketing::UnavailableError) { client(nil, endpoints: [endpoint]).connect }
      assert_includes err.message, endpoint
    end
    # Refused NOT_LEADER in the CHALLENGE (no leader known) or in the WELCOME: an election, which
    # the first connect waits out until its request timeout.
    srv = server
    srv.challenge_override = { status: P::Status::NOT_LEADER }
    assert_raises(Ticketing::UnavailableError) { client(srv, request_timeout: 0.2).connect }
    srv.challenge_override = nil
    srv.welcome_override = { status: P::Status::NOT_LEADER }
    assert_raises(Ticketing::UnavailableError) { client(srv, request_timeout: 0.2).connect }
  ensure
    t&.join(2)
    listener&.close
  end

  # docs/clients.md rule 1: before the first connection, a round in which a node answered
  # NOT_LEADER (a cluster electing a leader) is retried at the shortest delay; the connect
  # succeeds once a leader answers.
  def test_first_connect_waits_for_the_election
    srv = server
    srv.challenge_override = { status: P::Status::NOT_LEADER }
    def srv.hello(conn, hello)
      super
      self.challenge_override = nil if hellos.size >= 3 # the third connection is served
    end
    c = client(srv, request_timeout: 5)
    started = now
    c.connect
    assert c.connected?
    assert_equal 3, srv.hellos.size
    assert_operator now - started, :<, 1
    refute_nil c.acquire("k", lease: 5)
  end

  # An election longer than the request timeout: the first connect raises the last round's
  # UnavailableError once that timeout has passed; a refused connection still fails at once.
  def test_first_connect_gives_up_after_the_request_timeout
    srv = server
    srv.challenge_override = { status: P::Status::NOT_LEADER }
    started = now
    err = assert_raises(Ticketing::UnavailableError) { client(srv, request_timeout: 0.5).connect }
    assert_includes err.message, "not the leader"
    assert_in_delta 0.5, now - started, 0.3
    assert_operator srv.hellos.size, :>=, 5
    port = TCPServer.open("127.0.0.1", 0) { |s| s.addr[1] }
    started = now
    assert_raises(Ticketing::UnavailableError) { client(nil, endpoints: ["127.0.0.1:#{port}"], request_timeout: 5).connect }
    assert_operator now - started, :<, 1
  end

  # A first connect waiting out an election stops when its Cancellation is cancelled: at once
  # between rounds, with CancelledError; one cancelled before it begins dials nothing.
  def test_first_connect_stops_when_cancelled
    srv = server
    srv.challenge_override = { status: P::Status::NOT_LEADER }
    c = client(srv, request_timeout: 10, reconnect_delay: 0.5)
    cancel = Ticketing::Cancellation.new
    started = now
    canceller = Thread.new do
      sleep 0.3
      cancel.cancel
    end
    assert_raises(Ticketing::CancelledError) { c.connect(cancel: cancel) }
    canceller.join
    assert_in_delta 0.3, now - started, 0.25
    refute c.connected?
    before = srv.hellos.size
    assert_raises(Ticketing::CancelledError) { c.connect(cancel: cancel) }
    assert_equal before, srv.hellos.size, "a cancelled connect dials nothing"
    assert_raises(Ticketing::InvalidArgumentError) { c.connect(cancel: :no) }
  end

  # ---- pushes and the lost signal -------------------------------------------------------------------

  def test_expired_push_fires_lost_once
    srv = server
    c = client(srv).connect
    lock = c.acquire("k", lease: 30)
    reasons = Queue.new
    lock.on_lost { |_l, reason| reasons << reason }
    srv.push(op: P::Op::EXPIRED, token: lock.token + 1000, detail: 1, data: "k") # not ours: ignored
    srv.push(op: 0x7e, detail: 1)                                                # unknown push: ignored
    srv.push(op: P::Op::EXPIRED, token: lock.token, detail: 1, data: "k")
    srv.push(op: P::Op::EXPIRED, token: lock.token, detail: 2, data: "k")
    assert_equal :expired, reasons.pop
    assert lock.wait_lost(1)
    assert_equal :expired, lock.lost_reason
    c.ping
    assert_equal 0, reasons.size
    err = assert_raises(Ticketing::LockLostError) { lock.release }
    assert_equal :expired, err.reason
    assert(eventually(2) { srv.requests(P::Op::RELEASE).size == 1 }, "a lost lock's release still tells the server")
  end

  # docs/clients.md rule 4: the release of a lock already known lost answers lock-lost at once,
  # the server unreachable or not, and tells the server in the background, except after a
  # restart or NOT_HELD (nothing is left to release there).
  def test_release_of_a_lost_lock_answers_at_once
    frozen = false
    srv = server { |s, _c, req| frozen ? :silent : s.default_answer(req) }
    c = client(srv, request_timeout: 3.0, heartbeat_interval: 0).connect
    lock = c.acquire("k", lease: 0.2)
    assert lock.wait_lost(2)
    frozen = true # the server answers nothing any more
    started = now
    err = assert_raises(Ticketing::LockLostError) { lock.release }
    assert_operator now - started, :<, 0.2, "no wait for the server"
    assert_equal :expired, err.reason
    assert_match(/key "k" token \d+: lock lost \(expired\)/, err.message)
    assert(eventually(2) { srv.requests(P::Op::RELEASE).size == 1 }, "RELEASE sent in the background")
    assert_raises(Ticketing::LockLostError) { lock.release }
    assert_equal 1, srv.requests(P::Op::RELEASE).size, "told once"
    frozen = false

    # Lost to NOT_HELD (an extend answered NOT_HELD): nothing is sent.
    other = c.acquire("k2", lease: 30)
    c.release("k2", other.token)
    assert_raises(Ticketing::LockLostError) { other.extend(lease: 30) }
    assert_equal :not_held, other.lost_reason
    releases = srv.requests(P::Op::RELEASE).size
    assert_raises(Ticketing::LockLostError) { other.release }
    sleep 0.1
    assert_equal releases, srv.requests(P::Op::RELEASE).size, "no RELEASE after NOT_HELD"
  end

  def test_stopping_push_reason
    srv = server
    c = client(srv).connect
    lock = c.acquire("k", lease: 30)
    srv.push(op: P::Op::EXPIRED, token: lock.token, detail: 2, data: "k")
    assert lock.wait_lost(2)
    assert_equal :server_stopping, lock.lost_reason
  end

  def test_local_deadline_fires_before_the_lease
    srv = server
    c = client(srv).connect
    sent = now
    lock = c.acquire("k", lease: 0.3)
    received = now
    # deadline = t_send + lease * (1 - 2 rho); the signal fires min(5 ms, lease/10) before it.
    assert_operator lock.deadline, :>=, sent + (0.3 * 0.998)
    assert_operator lock.deadline, :<=, received + (0.3 * 0.998)
    fire_at = lock.deadline - 0.005
    reason = Queue.new
    lock.on_lost { |_l, r| reason << [r, now] }
    sleep 0.01 while now < fire_at - 0.02
    refute lock.lost?, "not lost before its time" if now < fire_at
    sleep 0.001 while now < fire_at
    assert lock.lost?, "lost? is exact at the firing time, whatever the timer's latency"
    assert_equal :expired, lock.lost_reason
    r, at = reason.pop
    assert_equal :expired, r
    assert_operator at, :>=, fire_at
    assert_operator at - sent, :<, 0.4, "the callback follows promptly (thread scheduling permitting)"
  end

  # A suspend stops the runtime's timers but not the deadlines' clock: lost fires within
  # LOST_CHECK_MS of the resume (here the fallback clock sees the wall clock jump a minute ahead
  # of the monotonic one), and asking about a lock checks its deadline at once.
  def test_a_suspend_fires_lost_within_lost_check_ms
    mono = -> { Process.clock_gettime(Process::CLOCK_MONOTONIC) }
    jump = 0
    clock = Ticketing::Clock::Fallback.new(wall: -> { Process.clock_gettime(Process::CLOCK_REALTIME) + jump })
    Ticketing::Clock.stub(:now, -> { clock.now }) do
      srv = server
      c = client(srv, heartbeat_interval: 0).connect # the deadline's is the one timer
      watched = c.acquire("k", lease: 30)
      asked = c.acquire("k2", lease: 30)
      fired = Queue.new
      watched.on_lost { |_l, reason| fired << [reason, mono.call] }
      sleep 0.05
      resumed = mono.call
      jump = 60
      assert asked.lost?, "asking checks the deadline against the clock at once"
      sleep 0.005 while fired.empty? && mono.call < resumed + 2
      refute fired.empty?, "no lost signal within 2 s of the resume"
      reason, at = fired.pop
      assert_equal :expired, reason
      assert_operator at - resumed, :<=, (P::ClientRule::LOST_CHECK_MS / 1000.0) + 0.1
    end
  end

  def test_release_not_held_marks_lost
    srv = server { |_s, _c, req| req.op == P::Op::RELEASE ? [{ status: P::Status::NOT_HELD }] : :default }
    c = client(srv).connect
    lock = c.acquire("k", lease: 30)
    events = Queue.new
    lock.on_lost { |_l, r| events << r }
    err = assert_raises(Ticketing::LockLostError) { lock.release }
    assert_equal :not_held, err.reason
    assert_equal :not_held, events.pop
    assert_raises(Ticketing::LockLostError) { lock.release }
    assert_equal 1, srv.requests(P::Op::RELEASE).size
  end

  def test_release_by_token_not_held
    srv = server
    c = client(srv).connect
    err = assert_raises(Ticketing::NotHeldError) { c.release("k", 99) }
    assert_equal 99, err.token
    assert_match(/key "k" token 99/, err.message)
  end

  def test_extend_moves_deadline_and_not_held_loses
    srv = server
    c = client(srv).connect
    lock = c.acquire("k", lease: 1)
    before = now
    assert_equal 5.0, lock.extend(lease: 5)
    assert_operator lock.deadline, :>, before + 4.9
    req = srv.requests(P::Op::EXTEND).last
    assert_equal [lock.token, 5000, "k"], [req.token, req.lease_ms, req.key]
    c.release("k", lock.token) # someone releases it by token
    err = assert_raises(Ticketing::LockLostError) { lock.extend }
    assert_equal :not_held, err.reason
    assert_equal :not_held, lock.lost_reason
    # Object#extend still works
    lock2 = c.acquire("k2", lease: 1)
    lock2.extend(Comparable)
    assert_kind_of Comparable, lock2
  end

  # The server applies a lock's extends in request-id order: the answer to an older EXTEND read
  # after a newer one's does not move the deadline, even though it is longer.
  def test_an_older_extends_answer_read_last_does_not_move_the_deadline
    srv = server { |s, _conn, req| req.op == P::Op::EXTEND && req.lease_ms == 30_000 ? :silent : s.default_answer(req) }
    c = client(srv).connect
    lock = c.acquire("k", lease: 1)
    older = Thread.new { lock.extend(lease: 30) }
    held_back = srv.wait_request { |r| r.op == P::Op::EXTEND }
    sent = now
    assert_equal 2.0, lock.extend(lease: 2)
    newer = srv.received.find { |r| r.req.op == P::Op::EXTEND && r.req.lease_ms == 2000 }
    assert_operator newer.req.id, :>, held_back.id
    deadline = lock.deadline
    assert_operator deadline, :>=, sent + (2 * 0.998)
    assert_operator deadline, :<=, newer.at + (2 * 0.998)
    srv.push(op: P::Op::EXTEND, id: held_back.id, token: lock.token, lease_ms: 30_000)
    assert_equal 30.0, older.value, "the older extend succeeded"
    assert_equal deadline, lock.deadline
    assert_equal 2.0, lock.lease
    refute lock.lost?
  end

  def test_keep_alive_extends_until_release_and_never_after
    srv = server
    c = client(srv).connect
    # A 1 s lease (extended about every third of it): with 150 ms a loaded machine stalled the
    # keep-alive past the lease now and then, and the lock was lost.
    lock = c.acquire("k", lease: 1.0, keep_alive: true)
    assert lock.keep_alive?
    assert(eventually(10) { srv.requests(P::Op::EXTEND).size >= 4 }, "srv.requests(P::Op::EXTEND).size >= 4")
    refute lock.lost?
    lock.release
    count = srv.requests(P::Op::EXTEND).size
    release_id = srv.requests(P::Op::RELEASE).last.id
    sleep 0.6 # no extend may follow the release: watch for longer than one extend interval
    assert_equal count, srv.requests(P::Op::EXTEND).size
    assert(srv.requests(P::Op::EXTEND).all? { |r| r.id < release_id })
    refute lock.lost?
  end

  def test_keep_alive_stops_at_max_hold
    srv = server
    c = client(srv).connect
    lock = c.acquire("k", lease: 0.15, keep_alive: true, max_hold: 0.2)
    assert lock.wait_lost(3)
    assert_equal :expired, lock.lost_reason
    assert_operator srv.requests(P::Op::EXTEND).size, :<=, 5
  end

  def test_inspect_key_and_verify
    srv = server
    c = client(srv).connect
    lock = c.acquire("k", lease: 5)
    assert lock.verify
    info = c.inspect_key("k")
    assert info.held?
    refute info.token_match?
    assert_nil info.token
    info = c.inspect_key("k", token: lock.token)
    assert info.token_match?
    assert_equal lock.token, info.token
    c.release("k", lock.token)
    refute lock.verify
  end

  # ---- cancellation -----------------------------------------------------------------------------

  def test_cancel_sends_cancel_and_raises
    srv = server do |_s, conn, req|
      case req.op
      when P::Op::ACQUIRE then :silent
      when P::Op::CANCEL
        conn.send_frame(op: P::Op::ACQUIRE, id: req.token, status: P::Status::CANCELLED)
        [{ detail: 1 }]
      else :default
      end
    end
    c = client(srv).connect
    cancel = Ticketing::Cancellation.new
    waiter = Thread.new do
      c.acquire("k", lease: 5, cancel: cancel)
    rescue Ticketing::Error => e
      e
    end
    acquire = srv.wait_request { |r| r.op == P::Op::ACQUIRE }
    cancel.cancel
    assert_instance_of Ticketing::CancelledError, waiter.value
    assert_equal acquire.id, srv.requests(P::Op::CANCEL).first.token
    assert_empty srv.requests(P::Op::RELEASE)
    assert_raises(Ticketing::CancelledError) { c.acquire("k", lease: 5, cancel: cancel) }
  end

  def test_grant_racing_a_cancel_is_released
    granted = nil
    srv = server do |s, conn, req|
      case req.op
      when P::Op::ACQUIRE then :silent
      when P::Op::CANCEL
        granted = s.grant_token
        conn.send_frame(op: P::Op::ACQUIRE, id: req.token, token: granted, lease_ms: 5000)
        [{ detail: 0 }]
      else [{}]
      end
    end
    c = client(srv).connect
    cancel = Ticketing::Cancellation.new
    waiter = Thread.new do
      c.acquire("k", lease: 5, cancel: cancel)
    rescue Ticketing::Error => e
      e
    end
    srv.wait_request { |r| r.op == P::Op::ACQUIRE }
    cancel.cancel
    assert_instance_of Ticketing::CancelledError, waiter.value
    release = srv.wait_request(2) { |r| r.op == P::Op::RELEASE }
    refute_nil release
    assert_equal [granted, "k"], [release.token, release.key]
  end

  def test_cancel_while_disconnected_goes_on_the_next_connection
    srv = server do |_s, conn, req|
      case req.op
      when P::Op::ACQUIRE then :silent
      when P::Op::CANCEL
        conn.send_frame(op: P::Op::ACQUIRE, id: req.token, status: P::Status::CANCELLED)
        [{ detail: 1 }]
      else :default
      end
    end
    c = client(srv).connect
    cancel = Ticketing::Cancellation.new
    waiter = Thread.new do
      c.acquire("k", lease: 5, cancel: cancel)
    rescue Ticketing::Error => e
      e
    end
    acquire = srv.wait_request { |r| r.op == P::Op::ACQUIRE }
    srv.paused = true
    srv.drop_all
    assert(eventually { !c.connected? }, "disconnected")
    cancel.cancel
    srv.paused = false
    assert_instance_of Ticketing::CancelledError, waiter.value
    after = srv.received.select { |r| r.conn == srv.last_conn }.map(&:req)
    assert_equal [[P::Op::ACQUIRE, acquire.id], [P::Op::CANCEL, acquire.id]],
                 after.first(2).map { |r| [r.op, r.op == P::Op::CANCEL ? r.token : r.id] },
                 "the retried ACQUIRE first, then its CANCEL"
  end

  def test_endpoints_are_tried_in_order
    port = TCPServer.open("127.0.0.1", 0) { |s| s.addr[1] }
    srv = server
    c = client(srv, endpoints: ["127.0.0.1:#{port}", srv.endpoint]).connect
    assert c.connected?
    assert_equal ["127.0.0.1:#{port}", srv.endpoint], c.endpoints
  end

  def test_shutting_down_moves_to_the_next_endpoint
    stopping = server { |_s, _c, req| req.op == P::Op::ACQUIRE ? [{ status: P::Status::SHUTTING_DOWN }] : :default }
    other = server
    other.state_id = stopping.state_id
    other.sessions = stopping.sessions
    c = client(stopping, endpoints: [stopping.endpoint, other.endpoint]).connect
    lock = c.acquire("k", lease: 5)
    refute_nil lock
    assert_equal 1, other.requests(P::Op::ACQUIRE).size
    single = client(stopping).connect
    assert_raises(Ticketing::ShuttingDownError) { single.acquire("k", lease: 5) }
  end

  def test_interrupted_acquire_is_withdrawn
    srv = server { |_s, _c, req| req.op == P::Op::ACQUIRE ? :silent : :default }
    c = client(srv).connect
    waiter = Thread.new { c.acquire("k", lease: 5) }
    waiter.report_on_exception = false
    acquire = srv.wait_request { |r| r.op == P::Op::ACQUIRE }
    waiter.raise(Interrupt)
    assert_raises(Interrupt) { waiter.join }
    cancel = srv.wait_request(2) { |r| r.op == P::Op::CANCEL }
    assert_equal acquire.id, cancel&.token
  end

  def test_acquire_wait_timeout_bounds_the_call
    srv = server do |_s, conn, req|
      case req.op
      when P::Op::ACQUIRE then :silent # a frozen queue: no TIMED_OUT comes
      when P::Op::CANCEL
        conn.send_frame(op: P::Op::ACQUIRE, id: req.token, status: P::Status::CANCELLED)
        [{ detail: 1 }]
      else :default
      end
    end
    c = client(srv, request_timeout: 0.3).connect
    started = now
    assert_raises(Ticketing::TimeoutError) { c.acquire("k", lease: 5, timeout: 0.2) }
    assert_in_delta 0.5, now - started, 0.4
    refute_nil srv.wait_request(2) { |r| r.op == P::Op::CANCEL }
  end

  # ---- liveness ----------------------------------------------------------------------------------

  def test_request_timeout_and_heartbeat_detect_a_frozen_server
    frozen = false
    srv = server { |s, _c, req| frozen ? :silent : s.default_answer(req) }
    c = client(srv, request_timeout: 0.3, heartbeat_interval: 0.1).connect
    c.ping
    frozen = true
    started = now
    assert_raises(Ticketing::TimeoutError) { c.ping }
    assert_in_delta 0.3, now - started, 0.25
    # The heartbeat PING goes unanswered: the connection is dropped and a new one made.
    assert(eventually(3) { srv.connection_count >= 2 }, "srv.connection_count >= 2")
    assert_operator srv.connection_count, :>=, 2
    assert(srv.requests(P::Op::PING).size >= 2)
  end

  # A caller with nothing else in flight reads its own answer within Session#submit (its
  # +lead+ argument): the call is finished when submit returns, no other thread involved, and
  # the read role is free again for the next call.
  def test_a_lone_call_is_answered_within_submit
    srv = server
    c = client(srv, heartbeat_interval: 0).connect
    session = c.__send__(:session)
    call = Ticketing::Call.new(P::Op::PING)
    session.submit(call, true, true, Ticketing::Scheduler.now + 2)
    assert call.finished, "answered before submit returned"
    assert_equal P::Status::OK, call.response.status
    assert_nil session.instance_variable_get(:@conn).reader, "the read role is free"
    assert_in_delta 0, c.ping, 1
  end

  # That read is bounded by the limit given to submit: with no answer, submit returns at the
  # limit with the role given up, and #await then times the call out (the caller's own
  # timeout), leaving the client usable.
  def test_a_read_within_submit_stops_at_its_limit
    frozen = true
    srv = server { |s, _c, req| frozen && req.op == P::Op::PING ? :silent : s.default_answer(req) }
    c = client(srv, heartbeat_interval: 0).connect
    session = c.__send__(:session)
    call = Ticketing::Call.new(P::Op::PING)
    started = now
    limit = Ticketing::Scheduler.now + 0.2
    session.submit(call, true, true, limit)
    assert_operator now - started, :>=, 0.19
    refute call.answered, "no answer came"
    assert_nil session.instance_variable_get(:@conn).reader, "the read role is given up at the limit"
    assert_equal :timeout, session.await(call, deadline: limit, send_deadline: limit)
    session.forget(call)
    frozen = false
    assert_in_delta 0, c.ping, 1
  end

  # A lone caller that reads its own answer handles a push that came in the same read first, as
  # a reader thread would (here an EXPIRED for the lock being released: the release then
  # reports the loss, not a success).
  def test_a_lone_answer_read_with_a_push_before_it_handles_the_push_first
    srv = server do |s, conn, req|
      if req.op == P::Op::RELEASE
        push = P.encode_response(op: P::Op::EXPIRED, status: 0, id: 0, token: req.token, detail: 1, data: req.key)
        answer = P.encode_response(op: req.op, status: P::Status::OK, id: req.id)
        conn.send_frame(push + answer) # one write: one read on the client
        :silent
      else
        s.default_answer(req)
      end
    end
    c = client(srv, heartbeat_interval: 0).connect
    lock = c.try_acquire("k", lease: 30)
    err = assert_raises(Ticketing::LockLostError) { lock.release }
    assert_equal :expired, err.reason
    assert_in_delta 0, c.ping, 1
  end

  # ...and an answer that comes in pieces (a read that ends inside its header, then inside
  # its data) is put together before it is handled.
  def test_a_lone_answer_split_across_reads
    srv = server do |s, conn, req|
      if req.op == P::Op::INSPECT
        bytes = P.encode_response(op: req.op, status: P::Status::OK, id: req.id, token: 7, lease_ms: 900, detail: 2,
                                  data: [5, 6, 1].pack("NNN"))
        [bytes.byteslice(0, 10), bytes.byteslice(10, 30), bytes.byteslice(40, bytes.bytesize - 40)].each do |part|
          conn.send_frame(part)
          sleep 0.02 # separate reads on the client
        end
        :silent
      else
        s.default_answer(req)
      end
    end
    c = client(srv, heartbeat_interval: 0).connect
    info = c.inspect_key("k")
    assert info.held?
    assert_equal 2, info.waiters
    assert_in_delta 0.9, info.lease_left, 0.001
    assert_in_delta 0, c.ping, 1
  end

  def test_heartbeat_pings_an_idle_connection
    srv = server
    c = client(srv, heartbeat_interval: 0.05).connect
    assert(eventually(2) { srv.requests(P::Op::PING).size >= 3 }, "srv.requests(P::Op::PING).size >= 3")
    assert_operator srv.requests(P::Op::PING).size, :>=, 3
    assert_equal 1, srv.connection_count
    assert c.connected?
  end

  def test_ack_every_1024_answers
    srv = server
    c = client(srv, heartbeat_interval: 0).connect
    lock = c.acquire("held", lease: 60) # an ACQUIRE never holds ACK back
    threads = 4.times.map { Thread.new { 300.times { c.ping } } }
    threads.each(&:join)
    acks = srv.requests(P::Op::ACK)
    assert_equal 1, acks.size
    ack = acks.first
    # x: the lowest id still awaited that is not an ACQUIRE, else the next id: never above the
    # ACK's own id, and above every id answered before it.
    assert_operator ack.token, :<=, ack.id
    assert_operator ack.token, :>, 1024
    refute_nil lock
  end

  def test_malformed_frame_from_server_reconnects
    srv = server
    c = client(srv).connect
    srv.last_conn.send_frame("\x00\x00\x00\x05garbage".b) # length below the header
    assert(eventually { !c.connected? }, "the connection is dropped")
    assert_in_delta 0, c.ping, 1, "the next call reconnects"
    assert_equal 2, srv.connection_count
  end

  def test_answer_with_the_wrong_op_drops_the_connection
    lied = false
    srv = server do |s, _c, req|
      if req.op == P::Op::PING && !lied
        lied = true
        [{ op: P::Op::RELEASE }] # an answer that does not fit its request
      else
        s.default_answer(req)
      end
    end
    c = client(srv).connect
    assert_in_delta 0, c.ping, 1, "answered after the PING was re-sent on a new connection"
    assert_equal 2, srv.connection_count
  end

  # ---- issue 26: unwinding, close, liveness, messages -------------------------------------------

  # A server that queues every ACQUIRE and answers CANCEL with CANCELLED (+grant+: with a grant
  # that raced the CANCEL instead).
  def queueing_server(grant: false)
    server do |s, conn, req|
      case req.op
      when P::Op::ACQUIRE then :silent
      when P::Op::CANCEL
        if grant
          conn.send_frame(op: P::Op::ACQUIRE, id: req.token, token: s.grant_token, lease_ms: 20_000)
          [{ detail: 0 }]
        else
          conn.send_frame(op: P::Op::ACQUIRE, id: req.token, status: P::Status::CANCELLED)
          [{ detail: 1 }]
        end
      else s.default_answer(req)
      end
    end
  end

  # Timeout.timeout unwinds with throw on Ruby 3.1 (timeout 0.2.0) and with raise on newer
  # ones; Thread#raise and Thread#kill too: the queued ACQUIRE is withdrawn (CANCEL) every way.
  def test_every_unwinding_withdraws_the_queued_acquire
    %i[throw raise kill].each do |how|
      srv = queueing_server
      c = client(srv).connect
      unwind(how, -> { srv.requests(P::Op::ACQUIRE).any? }) { c.acquire("k", lease: 20) }
      acquire = srv.requests(P::Op::ACQUIRE).first
      cancel = srv.wait_request(2) { |r| r.op == P::Op::CANCEL }
      assert_equal acquire.id, cancel&.token, "#{how}: CANCEL of the queued ACQUIRE"
      sleep 0.05
      assert_equal 1, srv.requests(P::Op::CANCEL).size, "#{how}: one CANCEL"
      assert_in_delta 0, c.ping, 1, "#{how}: the client goes on"
    end
  end

  def test_timeout_timeout_withdraws_the_queued_acquire
    srv = queueing_server
    c = client(srv).connect
    assert_raises(Timeout::Error) { Timeout.timeout(0.2) { c.acquire("k", lease: 20) } }
    cancel = srv.wait_request(2) { |r| r.op == P::Op::CANCEL }
    assert_equal srv.requests(P::Op::ACQUIRE).first.id, cancel&.token
  end

  # A caller whose request went out while another caller reads the connection waits parked
  # (Session#await); unwound there, it withdraws its acquire, and the reader keeps reading for
  # the calls after it.
  def test_unwinding_a_caller_parked_behind_another_reader
    %i[throw raise kill].each do |how|
      srv = queueing_server
      c = client(srv).connect
      reader = Thread.new { c.acquire("first", lease: 20) }
      reader.report_on_exception = false
      refute_nil srv.wait_request(2) { |r| r.key == "first" }, "#{how}: the first acquire is queued"
      parked = nil
      ready = -> { srv.requests(P::Op::ACQUIRE).any? { |r| r.key == "k" } && parked&.status == "sleep" }
      unwind(how, ready) do
        parked = Thread.current
        c.acquire("k", lease: 20)
      end
      acquire = srv.requests(P::Op::ACQUIRE).find { |r| r.key == "k" }
      cancel = srv.wait_request(2) { |r| r.op == P::Op::CANCEL }
      assert_equal acquire.id, cancel&.token, "#{how}: the parked acquire is withdrawn"
      assert_kind_of Float, c.ping, "#{how}: answers still read"
      assert reader.alive?, "#{how}: the first acquire still waits"
    ensure
      reader&.kill
      reader&.join(2)
      c&.close
    end
  end

  def test_a_grant_racing_the_unwinding_is_released
    %i[throw kill].each do |how|
      srv = queueing_server(grant: true)
      c = client(srv).connect
      unwind(how, -> { srv.requests(P::Op::ACQUIRE).any? }) { c.acquire("k", lease: 20) }
      release = srv.wait_request(2) { |r| r.op == P::Op::RELEASE }
      refute_nil release, "#{how}: the raced grant is released"
      assert_equal "k", release.key
    end
  end

  # docs/clients.md, Client: close withdraws the session's queued acquires (CANCEL) before it
  # closes, the waiters fail ClosedError at once, and a grant that races the withdrawal is
  # released before close returns (bounded by the cleanup timeout).
  def test_close_withdraws_queued_acquires
    [false, true].each do |grant|
      srv = queueing_server(grant: grant)
      c = client(srv).connect
      waiters = %w[a b].map do |key|
        Thread.new do
          c.acquire(key, lease: 20)
        rescue Ticketing::Error => e
          e
        end
      end
      assert(eventually { srv.requests(P::Op::ACQUIRE).size == 2 })
      started = now
      c.close
      assert_operator now - started, :<, 1
      waiters.each do |w|
        err = w.value
        assert_instance_of Ticketing::ClosedError, err
        assert_match(/ACQUIRE key "[ab]": the client was closed; the queued acquire was withdrawn/, err.message)
      end
      assert_equal srv.requests(P::Op::ACQUIRE).map(&:id).sort, srv.requests(P::Op::CANCEL).map(&:token).sort
      assert_equal(grant ? 2 : 0, srv.requests(P::Op::RELEASE).size, "grant #{grant}: raced grants released by close")
    end
  end

  def test_close_with_a_frozen_server_is_bounded
    frozen = false
    srv = server { |s, _c, req| frozen || req.op == P::Op::ACQUIRE ? :silent : s.default_answer(req) }
    c = client(srv, cleanup_timeout: 0.3).connect
    waiter = Thread.new do
      c.acquire("k", lease: 20)
    rescue Ticketing::Error => e
      e
    end
    srv.wait_request { |r| r.op == P::Op::ACQUIRE }
    frozen = true
    started = now
    c.close
    assert_operator now - started, :<, 1.5
    assert_instance_of Ticketing::ClosedError, waiter.value
  end

  # docs/clients.md, the heartbeat: while a request waits, PING after at most 250 ms of
  # silence; a PING unanswered within min(heartbeat, 750 ms) replaces the connection, and the call
  # in flight goes on on the next one (re-sent with its id), never failed.
  def test_a_silent_connection_is_replaced_and_the_call_goes_on
    silent_conn = nil
    srv = server do |s, conn, req|
      if conn.equal?(silent_conn) then :silent
      elsif req.op == P::Op::ACQUIRE && silent_conn.nil?
        silent_conn = conn # from now on this connection answers nothing (a frozen node)
        :silent
      else s.default_answer(req)
      end
    end
    c = client(srv, request_timeout: 10.0).connect # the default heartbeat: 2 s
    sleep 0.6 # idle: no PING before the heartbeat interval
    assert_empty srv.requests(P::Op::PING)
    started = now
    lock = c.acquire("k", lease: 5)
    elapsed = now - started
    refute_nil lock
    pings = srv.requests(P::Op::PING)
    refute_empty pings
    assert_operator elapsed, :<, 2.5, "replaced after #{elapsed} s (PING within 0.25 s, unanswered for 0.75 s)"
    assert_operator elapsed, :>=, 0.7
    acquires = srv.requests(P::Op::ACQUIRE)
    assert_equal 2, acquires.size
    assert_equal acquires[0].id, acquires[1].id, "re-sent with its id"
    assert_equal 2, srv.connection_count
    assert srv.hellos.last.session_id == c.session_id
  end

  def test_the_silent_node_is_tried_last
    one = server { |_s, _c, req| req.op == P::Op::ACQUIRE ? :silent : :silent }
    two = server
    two.state_id = one.state_id
    c = client(one, endpoints: [one.endpoint, two.endpoint], heartbeat_interval: 0.05)
    two.sessions[c.session_id] = true # node two knows the session (a cluster replicates it)
    # The first connection's handshake answers; then node one answers nothing.
    c.connect
    lock = c.acquire("k", lease: 5)
    refute_nil lock
    assert_equal 1, one.connection_count, "the silent node was not dialled again first"
    assert_equal 1, two.connection_count
    assert two.last_conn.resumed, "the session resumed on the next node"
    assert_equal 1, two.requests(P::Op::ACQUIRE).first.id
  end

  # docs/clients.md, rule 1: the other nodes keep naming a frozen leader until they elect another
  # one; for 2 s the client neither dials the node it found silent nor follows a hint to it (it
  # accepts TCP and would cost the handshake wait), and goes on to the next endpoint.
  def test_the_silent_node_is_not_followed_as_a_hint
    one = server { |_s, _c, _req| :silent } # handshakes, then answers nothing (frozen)
    two = server
    two.challenge_override = { status: P::Status::NOT_LEADER, data: one.endpoint } # still names it
    three = server
    three.state_id = one.state_id
    c = client(one, endpoints: [one.endpoint, two.endpoint, three.endpoint], heartbeat_interval: 0.05,
                    request_timeout: 5.0)
    c.connect
    three.sessions[c.session_id] = true # node three knows the session (a cluster replicates it)
    call = Thread.new { c.acquire("k", lease: 5) } # following the hint, it would resume on node one forever
    assert call.join(4), "the acquire did not resume on the third node within 4 s"
    refute_nil call.value
    assert_operator two.hellos.size, :>=, 1, "the follower naming the silent node was asked"
    assert three.last_conn.resumed, "the session resumed on the third node"
    acquires = one.requests(P::Op::ACQUIRE) + three.requests(P::Op::ACQUIRE)
    assert_equal [1, 1], acquires.map(&:id), "re-sent with its id"
    sleep 0.1
    assert_equal 1, one.connection_count, "the hint to the silent node was not followed"
  end

  # docs/clients.md, the connect timeout: once TCP is connected, TLS and the handshake get 2 s.
  def test_the_handshake_gets_two_seconds_after_tcp
    listener = TCPServer.new("127.0.0.1", 0) # accepts (the kernel does) and never answers
    mute = "127.0.0.1:#{listener.addr[1]}"
    started = now
    err = assert_raises(Ticketing::UnavailableError) do
      Ticketing::Client.new(endpoints: [mute], connect_timeout: 5).tap { |c| @clients << c }.connect
    end
    assert_in_delta 2.0, now - started, 0.5
    assert_match(/no handshake answer within 2000 ms of the TCP connection/, err.message)
  ensure
    listener&.close
  end

  def test_not_acquired_says_why_and_messages_say_nothing_twice
    startup = "the server is in its start-up wait: no grant for 2700 ms more (leases granted before its restart " \
              "may still run)"
    srv = server do |_s, _c, req|
      case req.key
      when "boot" then [{ status: P::Status::TIMED_OUT, data: startup }]
      when "stop" then [{ status: P::Status::SHUTTING_DOWN, data: "server shutting down" }]
      else [{ status: P::Status::TIMED_OUT }]
      end
    end
    c = client(srv).connect
    assert_nil c.acquire("boot", lease: 5, timeout: 0.3), "acquire gives nil"
    err = assert_raises(Ticketing::NotAcquiredError) { c.lock!("boot", lease: 5, timeout: 0.3) }
    assert_equal "ACQUIRE key \"boot\": not acquired within 0.3 s: #{startup}", err.message
    err = assert_raises(Ticketing::NotAcquiredError) { c.lock!("taken", lease: 5, timeout: 0) }
    assert_equal 'ACQUIRE key "taken": not acquired: the key is taken', err.message
    err = assert_raises(Ticketing::ShuttingDownError) { c.acquire("stop", lease: 5) }
    assert_equal 'ACQUIRE key "stop": server shutting down', err.message
  end

  # ---- arguments and lifecycle --------------------------------------------------------------------

  def test_bad_arguments_are_rejected_before_sending
    srv = server
    c = client(srv).connect
    bad = [
      -> { c.acquire("", lease: 1) },
      -> { c.acquire("x" * 65_536, lease: 1) },
      -> { c.acquire(42, lease: 1) },
      -> { c.acquire(nil, lease: 1) },
      -> { c.acquire(["k"], lease: 1) },
      -> { c.acquire("k", lease: 0) },
      -> { c.acquire("k", lease: -0.005) },
      -> { c.acquire("k", lease: 0.0004) },
      -> { c.acquire("k", lease: Float::NAN) },
      -> { c.acquire("k", lease: Float::INFINITY) },
      -> { c.acquire("k", lease: "1") },
      -> { c.acquire("k", lease: 2**32) },
      -> { c.acquire("k", lease: 1, timeout: -0.005) },
      -> { c.acquire("k", lease: 1, timeout: Float::NAN) },
      -> { c.acquire("k", lease: 1, cancel: :yes) },
      -> { c.release("k", 0) },
      -> { c.release("k", -1) },
      -> { c.release("k", 2**64) },
      -> { c.release("k", "7") },
      -> { c.extend_lease("k", 7, lease: 0) },
      -> { c.inspect_key("") }
    ]
    bad.each_with_index do |call, i|
      assert_raises(Ticketing::InvalidArgumentError, "case #{i}") { call.call }
    end
    err = assert_raises(Ticketing::InvalidArgumentError) { c.acquire("k", lease: 0.0001) }
    assert_match(/below 1 ms.*seconds/, err.message)
    assert_equal :lease, err.field
    assert_empty srv.requests
    assert_raises(Ticketing::InvalidArgumentError) { Ticketing::Client.new(endpoints: ["nohost"]) }
    assert_raises(Ticketing::InvalidArgumentError) { Ticketing::Client.new(request_timeout: -1) }
    assert_raises(Ticketing::InvalidArgumentError) { Ticketing::Client.new(tls: { bogus: 1 }) }
  end

  def test_binary_keys
    srv = server
    c = client(srv).connect
    key = "\x00\xff\x10\xc3\xbc".b
    lock = c.acquire(key, lease: 1)
    assert_equal key, srv.requests(P::Op::ACQUIRE).first.key
    assert_equal key, lock.key
    assert_match(/0x00ff10c3bc/, lock.to_s)
  end

  def test_refuse_held
    srv = server
    c = client(srv).connect
    c.acquire("k", lease: 5)
    assert_raises(Ticketing::AlreadyHeldError) { c.acquire("k", lease: 5, refuse_held: true) }
    assert_equal 1, srv.requests(P::Op::ACQUIRE).size
  end

  def test_close_fails_calls_and_does_not_release
    srv = server { |s, _c, req| req.key == "wait" ? :silent : s.default_answer(req) }
    c = client(srv).connect
    lock = c.acquire("k", lease: 30, keep_alive: true)
    waiter = Thread.new do
      c.acquire("wait", lease: 5)
    rescue Ticketing::Error => e
      e
    end
    srv.wait_request { |r| r.key == "wait" }
    c.close
    assert_instance_of Ticketing::ClosedError, waiter.value
    assert_empty srv.requests(P::Op::RELEASE)
    assert_raises(Ticketing::ClosedError) { c.ping }
    assert c.closed?
    c.close # idempotent
    refute lock.lost?
  end

  def test_release_on_close
    srv = server
    c = client(srv, release_on_close: true).connect
    a = c.acquire("a", lease: 30)
    b = c.acquire("b", lease: 30)
    c.close
    assert_equal [a.token, b.token].sort, srv.requests(P::Op::RELEASE).map(&:token).sort
  end

  def test_block_form_releases_and_reports_loss
    srv = server
    c = client(srv).connect
    value = c.lock("k", lease: 5) { |l| l.token * 2 }
    assert_equal 202, value
    assert_equal 1, srv.requests(P::Op::RELEASE).size
    err = assert_raises(Ticketing::LockLostError) do
      c.lock("k", lease: 0.1) { |l| l.wait_lost(2) }
    end
    assert_equal :expired, err.reason
    assert(eventually(2) { srv.requests(P::Op::RELEASE).size == 2 }, "the lost lock's release, in the background")
    assert_equal(:ok, c.lock("k", lease: 0.1, raise_on_lost: false) { |l| l.wait_lost(2) && :ok })
    assert(eventually(2) { srv.requests(P::Op::RELEASE).size == 3 })
    assert_raises(RuntimeError) { c.lock("k", lease: 5) { raise "boom" } }
    assert_equal 4, srv.requests(P::Op::RELEASE).size, "released on every exit"
    # A body unwound by throw (which +rescue+ never sees: Timeout.timeout on Ruby 3.1) releases.
    assert_equal(:out, catch(:out) { c.lock("k", lease: 5) { throw :out, :out } })
    assert_equal 5, srv.requests(P::Op::RELEASE).size, "released when the block is unwound by throw"
  end

  def test_fork_starts_a_new_session_in_the_child
    srv = server
    c = client(srv).connect
    lock = c.acquire("k", lease: 30)
    reader, writer = IO.pipe
    pid = fork do
      reader.close
      sid = c.session_id
      c.ping
      c.release("k", lock.token) # the owner is the token
      writer.write(sid.unpack1("H*"))
      writer.close
      exit!(0)
    ensure
      exit!(1) # never run the parent's test runner in the child
    end
    writer.close
    child_session = reader.read
    Process.wait(pid)
    assert_equal 0, $?.exitstatus
    refute_equal c.session_id.unpack1("H*"), child_session
    assert_equal child_session, srv.hellos.last.session_id.unpack1("H*")
    c.ping # the parent's connection is intact
    assert_equal 1, srv.requests(P::Op::RELEASE).size
  end
end
