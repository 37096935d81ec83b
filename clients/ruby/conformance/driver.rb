# frozen_string_literal: true

# The Ruby client's conformance driver (tests/conformance/DRIVER.md): reads JSON commands from
# stdin, one per line, runs each on its own thread on top of the public API, and writes one JSON
# reply per command (and "lost" events) to stdout. Logs go to stderr.

$LOAD_PATH.unshift(File.expand_path("../lib", __dir__))
require "json"
require "logger"
require "ticketing"

module Ticketing
  # @api private
  # The conformance driver. Thin: every check happens in the runner.
  class ConformanceDriver
    FEATURES = %w[locks cancel keepalive with_lock verify refuse_held tls mtls request_timeout lost_events connect_election].freeze

    ERROR_KINDS = {
      NotAcquiredError => "not_acquired", CancelledError => "cancelled", NotHeldError => "not_held",
      LockLostError => "lock_lost", InvalidArgumentError => "invalid_argument", AlreadyHeldError => "already_held",
      AuthFailedError => "auth_failed", UnsupportedVersionError => "unsupported_version",
      UnavailableError => "unavailable", TLSError => "tls", TimeoutError => "timeout",
      ConnectionLostError => "connection_lost", ServerRestartedError => "server_restarted", BusyError => "busy",
      ShuttingDownError => "shutting_down", ClosedError => "closed"
    }.freeze

    # A command failed in a way the runner asked for (unknown handle, bad command).
    class CommandError < StandardError; end

    def initialize(input = $stdin, output = $stdout)
      @input = input
      @output = output
      @out_mutex = Mutex.new
      @mutex = Mutex.new
      @clients = {}
      @locks = {}
      @cancels = {}
      @logger = Logger.new($stderr, level: ENV["TICKETING_DRIVER_DEBUG"] ? Logger::DEBUG : Logger::WARN)
    end

    # Reads commands until "exit" or the end of stdin.
    def run
      @input.each_line do |line|
        next if line.strip.empty?

        cmd = begin
          JSON.parse(line)
        rescue JSON::ParserError => e
          @logger.error("bad command line: #{e.message}")
          next
        end
        if cmd["op"] == "exit"
          reply(cmd["id"], {})
          break
        end
        cancel = Cancellation.new if cmd["op"] == "acquire"
        @mutex.synchronize { @cancels[cmd["id"]] = cancel } if cancel
        Thread.new { handle(cmd, cancel) }
      end
    end

    private

    def handle(cmd, cancel)
      result = dispatch(cmd, cancel)
      reply(cmd["id"], result || {})
    rescue Error, CommandError => e
      reply_error(cmd["id"], e)
    rescue StandardError => e
      @logger.error("#{cmd['op']}: #{e.class}: #{e.message}\n#{e.backtrace.first(5).join("\n")}")
      reply_error(cmd["id"], e)
    ensure
      @mutex.synchronize { @cancels.delete(cmd["id"]) } if cancel
    end

    def dispatch(cmd, cancel)
      case cmd["op"]
      when "hello" then { language: "ruby", client_version: VERSION, features: FEATURES }
      when "connect" then connect(cmd)
      when "close" then client(cmd).close && {}
      when "acquire" then acquire(cmd, cancel)
      when "try_acquire" then try_acquire(cmd)
      when "cancel"
        target = @mutex.synchronize { @cancels[cmd["target"]] }
        target&.cancel
        {}
      when "release" then lock(cmd).release && {}
      when "extend" then { lease_ms: (lock(cmd).extend(lease: ms(cmd["lease_ms"])) * 1000).round }
      when "lock_state" then lock_state(lock(cmd))
      when "verify" then { held: lock(cmd).verify }
      when "release_token" then client(cmd).release(key(cmd), token(cmd["token"])) && {}
      when "inspect"
        info = client(cmd).inspect_key(key(cmd))
        { held: info.held?, waiters: info.waiters, lease_left_ms: (info.lease_left * 1000).round }
      when "ping" then client(cmd).ping && {}
      when "with_lock"
        client(cmd).lock(key(cmd), lease: ms(cmd["lease_ms"])) { sleep(cmd["hold_ms"] / 1000.0) }
        {}
      when "reset" then reset
      else raise CommandError, "unknown op #{cmd['op'].inspect}"
      end
    end

    def connect(cmd)
      tls = cmd["tls"] && {
        ca_file: cmd["tls"]["ca"], cert_file: cmd["tls"]["cert"], key_file: cmd["tls"]["key"],
        server_name: cmd["tls"]["server_name"]
      }.compact
      options = { endpoints: cmd["endpoints"], token: cmd["token"], tls: tls, logger: @logger }
      options[:request_timeout] = ms(cmd["request_timeout_ms"]) if cmd["request_timeout_ms"]
      options[:heartbeat_interval] = ms(cmd["heartbeat_ms"]) if cmd["heartbeat_ms"]
      options[:connect_timeout] = ms(cmd["dial_timeout_ms"]) if cmd["dial_timeout_ms"]
      c = Client.new(**options)
      begin
        c.connect
      rescue Error
        c.close
        raise
      end
      @mutex.synchronize { @clients[cmd["client"]] = c }
      { session_id: c.session_id.unpack1("H*") }
    end

    # The raising acquire (Client#lock! without a block): the same call as #acquire, whose
    # NotAcquiredError carries the client's own message (the server's reason, such as its
    # start-up wait).
    def acquire(cmd, cancel)
      wait = cmd["wait_ms"]
      got = client(cmd).lock!(key(cmd), lease: ms(cmd["lease_ms"]), timeout: wait.nil? ? nil : ms(wait),
                                        keep_alive: cmd["keepalive"] ? true : false,
                                        refuse_held: cmd["refuse_held"] ? true : false, cancel: cancel)

      remember(cmd["lock"], got)
      { token: got.token.to_s, lease_ms: (got.lease * 1000).round }
    end

    def try_acquire(cmd)
      got = client(cmd).try_acquire(key(cmd), lease: ms(cmd["lease_ms"]))
      return { acquired: false } if got.nil?

      remember(cmd["lock"], got)
      { acquired: true, token: got.token.to_s }
    end

    def remember(name, held)
      @mutex.synchronize { @locks[name] = held }
      held.on_lost do |_lock, reason|
        # Never about a handle forgotten by reset.
        current = @mutex.synchronize { @locks[name].equal?(held) }
        event(event: "lost", lock: name, reason: reason.to_s) if current
      end
    end

    def lock_state(held)
      reason = held.lost_reason
      { lost: !reason.nil?, reason: reason&.to_s, token: held.token.to_s,
        deadline_in_ms: (held.deadline - Clock.now) * 1000 }.compact
    end

    def reset
      clients = @mutex.synchronize do
        list = @clients.values
        @clients.clear
        @locks.clear
        list
      end
      clients.map { |c| Thread.new { c.close } }.each { |t| t.join(6) }
      {}
    end

    def client(cmd)
      @mutex.synchronize { @clients[cmd["client"]] } || raise(CommandError, "unknown client #{cmd['client'].inspect}")
    end

    def lock(cmd)
      @mutex.synchronize { @locks[cmd["lock"]] } || raise(CommandError, "unknown lock #{cmd['lock'].inspect}")
    end

    # The key as given: a UTF-8 String, or key_hex as bytes. Passed to the client unchecked.
    def key(cmd)
      cmd.key?("key_hex") ? [cmd["key_hex"]].pack("H*") : cmd["key"]
    end

    # Integer milliseconds -> float seconds, unchecked (the client validates).
    def ms(value)
      value.is_a?(Numeric) ? value / 1000.0 : value
    end

    # A decimal string -> Integer, unchecked beyond parsing.
    def token(value)
      Integer(value.to_s, 10)
    rescue ArgumentError
      value
    end

    def reply(id, result)
      write({ id: id, ok: true }.merge(result))
    end

    def reply_error(id, error)
      kind = ERROR_KINDS.find { |klass, _| error.is_a?(klass) }&.last || "other"
      body = { kind: kind, message: error.message.to_s.lines.first.to_s.chomp }
      body[:reason] = error.reason.to_s if error.is_a?(LockLostError) && error.reason
      write(id: id, ok: false, error: body)
    end

    def event(payload)
      write(payload)
    end

    def write(payload)
      line = JSON.generate(payload)
      @out_mutex.synchronize do
        @output.write(line, "\n")
        @output.flush
      end
    end
  end
end

Ticketing::ConformanceDriver.new.run if $PROGRAM_NAME == __FILE__
