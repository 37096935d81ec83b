# frozen_string_literal: true

require "open3"
require_relative "server_helper"

# The conformance driver, started as the runner starts it (./clients/ruby/conformance-driver
# from the repository root), against the real server.
class DriverTest < Minitest::Test
  include TestHelper

  def setup
    @server = TicketingServer.new
    @stdin, @stdout, @wait = Open3.popen2({ "TICKETING_CONFORMANCE" => "1" }, "clients/ruby/conformance-driver",
                                          chdir: REPO_ROOT)
    @lines = Queue.new
    @reader = Thread.new { @stdout.each_line { |l| @lines << JSON.parse(l) } }
    @next = 0
    @pending = []
  end

  def teardown
    @stdin.close unless @stdin.closed?
    assert @wait.join(10), "the driver exits when stdin closes"
    assert_equal 0, @wait.value.exitstatus
    @server.close
  end

  def send_cmd(op, **args)
    @next += 1
    @stdin.puts(JSON.generate({ id: @next, op: op }.merge(args)))
    @stdin.flush
    @next
  end

  # The next message matching the block (others are kept for later).
  def take(timeout = 5)
    deadline = now + timeout
    if (i = @pending.index { |m| yield m })
      return @pending.delete_at(i)
    end

    loop do
      remaining = deadline - now
      flunk "no matching message within #{timeout} s (seen: #{@pending.inspect})" if remaining <= 0
      msg = begin
        @lines.pop(true)
      rescue ThreadError # empty (Ruby 3.1's Queue#pop has no timeout)
        sleep 0.005
        next
      end
      return msg if yield msg

      @pending << msg
    end
  end

  def call(op, **args)
    id = send_cmd(op, **args)
    take { |m| m["id"] == id }
  end

  def test_hello_and_a_scenario_walk_through
    started = now
    hello = call("hello")
    assert_operator now - started, :<, 3, "starts within about 2 s"
    assert_equal "ruby", hello["language"]
    assert_includes hello["features"], "lost_events"
    ep = [@server.endpoint]
    conn = call("connect", client: "A", endpoints: ep, token: nil, tls: nil, request_timeout_ms: nil,
                           heartbeat_ms: nil, dial_timeout_ms: nil)
    assert conn["ok"], conn.inspect
    assert_match(/\A\h{32}\z/, conn["session_id"])
    call("connect", client: "B", endpoints: ep, token: nil, tls: nil, request_timeout_ms: nil, heartbeat_ms: nil,
                    dial_timeout_ms: nil)

    got = call("acquire", client: "A", key: "k", lease_ms: 400, wait_ms: nil, keepalive: false, lock: "l1")
    assert got["ok"], got.inspect
    assert_kind_of String, got["token"]
    waiting = send_cmd("acquire", client: "B", key: "k", lease_ms: 5000, wait_ms: nil, keepalive: false, lock: "l2")
    lost = take { |m| m["event"] == "lost" }
    assert_equal({ "event" => "lost", "lock" => "l1", "reason" => "expired" }, lost)
    granted = take { |m| m["id"] == waiting }
    assert_operator Integer(granted["token"]), :>, Integer(got["token"])
    rel = call("release", lock: "l1")
    assert_equal({ "kind" => "lock_lost", "reason" => "expired" }, rel["error"].slice("kind", "reason"))
    state = call("lock_state", lock: "l1")
    assert_equal [true, "expired"], [state["lost"], state["reason"]]
    assert call("verify", lock: "l2")["held"]
    assert_equal({ "held" => true, "waiters" => 0 }, call("inspect", client: "A", key: "k").slice("held", "waiters"))

    # cancel a waiting acquire
    target = send_cmd("acquire", client: "A", key: "k", lease_ms: 5000, wait_ms: nil, keepalive: false, lock: "l3")
    assert(eventually(5) { call("inspect", client: "B", key: "k")["waiters"] == 1 })
    assert call("cancel", target: target)["ok"]
    assert_equal "cancelled", take { |m| m["id"] == target }["error"]["kind"]
    assert_equal "not_acquired",
                 call("acquire", client: "A", key: "k", lease_ms: 5000, wait_ms: 0, keepalive: false, lock: "l4")
                   .dig("error", "kind")
    assert_equal false, call("try_acquire", client: "A", key: "k", lease_ms: 1000, lock: "l5")["acquired"]
    assert call("release_token", client: "A", key: "k", token: granted["token"])["ok"]

    # bad arguments
    [["acquire", { client: "A", key: "", lease_ms: 1000, wait_ms: nil, keepalive: false, lock: "x" }],
     ["acquire", { client: "A", key: "k", lease_ms: -5, wait_ms: nil, keepalive: false, lock: "x" }],
     ["acquire", { client: "A", key: "k", lease_ms: 1000, wait_ms: -5, keepalive: false, lock: "x" }],
     ["acquire", { client: "A", key_hex: "00" * 65_536, lease_ms: 1000, wait_ms: nil, keepalive: false, lock: "x" }],
     ["release_token", { client: "A", key: "k", token: "0" }]].each do |op, args|
      assert_equal "invalid_argument", call(op, **args).dig("error", "kind"), args.inspect
    end

    lost = call("with_lock", client: "A", key: "w", lease_ms: 300, hold_ms: 900)
    assert_equal({ "kind" => "lock_lost", "reason" => "expired" }, lost["error"].slice("kind", "reason"))
    assert call("with_lock", client: "A", key: "w", lease_ms: 2000, hold_ms: 100)["ok"]
    assert call("ping", client: "B")["ok"]
    assert call("reset")["ok"]
    assert_equal "unavailable",
                 call("connect", client: "C", endpoints: ["127.0.0.1:1"], token: nil, tls: nil, request_timeout_ms: nil,
                                 heartbeat_ms: nil, dial_timeout_ms: 1000).dig("error", "kind")
    assert call("exit")["ok"]
  end
end
