# frozen_string_literal: true

require "socket"
require "securerandom"
require_relative "test_helper"

# A scriptable protocol-v1 server for tests of what a real single node cannot easily produce
# (GOAWAY, NOT_LEADER, a changed state id, dropped answers, a frozen peer). It speaks the
# handshake (with or without a token) and answers requests through a handler; by default it
# behaves like a tiny lock server (grants free keys, queues nothing).
class FakeServer
  P = Ticketing::Protocol
  Received = Struct.new(:conn, :req, :at)

  attr_reader :port, :hellos, :received
  # While true, new connections wait before the handshake (the server looks unreachable).
  attr_accessor :paused
  # While true, the handshake stops after CHALLENGE: AUTH is read and never answered (no WELCOME).
  attr_accessor :stall_before_welcome
  attr_accessor :sessions, :state_id, :resume, :grace_ms, :challenge_override, :welcome_override, :handler, :proof_token

  # +token+: the server's token (nil: no auth). +handler+: ->(server, conn, req) returning an
  # Array of response Hashes to send (ids default to the request's), or :drop to close the
  # connection, or :silent to answer nothing.
  def initialize(token: nil, grace_ms: 5000, resume: true, &handler)
    @token = token
    @proof_token = token
    @grace_ms = grace_ms
    @resume = resume
    @state_id = SecureRandom.random_bytes(16)
    @handler = handler
    @mutex = Mutex.new
    @hellos = []
    @received = []
    @sessions = {}
    @conns = []
    @next_token = 100
    @held = {} # key => token
    @listener = TCPServer.new("127.0.0.1", 0)
    @port = @listener.addr[1]
    @accept = Thread.new { accept_loop }
  end

  def endpoint
    "127.0.0.1:#{@port}"
  end

  # Requests received so far (optionally only of op +op+).
  def requests(op = nil)
    @mutex.synchronize { @received.map(&:req).select { |r| op.nil? || r.op == op } }
  end

  # Waits until a received request satisfies the block (or +timeout+ passes); returns it.
  def wait_request(timeout = 5.0, &block)
    TestHelper.eventually(timeout) { @mutex.synchronize { @received.map(&:req).find(&block) } }
  end

  def connection_count
    @mutex.synchronize { @conns.size }
  end

  # The newest connection.
  def last_conn
    @mutex.synchronize { @conns.last }
  end

  # Sends a frame (response Hash) on the newest connection.
  def push(frame)
    last_conn&.send_frame(frame)
  end

  # Closes every connection abruptly.
  def drop_all
    @mutex.synchronize { @conns.dup }.each(&:close)
  end

  # A fresh token (as the default handler grants).
  def grant_token
    @mutex.synchronize { @next_token += 1 }
  end

  def close
    @closed = true
    @listener.close rescue nil # rubocop:disable Style/RescueModifier
    drop_all
    @accept.join(1)
  end

  # The default lock-server behaviour.
  def default_answer(req)
    case req.op
    when P::Op::ACQUIRE
      holder = @mutex.synchronize { @held[req.key] }
      if holder
        [{ status: P::Status::TIMED_OUT }]
      else
        tok = grant_token
        @mutex.synchronize { @held[req.key] = tok }
        [{ token: tok, lease_ms: req.lease_ms }]
      end
    when P::Op::RELEASE
      ok = @mutex.synchronize { @held[req.key] == req.token && @held.delete(req.key) }
      [{ status: ok ? P::Status::OK : P::Status::NOT_HELD }]
    when P::Op::EXTEND
      ok = @mutex.synchronize { @held[req.key] == req.token }
      ok ? [{ token: req.token, lease_ms: req.lease_ms }] : [{ status: P::Status::NOT_HELD }]
    when P::Op::INSPECT
      tok = @mutex.synchronize { @held[req.key] }
      flags = tok ? 1 : 0
      flags |= 2 if tok && tok == req.token
      [{ token: flags.anybits?(2) ? tok : 0, data: [0, 0, flags].pack("NNN") }]
    else
      [{}]
    end
  end

  # One accepted connection.
  class Conn
    attr_reader :session_id, :resumed

    def initialize(server, sock)
      @server = server
      @sock = sock
      @wmutex = Mutex.new
    end

    def send_frame(frame)
      bytes = frame.is_a?(String) ? frame : P.encode_response({ op: 0, status: 0, id: 0 }.merge(frame))
      @wmutex.synchronize { @sock.write(bytes) }
    rescue IOError, SystemCallError
      nil
    end

    def close
      @sock.close rescue nil # rubocop:disable Style/RescueModifier
    end

    def run
      deadline = TestHelper.now + 10
      sleep 0.005 while @server.paused && TestHelper.now < deadline
      hello = P.decode_hello(read_exact(56))
      @session_id = hello.session_id
      @server.hello(self, hello)
      nonce = SecureRandom.random_bytes(32)
      override = @server.challenge_override
      if override
        @sock.write(P.encode_challenge(**override))
        return close
      end
      auth_required = !@server.token.nil?
      @sock.write(P.encode_challenge(flags: auth_required ? 1 : 0, nonce: auth_required ? nonce : nil))
      auth = P.decode_auth(read_exact(40))
      if @server.stall_before_welcome
        @sock.read # until the client gives up and closes
        return close
      end
      if auth_required && auth.proof != P.client_proof(@server.token, hello.session_id, hello.nonce, nonce)
        @sock.write(P.encode_welcome(status: P::Status::AUTH_FAILED))
        return close
      end
      @resumed = @server.attach(hello.session_id)
      welcome = { flags: @resumed ? 1 : 0, session_grace_ms: @server.grace_ms, state_id: @server.state_id }
      welcome.merge!(@server.welcome_override) if @server.welcome_override
      frame = P.encode_welcome(**welcome)
      if @server.proof_token
        proof = P.server_proof(@server.proof_token, hello.session_id, hello.nonce, nonce, P.welcome_signed_part(frame))
        frame = P.encode_welcome(**welcome, proof: proof)
      end
      @sock.write(frame)
      serve
    rescue EOFError, IOError, SystemCallError, P::FrameError
      close
    end

    private

    def serve
      buf = "".b
      loop do
        buf << @sock.readpartial(65_536)
        while (decoded = P.decode_request(buf))
          req, size = decoded
          buf = buf.byteslice(size, buf.bytesize - size)
          @server.record(self, req)
          answer = @server.handler ? @server.handler.call(@server, self, req) : @server.default_answer(req)
          answer = @server.default_answer(req) if answer == :default
          case answer
          when :drop then return close
          when :silent, nil then next
          else
            answer.each { |a| send_frame({ op: req.op, id: req.id }.merge(a)) }
          end
        end
      end
    end

    def read_exact(size)
      buf = "".b
      buf << @sock.readpartial(size - buf.bytesize) while buf.bytesize < size
      buf
    end
  end

  # @api private
  attr_reader :token

  # @api private
  def hello(_conn, hello)
    @mutex.synchronize { @hellos << hello }
  end

  # @api private: whether the session resumes.
  def attach(session_id)
    @mutex.synchronize do
      known = @sessions.key?(session_id)
      @sessions[session_id] = true
      known && @resume
    end
  end

  # @api private
  def record(conn, req)
    @mutex.synchronize { @received << Received.new(conn, req, TestHelper.now) }
  end

  private

  def accept_loop
    loop do
      sock = @listener.accept
      conn = Conn.new(self, sock)
      @mutex.synchronize { @conns << conn }
      Thread.new { conn.run }
    end
  rescue IOError, SystemCallError
    nil
  end
end
