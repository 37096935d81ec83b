# frozen_string_literal: true

require "socket"
require "openssl"
require "securerandom"
require "ipaddr"

module Ticketing
  # Thread.handle_interrupt masks (frozen: no Hash per call): asynchronous interrupts deferred,
  # or taken at once.
  DEFER_INTERRUPTS = { Object => :never }.freeze
  TAKE_INTERRUPTS = { Object => :immediate }.freeze
  private_constant :DEFER_INTERRUPTS, :TAKE_INTERRUPTS

  # @api private
  # A server address: host and port. Parsed from "host:port" or "[v6]:port".
  Endpoint = Struct.new(:host, :port) do
    # Parses "host:port", "[::1]:7070", or returns an Endpoint as is.
    def self.parse(value)
      return value if value.is_a?(Endpoint)

      text = value.to_s
      match = text.match(/\A\[(?<host>[^\]]+)\]:(?<port>\d+)\z/) || text.match(/\A(?<host>[^:\[\]]+):(?<port>\d+)\z/)
      port = match && Integer(match[:port], 10)
      unless port&.between?(1, 65_535)
        raise InvalidArgumentError.new("endpoint #{text.inspect} is not host:port", field: :endpoints)
      end
      new(match[:host], port)
    end

    def to_s
      host.include?(":") ? "[#{host}]:#{port}" : "#{host}:#{port}"
    end
  end

  # @api private
  # One handshaken connection. Reading: one thread at a time holds the connection's read role
  # (Session decides who, under its mutex): a caller waiting for its answer reads the socket
  # itself (#read_some) and hands every frame to the session, its own answer, other callers'
  # answers and pushes alike; while no caller reads, the connection's background reader thread
  # does (pushes, heartbeat answers and a lost connection are noticed when no call waits). A
  # reader waits in IO.select on the socket and on a wake-up pipe (#poke), so that it can be
  # asked to give the role up or to look at its call's cancellation.
  #
  # Writing: frames go out in request-id order, under the session's mutex: a caller with
  # nothing else in flight writes its frame itself, without blocking (#send_call), unless
  # another thread is writing; other frames are appended to a buffer (#enqueue_call) that the
  # writer thread writes, in one write for all those queued meanwhile, as it writes whatever
  # the socket did not take at once. One writer at a time, so the wire keeps the ids' order.
  # The session's mutex is never held during blocking I/O here (only reads and writes that do
  # not wait, which keep Ruby's global lock anyway).
  class Connection
    # The Endpoint, its index in the client's list (nil for a leader hint outside it), the WELCOME.
    attr_reader :endpoint, :index, :welcome
    # Monotonic time of the last bytes received (the heartbeat reads it).
    attr_reader :last_recv
    # Monotonic time the heartbeat PING was sent, nil when none is outstanding, and that PING's
    # Call (session's mutex).
    attr_accessor :ping_sent_at, :ping_call
    # The read role (session's mutex): nil (free), :bg (the background reader) or the Call
    # whose caller is reading; +activity+ counts the times a caller took it; +yield_asked+: a
    # caller asked the background reader to give it up (poked it).
    attr_accessor :reader, :activity, :yield_asked
    # The background reader's condition variable (on the session's mutex).
    attr_reader :bg_cond

    # Raised by ::open when the server answers CHALLENGE NOT_LEADER; #hint is the leader's
    # address ("" when unknown).
    class Redirect < Error
      attr_reader :hint

      def initialize(message, hint)
        super(message)
        @hint = hint
      end
    end

    # The most TLS and the handshake may take once TCP is connected, in seconds (docs/clients.md,
    # the connect timeout): a frozen node accepts TCP but answers nothing.
    HANDSHAKE_WAIT = 2.0
    # Bytes asked of the socket per read.
    READ_SIZE = 65_536
    # A response frame's header (Protocol's layout), and the data of a frame without any.
    FRAME_HEADER = "NCCnQ>Q>NN"
    HEADER_SIZE = Protocol::Size::HEADER
    NO_DATA = "".b.freeze

    # Connects to +endpoint+ (TCP, then TLS when +tls_context+ is set) and runs the handshake
    # for +session_id+, all before +deadline+ (monotonic seconds; +timeout+, the connect timeout
    # it came from, is named in the error when it passes), TLS and the handshake within
    # HANDSHAKE_WAIT (or +timeout+ if shorter) of the TCP connection. +on_socket+ receives the TCP socket as
    # soon as it exists (so that Client#close can abort a dial). Returns a Connection that is not
    # reading yet, or raises a Ticketing::Error naming the endpoint. Running out of time at any
    # stage (TCP, TLS, the handshake) is UnavailableError, as a connect that fails otherwise:
    # TimeoutError is a call's own timeout (docs/clients.md rule 1).
    def self.open(endpoint, index:, session_id:, token:, tls_context:, server_name:, deadline:,
                  timeout: deadline - Scheduler.now, on_socket: nil)
      tcp = nil
      remaining = deadline - Scheduler.now
      raise UnavailableError, "#{endpoint}: connect timed out after #{Handshake.ms(timeout)} ms" if remaining <= 0

      begin
        tcp = Socket.tcp(endpoint.host, endpoint.port, connect_timeout: remaining)
      rescue Errno::ETIMEDOUT
        raise UnavailableError, "#{endpoint}: connect timed out"
      rescue SystemCallError, SocketError, IOError => e
        raise UnavailableError, "#{endpoint}: #{Errors.syscall_text(e)}"
      end
      on_socket&.call(tcp)
      sock = tcp
      begin
        tcp.setsockopt(Socket::IPPROTO_TCP, Socket::TCP_NODELAY, 1)
        tcp.setsockopt(Socket::SOL_SOCKET, Socket::SO_KEEPALIVE, true)
        # TLS and the handshake get at most HANDSHAKE_WAIT once TCP is connected: a frozen node's
        # kernel still accepts connections, and the next endpoint should not wait for the whole
        # connect timeout behind it.
        hs_wait = [HANDSHAKE_WAIT, timeout].min
        hs_deadline = [deadline, Scheduler.now + hs_wait].min
        sock = tls_connect(tcp, endpoint, tls_context, server_name, hs_deadline, hs_wait) if tls_context
        welcome = Handshake.new(sock, endpoint, session_id, token, hs_deadline, hs_wait, tls: !tls_context.nil?).run
        new(sock, tcp, endpoint, index, welcome)
      rescue Exception # rubocop:disable Lint/RescueException -- close the socket on every failure
        close_quietly(tcp)
        raise
      end
    end

    def self.tls_connect(tcp, endpoint, context, server_name, deadline, timeout)
      ssl = OpenSSL::SSL::SSLSocket.new(tcp, context)
      ssl.sync_close = true
      name = server_name || endpoint.host
      ssl.hostname = name unless ip_address?(name)
      loop do
        case ssl.connect_nonblock(exception: false)
        when :wait_readable then Handshake.wait_io(tcp, :read, deadline, endpoint, timeout, tls: true)
        when :wait_writable then Handshake.wait_io(tcp, :write, deadline, endpoint, timeout, tls: true)
        else break
        end
      end
      ssl.post_connection_check(name) if context.verify_mode != OpenSSL::SSL::VERIFY_NONE
      ssl
    rescue OpenSSL::SSL::SSLError, Errno::ECONNRESET, EOFError, Errno::EPIPE => e
      raise TLSError, "#{endpoint}: TLS handshake failed: #{e.message} (is the server using TLS?)"
    end
    private_class_method :tls_connect

    def self.ip_address?(name)
      IPAddr.new(name)
      true
    rescue IPAddr::Error
      false
    end
    private_class_method :ip_address?

    def self.close_quietly(io)
      io&.close
    rescue StandardError
      nil
    end

    def initialize(sock, tcp, endpoint, index, welcome)
      @sock = sock
      @tcp = tcp
      @tls = !sock.equal?(tcp)
      @endpoint = endpoint
      @index = index
      @welcome = welcome
      @wmutex = Mutex.new
      @wcond = ConditionVariable.new
      @wbuf = String.new(capacity: 4096, encoding: Encoding::BINARY)
      @sbuf = String.new(capacity: 256, encoding: Encoding::BINARY) # #send_call's frame
      @writing = false # the writer thread is writing (outside @wmutex)
      @closed = false
      @last_recv = Scheduler.now
      @ping_sent_at = nil
      @ping_call = nil
      @reader = nil
      @activity = 0
      @yield_asked = false
      @bg_cond = ConditionVariable.new
      @rbuf = String.new(encoding: Encoding::BINARY) # bytes of a frame not whole yet
      @chunk = String.new(capacity: READ_SIZE, encoding: Encoding::BINARY)
      @wake_r, @wake_w = IO.pipe
      # IO.select's lists, made once.
      @read_set = [@tcp, @wake_r].freeze
      @wake_set = [@wake_r].freeze
      @tcp_set = [@tcp].freeze
    end

    # Starts the background reader and the writer threads; frames go to
    # +session+.handle_frame, a failure to +session+.connection_failed.
    def start(session)
      @session = session
      @reader_thread = Thread.new { bg_loop }
      @writer = Thread.new { write_loop }
      @reader_thread.name = "ticketing-reader" if @reader_thread.respond_to?(:name=)
      @writer.name = "ticketing-writer" if @writer.respond_to?(:name=)
      self
    end

    # Queues an encoded frame for the writer thread. Never blocks on the network.
    def enqueue(bytes)
      @wmutex.synchronize do
        return if @closed

        @wbuf << bytes
        @wcond.signal unless @writing
      end
    end

    # Queues +call+'s frame (Call#frame_into) for the writer thread.
    def enqueue_call(call)
      @wmutex.synchronize do
        return if @closed

        call.frame_into(@wbuf)
        @wcond.signal unless @writing
      end
    end

    # Writes +call+'s frame from the calling thread without waiting, unless the writer thread is
    # writing or has frames queued (then it writes this one after them). The frame is encoded
    # into a buffer kept for this. What the socket does not take at once, or a write error, is
    # left to the writer thread (which reports a failure). Over TLS the writer thread writes.
    def send_call(call)
      @wmutex.synchronize do
        return if @closed

        if @writing || @tls || !@wbuf.empty?
          call.frame_into(@wbuf)
          @wcond.signal unless @writing
          return
        end
        bytes = @sbuf
        bytes.clear
        call.frame_into(bytes)
        n = begin
          @sock.write_nonblock(bytes, exception: false)
        rescue StandardError
          0 # the writer thread writes it again and reports the failure
        end
        return if n == bytes.bytesize

        @wbuf << (n.is_a?(Integer) ? bytes.byteslice(n, bytes.bytesize - n) : bytes)
        @wcond.signal
      end
    end

    # Wakes the thread that holds the read role from its wait (it looks at its state again).
    def poke
      @wake_w.write_nonblock("!", exception: false)
    rescue StandardError
      nil
    end

    # Reads what the socket has, or waits for bytes or a #poke until +limit+ (monotonic
    # seconds; nil: no limit), and hands every whole frame to the session. Only the holder of
    # the read role calls it. Returns false once the connection has failed (reported to the
    # session), :timeout when nothing was there and +limit+ has passed, true otherwise.
    # Asynchronous interrupts are taken only while waiting (no frame is ever half handled); a
    # caller that reads runs it with them deferred.
    def read_some(limit)
      chunk = read_chunk
      case chunk
      when false then false
      when :wait_readable, :wait_writable
        wait = nil
        if limit
          wait = limit - Scheduler.now
          return :timeout if wait <= 0
        end
        chunk == :wait_readable ? wait_io(wait, @read_set, nil) : wait_io(wait, @wake_set, @tcp_set)
      when nil then lost(EOFError.new)
      else handle_bytes(chunk)
      end
    end

    # Handles what the socket holds now, without waiting (the holder of the read role only),
    # starting with +first+, the result of a #peek, if given.
    def read_pending(first = :unread)
      chunk = first
      loop do
        chunk = read_chunk if chunk == :unread
        case chunk
        when false then return false
        when :wait_readable, :wait_writable then return true
        when nil then return lost(EOFError.new)
        when Exception then return lost(chunk)
        end
        return false unless handle_bytes(chunk)

        chunk = :unread
      end
    end

    # One read that does not wait and has no other effect, for a thread that holds the session's
    # mutex and the read role: the bytes (handle them with #read_pending), :wait_readable or
    # :wait_writable, nil at the end of the stream, or the read's exception.
    def peek
      @tls ? @sock.read_nonblock(READ_SIZE, @chunk, exception: false) : recv_plain
    rescue IOError, SystemCallError, OpenSSL::SSL::SSLError => e
      e
    end

    # One non-blocking read into the connection's buffer: the bytes, :wait_readable or
    # :wait_writable (TLS), nil at the end of the stream, or false once the read failed (the
    # failure reported to the session).
    def read_chunk
      @tls ? @sock.read_nonblock(READ_SIZE, @chunk, exception: false) : recv_plain
    rescue IOError, SystemCallError, OpenSSL::SSL::SSLError => e
      lost(e)
    end

    # One read that does not wait, on plain TCP: BasicSocket#recv_nonblock makes its recvfrom(2)
    # with Ruby's global lock held, where IO#read_nonblock releases the lock and takes it back
    # around the call (with other threads waiting for the lock, a hand-over on nearly every
    # read, and a read of the session's mutex held by a thread that does not run). An empty
    # String is the end of the stream: nil, as #read_nonblock says it.
    def recv_plain
      got = @sock.recv_nonblock(READ_SIZE, 0, @chunk, exception: false)
      got.is_a?(String) && got.empty? ? nil : got
    end

    # Closes the connection: unblocks both threads and closes the socket. Idempotent.
    def close
      @wmutex.synchronize do
        return if @closed

        @closed = true
        @wcond.signal
      end
      begin
        @tcp.shutdown(Socket::SHUT_RDWR)
      rescue StandardError
        nil
      end
      poke
      Connection.close_quietly(@sock)
      Connection.close_quietly(@tcp)
      Connection.close_quietly(@wake_w)
      Connection.close_quietly(@wake_r) unless @reader_thread
    end

    # In a forked child: forget the connection without touching the shared socket's state (no
    # shutdown, no TLS close_notify); only this process's descriptors are closed.
    def abandon
      @closed = true
      Connection.close_quietly(@tcp)
      Connection.close_quietly(@wake_r)
      Connection.close_quietly(@wake_w)
    end

    def closed?
      @wmutex.synchronize { @closed }
    end

    def to_s
      @endpoint.to_s
    end

    private

    # Waits (interruptibly) until +reads+ are readable or +writes+ writable, or +timeout+ passes.
    # Drains the wake-up pipe. Returns true, or false when the connection failed.
    def wait_io(timeout, reads, writes)
      ready = Thread.handle_interrupt(TAKE_INTERRUPTS) { IO.select(reads, writes, nil, timeout) }
      if ready && ready[0].include?(@wake_r)
        loop do
          r = @wake_r.read_nonblock(64, exception: false)
          break if r.nil? || r == :wait_readable
        end
      end
      true
    rescue IOError, SystemCallError => e
      raise unless @closed # an interrupt (Thread#raise) of the caller, not the connection's

      lost(e)
    end

    # Decodes the frames of +chunk+ (after the bytes kept from the last read) and hands each to
    # the session. Returns true, or false when the connection failed.
    def handle_bytes(chunk)
      @last_recv = Process.clock_gettime(Process::CLOCK_MONOTONIC) # Scheduler.now, without a call
      buf = @rbuf.empty? ? chunk : (@rbuf << chunk)
      offset = 0
      size = buf.bytesize
      session = @session
      # Whole, well-formed frames decoded here (the layout of Protocol.decode_response, one
      # unpack each, into locals); a partial or malformed one is left to the slower path below.
      while size - offset >= HEADER_SIZE
        len, op, status, var_len, id, token, lease_ms, detail = buf.unpack(FRAME_HEADER, offset: offset)
        break unless var_len == len - (HEADER_SIZE - 4) && size - offset >= 4 + len

        resp = Protocol::Response.allocate
        resp.op = op
        resp.status = status
        resp.id = id
        resp.token = token
        resp.lease_ms = lease_ms
        resp.detail = detail
        resp.data = var_len.zero? ? NO_DATA : buf.byteslice(offset + HEADER_SIZE, var_len)
        offset += 4 + len
        session.handle_frame(self, resp)
      end
      if offset == size
        # Every byte used (nearly always): nothing to keep.
        @rbuf.clear unless @rbuf.empty?
        return true
      end
      while offset < size && (decoded = Protocol.decode_response(buf, offset))
        resp, frame_size = decoded
        offset += frame_size
        session.handle_frame(self, resp)
      end
      rest = size - offset
      if rest.positive?
        @rbuf = buf.byteslice(offset, rest).b
      elsif !@rbuf.empty?
        @rbuf.clear
      end
      true
    rescue Protocol::FrameError => e
      @session.connection_failed(self, ProtocolError.new("#{@endpoint}: malformed frame from the server: #{e.message}"))
      false
    rescue StandardError => e
      lost(e)
    end

    # Reports the connection's failure (+error+, from a read) to the session. Returns false.
    def lost(error)
      error = case error
              when EOFError then ConnectionLostError.new("#{@endpoint}: the server closed the connection")
              else ConnectionLostError.new("#{@endpoint}: #{error.class}: #{error.message}")
              end
      @session.connection_failed(self, error)
      false
    end

    # The background reader: holds the read role whenever no caller has held it for a while
    # (Session#bg_take_role) and gives it up when a caller asks (Session#bg_keep_role?).
    def bg_loop
      first = true
      while @session.bg_take_role(self, first)
        first = false
        loop do
          return unless read_some(nil)
          break unless @session.bg_keep_role?(self)
        end
      end
    rescue StandardError => e
      @session.connection_failed(self, ConnectionLostError.new("#{@endpoint}: #{e.class}: #{e.message}"))
    ensure
      Connection.close_quietly(@wake_r) if @closed
    end

    def write_loop
      loop do
        data = @wmutex.synchronize do
          @wcond.wait(@wmutex) while (@wbuf.empty? || @writing) && !@closed
          return if @closed

          @writing = true
          out = @wbuf
          @wbuf = String.new(capacity: 4096, encoding: Encoding::BINARY)
          out
        end
        @sock.write(data)
        @wmutex.synchronize { @writing = false }
      end
    rescue StandardError => e
      @session.connection_failed(self, ConnectionLostError.new("#{@endpoint}: write failed: #{e.class}: #{e.message}"))
    end
  end

  # @api private
  # The four-frame handshake (HELLO, CHALLENGE, AUTH, WELCOME) on a connected socket, with a
  # deadline. Returns the Protocol::Welcome or raises an Error naming the endpoint.
  class Handshake
    # Waits until +io+ is readable (+:read+) or writable (+:write+), or raises UnavailableError
    # once +deadline+ passes: a server that accepts but does not answer the handshake (the TLS
    # handshake when +tls+) within the connect timeout (+timeout+ seconds) is unavailable.
    def self.wait_io(io, dir, deadline, endpoint, timeout, tls: false)
      remaining = deadline - Scheduler.now
      ready = remaining.positive? &&
              (dir == :read ? IO.select([io], nil, nil, remaining) : IO.select(nil, [io], nil, remaining))
      return if ready

      if tls
        raise UnavailableError, "#{endpoint}: the TLS handshake did not complete within #{ms(timeout)} ms " \
                                "of the TCP connection (is the server frozen, or not using TLS?)"
      end
      raise UnavailableError, "#{endpoint}: no handshake answer within #{ms(timeout)} ms of the TCP connection " \
                              "(is the server frozen, or not a Ticketing server?)"
    end

    # +seconds+ as whole milliseconds, for messages.
    def self.ms(seconds)
      (seconds * 1000).round
    end

    def initialize(sock, endpoint, session_id, token, deadline, timeout, tls:)
      @sock = sock
      @endpoint = endpoint
      @session_id = session_id
      @token = token
      @deadline = deadline
      @timeout = timeout
      @tls = tls
    end

    def run
      client_nonce = SecureRandom.random_bytes(Protocol::Size::NONCE)
      write(Protocol.encode_hello(session_id: @session_id, nonce: client_nonce))
      challenge = Protocol.decode_challenge(read_frame(Protocol::Size::CHALLENGE,
                                                       Protocol::Size::CHALLENGE + Protocol::Size::MAX_CHALLENGE_DATA,
                                                       first: true))
      check_challenge(challenge)
      proof = @token && Protocol.client_proof(@token, @session_id, client_nonce, challenge.nonce)
      write(Protocol.encode_auth(proof: proof))
      frame = read_frame(Protocol::Size::WELCOME, Protocol::Size::WELCOME)
      welcome = Protocol.decode_welcome(frame)
      check_welcome(welcome)
      if @token
        expected = Protocol.server_proof(@token, @session_id, client_nonce, challenge.nonce,
                                         Protocol.welcome_signed_part(frame))
        unless Protocol.secure_equal?(expected, welcome.proof)
          raise AuthFailedError, "#{@endpoint}: the server's proof did not verify (it does not hold the same token)"
        end
      end
      welcome
    rescue Protocol::FrameError => e
      raise ProtocolError, "#{@endpoint}: malformed handshake frame: #{e.message}"
    rescue EOFError, Errno::ECONNRESET, Errno::EPIPE => e
      hint = @tls ? "" : " (is the server using TLS?)"
      raise UnavailableError, "#{@endpoint}: connection closed during the handshake: #{Errors.syscall_text(e)}#{hint}"
    rescue OpenSSL::SSL::SSLError => e
      raise TLSError, "#{@endpoint}: TLS failed during the handshake: #{e.message}"
    rescue IOError, SystemCallError => e
      raise UnavailableError, "#{@endpoint}: handshake failed: #{e.class}: #{Errors.syscall_text(e)}"
    end

    private

    def check_challenge(challenge)
      data = challenge.data.dup.force_encoding(Encoding::UTF_8).scrub
      case challenge.status
      when Protocol::Status::OK then nil
      when Protocol::Status::NOT_LEADER
        raise Connection::Redirect.new("#{@endpoint}: not the leader (leader: #{data.empty? ? 'unknown' : data})", data)
      when Protocol::Status::UNSUPPORTED_VERSION
        raise UnsupportedVersionError, "#{@endpoint}: #{Errors.phrase('the server does not speak protocol version 1', data)}"
      when Protocol::Status::BUSY
        limit = Protocol.name_of(Protocol::BusyLimit, challenge.detail)
        raise BusyError.new("#{@endpoint}: #{Errors.phrase("server busy (limit #{limit || challenge.detail})", data)}",
                            limit: limit ? limit.downcase.to_sym : challenge.detail)
      when Protocol::Status::SHUTTING_DOWN
        raise ShuttingDownError, "#{@endpoint}: #{Errors.phrase('server shutting down', data)}"
      else
        raise ProtocolError, "#{@endpoint}: #{Errors.phrase("CHALLENGE status #{challenge.status}", data)}"
      end
      if challenge.version != Protocol::VERSION
        raise UnsupportedVersionError, "#{@endpoint}: the server speaks protocol version #{challenge.version}, not 1"
      end
      return unless @token && !challenge.auth_required?

      raise AuthFailedError, "#{@endpoint}: the server does not require a token, so it cannot prove it holds " \
                             "ours; refusing it (connect without a token, or configure the server's token)"
    end

    def check_welcome(welcome)
      case welcome.status
      when Protocol::Status::OK then nil
      when Protocol::Status::AUTH_FAILED
        raise AuthFailedError, "#{@endpoint}: the server requires a token (none configured)" unless @token

        raise AuthFailedError, "#{@endpoint}: authentication failed (wrong token)"
      when Protocol::Status::BUSY
        limit = Protocol.name_of(Protocol::BusyLimit, welcome.detail)
        raise BusyError.new("#{@endpoint}: server busy (limit #{limit || welcome.detail})",
                            limit: limit ? limit.downcase.to_sym : welcome.detail)
      when Protocol::Status::SHUTTING_DOWN
        raise ShuttingDownError, "#{@endpoint}: server shutting down"
      when Protocol::Status::NOT_LEADER
        raise Connection::Redirect.new("#{@endpoint}: not the leader", "")
      else
        raise ProtocolError, "#{@endpoint}: WELCOME status #{welcome.status}"
      end
    end

    def write(bytes)
      @sock.write(bytes)
    end

    def read_frame(min, max, first: false)
      head = read_exact(4)
      if first && !@tls && [0x15, 0x16].include?(head.getbyte(0)) && head.getbyte(1) == 0x03
        raise TLSError, "#{@endpoint}: the server answered with TLS (is the server using TLS? pass tls:)"
      end
      len = head.unpack1("N")
      unless (len + 4).between?(min, max)
        raise ProtocolError, "#{@endpoint}: handshake frame length #{len} is not a Ticketing handshake" \
                             "#{@tls ? '' : ' (is the server using TLS?)'}"
      end
      head << read_exact(len)
    end

    def read_exact(size)
      buf = String.new(capacity: size, encoding: Encoding::BINARY)
      while buf.bytesize < size
        chunk = @sock.read_nonblock(size - buf.bytesize, exception: false)
        case chunk
        when :wait_readable then Handshake.wait_io(@sock, :read, @deadline, @endpoint, @timeout)
        when :wait_writable then Handshake.wait_io(@sock, :write, @deadline, @endpoint, @timeout)
        when nil then raise EOFError, "end of stream"
        else buf << chunk
        end
      end
      buf
    end
  end
end
