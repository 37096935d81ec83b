# frozen_string_literal: true

require "openssl"

module Ticketing
  # What INSPECT reports about a key. Durations are float seconds.
  #
  # - +held+: somebody holds the key
  # - +token+: the holder's token, only when +token_match+ or +mine+ (else nil)
  # - +lease_left+: seconds left on the holder's lease
  # - +waiters+: acquires queued on the key
  # - +held_for+: seconds since the lock was granted
  # - +lock_delay_left+: seconds of lock-delay left after an expiry, or of the server's start-up
  #   wait (with +startup+)
  # - +token_match+: the token asked about is the holder's
  # - +mine+: this client's session holds the key
  # - +stalled+: the key waits for the server's storage before its next grant
  # - +startup+: the server is in its start-up wait (a restarted single node: leases granted
  #   before the restart may still run); no grant before it ends, +lock_delay_left+ says when
  KeyInfo = Struct.new(:held, :token, :lease_left, :waiters, :held_for, :lock_delay_left, :token_match,
                       :mine, :stalled, :startup, keyword_init: true) do
    alias_method :held?, :held
    alias_method :token_match?, :token_match
    alias_method :mine?, :mine
    alias_method :stalled?, :stalled
    alias_method :startup?, :startup
  end

  # A Ticketing client: one connection shared by every thread of the process, requests pipelined
  # and answers matched by request id, so a waiting acquire never holds back other calls.
  #
  #   client = Ticketing::Client.new(endpoints: ["127.0.0.1:7070"], token: ENV["TICKETING_TOKEN"])
  #   client.lock("order-1234", lease: 30) do |lock|
  #     charge(order, fencing_token: lock.token)
  #   end
  #   client.close
  #
  # The client connects on first use (or #connect). If the connection drops it reconnects in the
  # background, trying the endpoints in order with backoff, and resumes its session: requests in
  # flight are re-sent with their original ids (an acquire keeps its queue place and is never
  # granted twice). Locks survive a reconnect: the server keeps them until their lease ends.
  #
  # Closing withdraws the acquires still queued on the server; it does not release held locks
  # unless +release_on_close: true+.
  #
  # Thread-safe. After +fork+ the child gets a new session (new id, own connection); the
  # parent's socket is never used by the child.
  class Client
    # Default endpoint list.
    DEFAULT_ENDPOINTS = ["127.0.0.1:7070"].freeze
    # Default connect timeout (TCP + TLS + handshake, per endpoint), seconds.
    DEFAULT_CONNECT_TIMEOUT = 5.0
    # Default request timeout, seconds (excludes the time an acquire spends queued).
    DEFAULT_REQUEST_TIMEOUT = 10.0
    # Default heartbeat interval, seconds.
    DEFAULT_HEARTBEAT_INTERVAL = 2.0
    # Default first reconnect delay, seconds (doubling, with jitter).
    DEFAULT_RECONNECT_DELAY = 0.05
    # Default longest reconnect delay, seconds.
    DEFAULT_RECONNECT_DELAY_MAX = 2.0
    # Default time a cancelled acquire waits for its clean-up, seconds.
    DEFAULT_CLEANUP_TIMEOUT = 5.0

    class << self
      # Creates a client, connects, yields it and closes it when the block exits; returns the
      # block's value. Without a block, returns the connected client.
      def open(**options)
        client = new(**options).connect
        return client unless block_given?

        begin
          yield client
        ensure
          client.close
        end
      end
    end

    # Options (keyword arguments), each with its default:
    #
    # - +endpoints+: "host:port" or a list of them, tried in order (a leader hint first when a
    #   cluster node names one). Default "127.0.0.1:7070".
    # - +token+: the shared auth token (String). Default nil (no auth). With a token, a server
    #   that does not require one is refused, and the server must prove it holds the same token.
    # - +tls+: nil (plain TCP, the default); +true+ (TLS, verified against the system's CAs); a
    #   Hash with +ca_file+ / +ca_path+ (CA bundle), +cert_file+ + +key_file+ or +cert+ + +key+
    #   (client certificate: mutual TLS), +server_name+ (name to verify, default the endpoint's
    #   host), +verify+ (default true); or an OpenSSL::SSL::SSLContext used as is.
    # - +connect_timeout+: seconds for TCP + TLS + handshake, per endpoint; once TCP is
    #   connected, TLS and the handshake get at most 2 s of it (a frozen node accepts TCP).
    #   Default 5.0.
    # - +request_timeout+: seconds to wait for any answer, except the time an acquire spends
    #   queued (bounded by its +timeout+ and the heartbeat instead). Default 10.0.
    # - +heartbeat_interval+: after this many seconds without receiving anything (at most 0.25
    #   while any request waits for its answer, a queued acquire included), send PING; a PING
    #   unanswered within min(+heartbeat_interval+, 0.75) gives the connection up as silent: it
    #   is replaced, the session resumes and the calls in flight keep waiting; for 2 s the node
    #   just left is neither dialled nor followed as a leader hint (unless it is the only
    #   endpoint), then it is tried last. Default 2.0; 0 disables.
    # - +reconnect_delay+, +reconnect_delay_max+: backoff between reconnect rounds, doubling
    #   with jitter. Defaults 0.05 and 2.0.
    # - +cleanup_timeout+: seconds a cancelled acquire (and #close, for the acquires it
    #   withdraws) waits for the server to confirm the withdrawal (and the release of a grant
    #   that raced it); the rest finishes in the background. Default 5.0.
    # - +release_on_close+: #close releases every lock still held. Default false.
    # - +logger+: a Logger for background events (reconnects, failed keep-alive). Default nil.
    def initialize(endpoints: DEFAULT_ENDPOINTS, token: nil, tls: nil, connect_timeout: DEFAULT_CONNECT_TIMEOUT,
                   request_timeout: DEFAULT_REQUEST_TIMEOUT, heartbeat_interval: DEFAULT_HEARTBEAT_INTERVAL,
                   reconnect_delay: DEFAULT_RECONNECT_DELAY, reconnect_delay_max: DEFAULT_RECONNECT_DELAY_MAX,
                   cleanup_timeout: DEFAULT_CLEANUP_TIMEOUT, release_on_close: false, logger: nil)
      list = Array(endpoints)
      raise InvalidArgumentError.new("endpoints must not be empty", field: :endpoints) if list.empty?
      unless token.nil? || (token.is_a?(String) && !token.empty?)
        raise InvalidArgumentError.new("token must be a non-empty String or nil", field: :token)
      end

      context, server_name = Client.tls_context(tls)
      @config = Session::Config.new(
        endpoints: list.map { |e| Endpoint.parse(e) }.freeze,
        token: token&.b&.freeze,
        tls_context: context,
        server_name: server_name,
        connect_timeout: Args.duration(connect_timeout, :connect_timeout, positive: true),
        request_timeout: Args.duration(request_timeout, :request_timeout, positive: true),
        heartbeat_interval: Args.duration(heartbeat_interval || 0, :heartbeat_interval),
        reconnect_delay: Args.duration(reconnect_delay, :reconnect_delay, positive: true),
        reconnect_delay_max: Args.duration(reconnect_delay_max, :reconnect_delay_max, positive: true),
        logger: logger
      )
      @cleanup_timeout = Args.duration(cleanup_timeout, :cleanup_timeout)
      @release_on_close = release_on_close ? true : false
      @logger = logger
      init_state
      @fork_generation = Ticketing.fork_generation
    end

    # Connects now (one round over the endpoints) unless connected. Returns self. Raises
    # UnavailableError (nothing answered), AuthFailedError, TLSError, UnsupportedVersionError...
    # A round in which a node answered NOT_LEADER (a cluster electing a leader) is retried every
    # +reconnect_delay+ (with jitter) until it connects or +request_timeout+ has passed since the
    # call began (then the last round's UnavailableError), or until +cancel+ (a Cancellation) is
    # cancelled: then CancelledError, at once between rounds, after the round under way (each dial
    # is bounded by +connect_timeout+).
    def connect(cancel: nil)
      check_fork
      check_cancel(cancel)
      @session.connect(cancel: cancel)
      self
    end

    # Whether the client has a live connection now.
    def connected?
      check_fork
      @session.connected?
    end

    # Whether #close was called.
    def closed?
      check_fork
      @session.closed?
    end

    # The 16-byte session id (a binary String): random per client and per forked child, kept
    # across reconnects, renewed when the server restarted.
    def session_id
      check_fork
      @session.id
    end

    # The endpoints, as "host:port" Strings.
    def endpoints
      @config.endpoints.map(&:to_s)
    end

    # Takes the lock on +key+ for +lease+ seconds, waiting in the server's FIFO queue. Returns a
    # Lock, or nil when +timeout+ seconds passed without a grant (nil: wait without limit, the
    # default; 0: try once). The lease starts when the lock is granted.
    #
    # Options:
    # - +keep_alive+: extend the lease in the background every lease/3 until release or loss
    #   (default false); +max_hold+: stop keep-alive after this many seconds (default nil: no cap).
    # - +refuse_held+: raise AlreadyHeldError at once if this client already holds +key+, instead
    #   of queueing behind itself (default false).
    # - +cancel+: a Cancellation; cancelling it withdraws the wait (CANCEL), releases a grant
    #   that raced it, and raises CancelledError.
    #
    # A call unwound any other way (Timeout.timeout, which unwinds with +throw+ on some Ruby
    # versions and +raise+ on others, Thread#raise, Thread#kill, Interrupt) withdraws its wait
    # the same way, in the background: the wait never stays queued to be granted later, and a
    # grant that raced the interruption is released.
    def acquire(key, lease:, timeout: nil, keep_alive: false, max_hold: nil, refuse_held: false, cancel: nil)
      take(key, lease, timeout, keep_alive, max_hold, refuse_held, cancel, raising: false)
    end

    # Takes the lock on +key+ only if it is free and nobody is queued: a Lock, or nil. Options
    # as for #acquire.
    def try_acquire(key, lease:, **options)
      return take(key, lease, 0, false, nil, false, nil, raising: false) if options.empty?

      acquire(key, lease: lease, **options, timeout: 0)
    end

    # The block form: acquires +key+ (as #acquire), yields the Lock, and releases it when the
    # block exits (also on an exception, a +throw+ or Thread#kill). Returns the block's value.
    # Yields nil when +timeout+ passed without a grant (use #lock! to raise instead).
    #
    # If the lock was lost while the block ran, raises LockLostError (naming the reason) after
    # the block finishes, unless +raise_on_lost: false+. Without a block, returns what #acquire
    # returns.
    def lock(key, lease:, raise_on_lost: true, **options, &block)
      held = acquire(key, lease: lease, **options)
      return held unless block
      return yield(nil) if held.nil?

      scoped(held, raise_on_lost, &block)
    end

    # As #lock, but raises NotAcquiredError instead of yielding (or returning) nil; its message
    # says why when the server does (its start-up wait after a restart).
    def lock!(key, lease:, raise_on_lost: true, timeout: nil, keep_alive: false, max_hold: nil, refuse_held: false,
              cancel: nil, &block)
      held = take(key, lease, timeout, keep_alive, max_hold, refuse_held, cancel, raising: true)
      return held unless block

      scoped(held, raise_on_lost, &block)
    end

    # Releases the lock on +key+ held with +token+, from any client (the owner is the token).
    # Returns true; raises NotHeldError when +token+ does not hold +key+ (expired, released,
    # wrong): nothing changed. Prefer Lock#release when you have the Lock.
    def release(key, token)
      release_token(Args.key(key), Args.token(token))
      true
    end

    # Sets the lease of the lock on +key+ held with +token+ to +lease+ seconds from now, from any
    # client. Returns the lease granted (seconds); raises NotHeldError. Prefer Lock#extend.
    def extend_lease(key, token, lease:)
      resp, = extend_token(Args.key(key), Args.token(token), Args.lease_ms(lease))
      resp.lease_ms / 1000.0
    end

    # Reports the state of +key+ (a KeyInfo). With +token+, also whether it is the holder's.
    # Changes nothing.
    def inspect_key(key, token: nil)
      key = Args.key(key)
      token = token.nil? ? 0 : Args.token(token)
      resp = request(Protocol::Op::INSPECT, key: key, token: token).response
      data = resp.data.to_s
      held_for, delay, flags = data.bytesize >= Protocol::Size::INSPECT_DATA ? data.unpack("NNN") : [0, 0, 0]
      mine = flags.anybits?(Protocol::InspectFlag::SESSION)
      match = flags.anybits?(Protocol::InspectFlag::TOKEN_MATCH)
      KeyInfo.new(held: flags.anybits?(Protocol::InspectFlag::HELD), token: (mine || match) ? resp.token : nil,
                  lease_left: resp.lease_ms / 1000.0, waiters: resp.detail, held_for: held_for / 1000.0,
                  lock_delay_left: delay / 1000.0, token_match: match, mine: mine,
                  stalled: flags.anybits?(Protocol::InspectFlag::STALLED),
                  startup: flags.anybits?(Protocol::InspectFlag::STARTUP))
    end

    # Sends PING and waits for the answer. Returns the round trip in seconds.
    def ping
      started = Scheduler.now
      request(Protocol::Op::PING)
      Scheduler.now - started
    end

    # Closes the client: withdraws the acquires still queued on the server (CANCEL; their
    # callers get ClosedError at once, and a grant that races the withdrawal is released),
    # waiting at most +cleanup_timeout+ for the server's answers, so that a closed client is
    # never granted a lock it would hold until its session ends. Then calls in flight raise
    # ClosedError, keep-alive stops, later calls raise ClosedError. Locks still held are NOT
    # released (the server keeps them until their lease ends) unless +release_on_close: true+,
    # in which case they are released first (bounded by the request timeout). Idempotent;
    # returns nil.
    def close
      return nil if @session.closed?
      return nil if @close_mutex.synchronize { @closing ? true : (@closing = true) && false }

      locks = @locks_mutex.synchronize { @locks.values }
      locks.each(&:stop_keep_alive)
      withdraw_queued
      release_all(locks) if @release_on_close && !locks.empty?
      @session.close
      @scheduler.shutdown
      @events_mutex.synchronize do
        @events&.push(:stop)
        @events = nil
      end
      nil
    end

    # A short description: endpoints and session id.
    def inspect
      "#<#{self.class.name} endpoints=#{endpoints.join(',')} session=#{session_id.unpack1('H*')}>"
    end

    # @api private
    # Builds the SSLContext for the +tls+ option. Returns [context or nil, server_name or nil].
    def self.tls_context(tls)
      case tls
      when nil, false then [nil, nil]
      when OpenSSL::SSL::SSLContext then [tls, nil]
      when true then tls_context({})
      when Hash
        opts = tls.transform_keys(&:to_sym)
        unknown = opts.keys - %i[ca_file ca_path cert_file key_file cert key server_name verify]
        raise InvalidArgumentError.new("unknown tls options: #{unknown.join(', ')}", field: :tls) unless unknown.empty?

        ctx = OpenSSL::SSL::SSLContext.new
        ctx.min_version = OpenSSL::SSL::TLS1_2_VERSION
        verify = opts.fetch(:verify, true)
        ctx.verify_mode = verify ? OpenSSL::SSL::VERIFY_PEER : OpenSSL::SSL::VERIFY_NONE
        store = OpenSSL::X509::Store.new
        if opts[:ca_file] || opts[:ca_path]
          store.add_file(opts[:ca_file]) if opts[:ca_file]
          store.add_path(opts[:ca_path]) if opts[:ca_path]
        else
          store.set_default_paths
        end
        ctx.cert_store = store
        cert = opts[:cert] || (opts[:cert_file] && File.read(opts[:cert_file]))
        key = opts[:key] || (opts[:key_file] && File.read(opts[:key_file]))
        if cert || key
          raise InvalidArgumentError.new("tls: a client certificate needs both cert and key", field: :tls) unless cert && key

          ctx.cert = cert.is_a?(OpenSSL::X509::Certificate) ? cert : OpenSSL::X509::Certificate.new(cert)
          ctx.key = key.is_a?(OpenSSL::PKey::PKey) ? key : OpenSSL::PKey.read(key)
        end
        [ctx, opts[:server_name]]
      else
        raise InvalidArgumentError.new("tls must be nil, true, a Hash or an OpenSSL::SSL::SSLContext", field: :tls)
      end
    rescue OpenSSL::OpenSSLError, SystemCallError => e
      raise TLSError, "tls configuration: #{e.message}"
    end

    private

    attr_reader :session, :scheduler

    def init_state
      @scheduler = Scheduler.new(logger: @logger)
      @session = Session.new(@config, self, @scheduler)
      @locks_mutex = Mutex.new
      @locks = {} # token => Lock held through this client
      @deadlines = [] # the held locks' lost deadlines (a heap; see #deadline_add)
      @deadline_timer = nil
      @deadline_at = nil
      @events_mutex = Mutex.new
      @events = nil
      @close_mutex = Mutex.new
      @closing = false
    end

    def reset_after_fork
      locks = @locks.values
      @scheduler.reset_after_fork
      @session.reset_after_fork
      @locks_mutex = Mutex.new
      @locks = {}
      @deadlines = []
      @deadline_timer = nil
      @deadline_at = nil
      @events_mutex = Mutex.new
      @events = nil
      @close_mutex = Mutex.new
      locks.each(&:detach_after_fork)
    end

    # In a forked child (see ForkHook), the first call starts a new session: new id, no
    # connection, no calls of the parent's threads; the parent's socket is left alone.
    def check_fork
      return if @fork_generation == Ticketing.fork_generation

      Ticketing.fork_mutex.synchronize do
        return if @fork_generation == Ticketing.fork_generation

        reset_after_fork
        @fork_generation = Ticketing.fork_generation
      end
    end

    def ensure_connected
      check_fork
      @session.connect unless @session.started?
    end

    def check_cancel(cancel)
      return if cancel.nil? || cancel.is_a?(Cancellation)

      raise InvalidArgumentError.new("cancel must be a Ticketing::Cancellation, not #{cancel.class}", field: :cancel)
    end

    def holds?(key)
      @locks_mutex.synchronize { @locks.each_value.any? { |l| l.key == key } }
    end

    def retry_elsewhere?(resp, attempts)
      resp.status == Protocol::Status::SHUTTING_DOWN && @config.endpoints.size > 1 &&
        attempts <= @config.endpoints.size
    end

    # Sends one request and waits for its answer (within the request timeout). Returns the Call,
    # answered OK (#response, #t_first); raises the status's error. SHUTTING_DOWN with other
    # endpoints is retried there.
    def request(op, key: Call::EMPTY_KEY, token: 0, lease_ms: 0)
      ensure_connected
      attempts = 0
      while true # rubocop:disable Style/InfiniteLoop -- Kernel#loop costs a block per call
        call = Call.new(op, key, token, lease_ms)
        outcome = nil
        begin
          deadline = Scheduler.now + @config.request_timeout
          # The caller reads its own answer in #submit when nothing else is in flight.
          @session.submit(call, true, true, deadline)
          outcome = if call.finished && !call.closed_out
                      :finished
                    else
                      @session.await(call, deadline: deadline, send_deadline: deadline)
                    end
        ensure
          # Unwound (an exception, a throw, Thread#kill): forget the request.
          @session.forget(call) if outcome.nil? && @session.abandon(call)
        end
        if outcome != :finished
          @session.forget(call)
          raise_timeout(call, @config.request_timeout)
        end
        raise call.error if call.error

        resp = call.response
        return call if resp.status == Protocol::Status::OK

        name = call.op_name
        error = Errors.from_response(name, resp, key: key.empty? ? nil : key,
                                                 token: [Protocol::Op::RELEASE, Protocol::Op::EXTEND].include?(op) ? token : nil)
        raise error unless retry_elsewhere?(resp, attempts += 1)
      end
    end

    # Raises the TimeoutError of +call+, whose own timeout (+seconds+) passed. While the client
    # reconnects, it names the last connect error, which is also its cause.
    def raise_timeout(call, seconds)
      message = "#{describe_call(call)}: no answer within #{seconds} s"
      raise TimeoutError, message if @session.connected?

      error = @session.last_error
      why = call.id ? "the connection was lost and not re-established" : "not connected"
      raise TimeoutError, "#{message} (#{why}#{error ? "; last error: #{error.message}" : ''})", cause: error
    end

    def describe_call(call)
      call.key.empty? ? call.op_name : "#{call.op_name} #{Errors.describe_key(call.key)}"
    end

    # RELEASE by key and token. +lock+ (the Lock released, if any): when a first attempt's
    # outcome is unknown (its session was not resumed), a second attempt answered NOT_HELD
    # counts as released if the lock was certainly still held before the first attempt.
    def release_token(key, token, lock = nil)
      request(Protocol::Op::RELEASE, key: key, token: token)
    rescue ConnectionLostError
      raise unless lock

      begin
        request(Protocol::Op::RELEASE, key: key, token: token)
      rescue NotHeldError
        raise unless lock.__send__(:held_before_release?)
      end
    end

    # EXTEND by key and token: [Response, t_first].
    def extend_token(key, token, lease_ms)
      call = request(Protocol::Op::EXTEND, key: key, token: token, lease_ms: lease_ms)
      [call.response, call.t_first]
    end

    # EXTEND without waiting: the block gets (response, error, t_first) on the reader thread.
    def extend_async(key, token, lease_ms, &block)
      call = Call.new(Protocol::Op::EXTEND, key, token, lease_ms)
      call.hook = ->(resp, error, _abandoned) { block.call(resp, error, call.t_first) }
      @session.submit(call)
    end

    # #acquire and #lock!: returns the Lock, or nil when not acquired (+raising+: raises
    # NotAcquiredError instead, with the server's reason when it gives one).
    #
    # However the call is left (an answer, an error, cancellation, or unwinding by an exception,
    # a throw or Thread#kill), the ACQUIRE never stays queued behind the caller's back: the
    # +ensure+ below runs on every exit the normal paths did not settle (a completion flag, not
    # +rescue+, which a throw passes by), withdraws a wait still queued (CANCEL), and releases a
    # grant that raced the unwinding.
    def take(key, lease, timeout, keep_alive, max_hold, refuse_held, cancel, raising:)
      key = Args.key(key)
      lease_ms = Args.lease_ms(lease)
      wait_ms = Args.wait_ms(timeout)
      max_hold = Args.duration(max_hold, :max_hold, positive: true) unless max_hold.nil?
      if cancel
        check_cancel(cancel)
        raise CancelledError, "ACQUIRE #{Errors.describe_key(key)}: cancelled" if cancel.cancelled?
      end
      if refuse_held && holds?(key)
        raise AlreadyHeldError, "ACQUIRE #{Errors.describe_key(key)}: already held by this client (refuse_held)"
      end
      raise ClosedError, "ACQUIRE #{Errors.describe_key(key)}: the client is closed" if @closing

      ensure_connected
      attempts = 0
      while true # rubocop:disable Style/InfiniteLoop -- Kernel#loop costs a block per call
        call = Call.new(Protocol::Op::ACQUIRE, key, 0, lease_ms, wait_ms)
        # The answer goes to #answered (no closure per call).
        call.hook = self
        call.keep_alive = keep_alive
        call.max_hold = max_hold
        resp = nil
        begin
          resp = await_acquire(call, timeout, cancel)
          lock = call.value if resp.status == Protocol::Status::OK
        ensure
          settle_unwound(call) unless resp || call.settled
        end
        return lock if resp.status == Protocol::Status::OK
        if resp.status == Protocol::Status::TIMED_OUT
          return nil unless raising

          raise Errors.from_response("ACQUIRE", resp, key: key, wait_ms: wait_ms)
        end

        error = Errors.from_response("ACQUIRE", resp, key: key)
        raise error unless retry_elsewhere?(resp, attempts += 1)
      end
    end

    # Submits an ACQUIRE and waits: for its answer, or until cancelled / timed out (then the
    # wait is withdrawn). Returns the Response; raises for transport errors and cancellation,
    # after marking the call settled (its clean-up is under way).
    def await_acquire(call, timeout, cancel)
      now = Scheduler.now
      send_deadline = now + @config.request_timeout
      deadline = timeout && now + timeout + @config.request_timeout
      # Without a cancellation the caller reads its own answer in #submit when nothing else is
      # in flight (a cancellation is watched by #await).
      @session.submit(call, true, cancel.nil?, deadline)
      outcome = if cancel.nil? && call.finished && !call.closed_out
                  :finished
                else
                  @session.await(call, deadline: deadline, send_deadline: send_deadline, cancel: cancel)
                end
      if outcome == :closed
        # Client#close withdrew it (CANCEL) and releases a grant that races the withdrawal.
        call.settled = true
        raise ClosedError, "#{describe_call(call)}: the client was closed; the queued acquire was withdrawn"
      end
      if outcome == :finished
        if cancel&.cancelled? && call.value.is_a?(Lock)
          release_quietly(call.value)
          call.settled = true
          raise CancelledError, "#{describe_call(call)}: cancelled"
        end
        if call.error
          call.settled = true
          raise call.error
        end

        return call.response
      end
      @session.withdraw(call)
      call.settled = true
      if outcome == :cancelled
        # Wait (bounded) until the withdrawal is confirmed, so that the caller rarely returns
        # while a raced grant is still being released; the clean-up finishes in the background.
        @session.await_cleanup(call, Scheduler.now + @cleanup_timeout)
        raise CancelledError, "#{describe_call(call)}: cancelled"
      end
      # Timed out: the server did not answer in time, so waiting for its clean-up answer would
      # only stretch the timeout. The withdrawal goes on in the background.

      raise_timeout(call, timeout && call.id ? timeout + @config.request_timeout : @config.request_timeout)
    end

    # An ACQUIRE whose caller was unwound before it took the outcome (an exception, a throw,
    # Thread#kill): withdraw it if it is still waiting (its hook releases a grant that arrives
    # later), or release the Lock it was granted, which no caller will ever see. Runs with
    # asynchronous interrupts deferred, so that a second one cannot cut the clean-up short.
    def settle_unwound(call)
      Thread.handle_interrupt(DEFER_INTERRUPTS) do
        if @session.abandon(call)
          @session.withdraw(call)
        elsif @session.await_finished(call, Scheduler.now + 1.0) && call.value.is_a?(Lock)
          release_quietly(call.value)
        end
      end
    rescue Error => e
      @logger&.warn("ticketing: withdrawing an interrupted acquire: #{e.message}")
    end

    # Client#close: withdraws the acquires still queued (see Session#withdraw_acquires), waiting
    # at most the cleanup timeout (less once the connection is gone: nothing more can be
    # withdrawn then).
    def withdraw_queued
      calls = @session.withdraw_acquires
      @session.await_cleanups(calls, Scheduler.now + @cleanup_timeout) unless calls.empty?
    rescue Error => e
      @logger&.warn("ticketing: withdrawing queued acquires on close: #{e.message}")
    end

    # The ACQUIRE's hook (reader thread): on OK, build the Lock and arm it, or, when the caller
    # has given up, release the grant.
    #
    # The local deadline is t_first + (detail + lease_ms)(1 - 2 rho) whichever transmission the
    # answer is for: the request first arrived after t_first, and the server's lease ends
    # detail + lease_ms after that arrival (for a retry answered from its table too: detail is
    # then the time since the first arrival, lease_ms the lease left). Counting from a re-send
    # instead would be late for a grant decided before the re-send and read after it.
    def acquire_answered(call, resp, error, abandoned, keep_alive, max_hold)
      return nil if error || resp.status != Protocol::Status::OK

      deadline = call.t_first + ((resp.detail + resp.lease_ms) / 1000.0 * Session::RATE_FACTOR)
      lock = Lock.new(self, call.key, resp.token, resp.lease_ms, deadline)
      if abandoned
        release_abandoned(call, lock)
        return nil
      end
      @locks_mutex.synchronize do
        @locks[lock.token] = lock
        deadline_push_locked(lock)
      end
      @session.lock_granted
      lock.arm(keep_alive: keep_alive, max_hold: max_hold) if keep_alive
      lock
    end

    # The hook of the calls this client makes with +hook = self+ (Session#deliver): an
    # ACQUIRE's answer, on the thread that read it.
    def answered(call, resp, error, abandoned)
      acquire_answered(call, resp, error, abandoned, call.keep_alive, call.max_hold)
    end

    # Lost deadlines: one binary min-heap of the held locks by the time their lost signal fires
    # (Lock#heap_at, Lock#heap_index; under @locks_mutex), and one scheduler task for its first
    # (@deadline_at: when that task runs, nil when none is set). A lock leaves the heap when it
    # is released or lost (#forget_lock); the task is then left to run, finds nothing due and is
    # set again for the new first: no timer per lock.
    def deadline_add(lock)
      @locks_mutex.synchronize { deadline_add_locked(lock) }
    end

    # Puts +lock+, just granted and counted in @locks, in the heap (#deadline_add_locked
    # without its looks for a lock already there). @locks_mutex held.
    def deadline_push_locked(lock)
      at = lock.__send__(:fire_at)
      heap = @deadlines
      i = heap.size
      heap << lock
      lock.heap_index = i
      lock.heap_at = at
      deadline_up(i) unless i.zero?
      return unless heap[0].equal?(lock) && (@deadline_at.nil? || at < @deadline_at)

      @deadline_timer&.cancel
      @deadline_at = at
      @deadline_timer = @scheduler.at(at) { deadlines_due }
    end

    # Puts +lock+ in the heap, or moves it to its current deadline (read here, after the write
    # that changed it). Only a lock still held through this client. @locks_mutex held.
    def deadline_add_locked(lock)
      return unless @locks[lock.token].equal?(lock)

      at = lock.__send__(:fire_at)
      heap = @deadlines
      i = lock.heap_index
      if i.nil?
        i = heap.size
        heap << lock
        lock.heap_index = i
        lock.heap_at = at
        deadline_up(i)
      else
        lock.heap_at = at
        deadline_down(deadline_up(i))
      end
      return unless heap[0].equal?(lock) && (@deadline_at.nil? || at < @deadline_at)

      @deadline_timer&.cancel
      @deadline_at = at
      @deadline_timer = @scheduler.at(at) { deadlines_due }
    end

    # Takes +lock+ out of the heap (@locks_mutex held).
    def deadline_remove_locked(lock)
      i = lock.heap_index
      return unless i

      lock.heap_index = nil
      heap = @deadlines
      last = heap.pop
      return if last.equal?(lock)

      heap[i] = last
      last.heap_index = i
      deadline_down(deadline_up(i))
    end

    def deadline_up(i)
      heap = @deadlines
      lock = heap[i]
      at = lock.heap_at
      while i.positive?
        parent = (i - 1) >> 1
        other = heap[parent]
        break if other.heap_at <= at

        heap[i] = other
        other.heap_index = i
        i = parent
      end
      heap[i] = lock
      lock.heap_index = i
      i
    end

    def deadline_down(i)
      heap = @deadlines
      n = heap.size
      lock = heap[i]
      at = lock.heap_at
      loop do
        c = (2 * i) + 1
        break if c >= n

        c += 1 if c + 1 < n && heap[c + 1].heap_at < heap[c].heap_at
        other = heap[c]
        break if at <= other.heap_at

        heap[i] = other
        other.heap_index = i
        i = c
      end
      heap[i] = lock
      lock.heap_index = i
      i
    end

    # The deadline task (scheduler thread): the locks whose time has come are taken out of the
    # heap and checked (Lock#deadline_reached marks each lost, or puts back one extended
    # meanwhile); the task is set again for the new first.
    def deadlines_due
      due = []
      @locks_mutex.synchronize do
        @deadline_timer = nil
        @deadline_at = nil
        now = Clock.now
        heap = @deadlines
        while (first = heap[0]) && first.heap_at <= now
          deadline_remove_locked(first)
          due << first
        end
        if first
          @deadline_at = first.heap_at
          @deadline_timer = @scheduler.at(@deadline_at) { deadlines_due }
        end
      end
      due.each { |lock| lock.__send__(:deadline_reached) }
    end

    # Whether any lock is held through this client (the session reconnects at once for them).
    def holding_locks?
      @locks_mutex.synchronize { !@locks.empty? }
    end

    # Releases a grant whose acquire was withdrawn; marks the acquire's clean-up done after.
    def release_abandoned(call, lock)
      release = Call.new(Protocol::Op::RELEASE, lock.key, lock.token)
      release.hook = lambda do |resp, error, _abandoned|
        if error || resp.status != Protocol::Status::OK
          @logger&.warn("ticketing: could not release #{Errors.describe_key(lock.key)} token #{lock.token} " \
                        "granted after its acquire was withdrawn: #{error&.message || resp.status}; " \
                        "it is held until its lease ends")
        end
        @session.cleanup_done(call)
        nil
      end
      @session.submit(release)
    rescue ClosedError
      @session.cleanup_done(call)
    end

    # Lock#release of a lock already lost: tells the server in the background (bounded by the
    # request timeout); the answer changes nothing here. A closed client sends nothing.
    def release_in_background(key, token)
      return if @closing || @session.closed?

      Thread.new do
        request(Protocol::Op::RELEASE, key: key, token: token)
      rescue Error => e
        @logger&.debug("ticketing: background release of a lost lock (#{Errors.describe_key(key)} token #{token}): " \
                       "#{e.message}")
      end
    end

    def release_quietly(lock)
      Thread.new do
        lock.release
      rescue Error => e
        @logger&.warn("ticketing: releasing #{lock}: #{e.message}")
      end
    end

    def release_all(locks)
      threads = locks.map do |l|
        Thread.new do
          l.release
        rescue Error => e
          @logger&.warn("ticketing: release on close: #{l}: #{e.message}")
        end
      end
      deadline = Scheduler.now + @config.request_timeout
      threads.each { |t| t.join([deadline - Scheduler.now, 0].max) }
    end

    # Runs the block of #lock / #lock! with +held+ and releases it on every exit. The release on
    # unwinding (an exception, a throw, Thread#kill) runs from +ensure+ with a completion flag:
    # +rescue+ would miss a throw (Timeout.timeout on some Ruby versions).
    def scoped(held, raise_on_lost)
      done = false
      begin
        result = yield held
        done = true
      ensure
        unless done || held.released?
          begin
            held.release
          rescue Error
            nil
          end
        end
      end
      lost = held.lost_reason
      begin
        held.release
      rescue LockLostError
        raise if raise_on_lost
      end
      if lost && raise_on_lost
        raise LockLostError.new("#{Errors.describe_key(held.key)} token #{held.token}: lock lost " \
                                "(#{lost.to_s.tr('_', ' ')}) while the block ran", reason: lost, key: held.key, token: held.token)
      end
      result
    end

    # Session events (reader thread).
    def lock_expired(token, key, reason)
      lock = @locks_mutex.synchronize { @locks[token] }
      if lock.nil?
        @logger&.debug("ticketing: EXPIRED for #{Errors.describe_key(key)} token #{token}, not held here")
        return
      end
      lock.mark_lost(reason == Protocol::ExpiredReason::STOPPING ? :server_stopping : :expired)
    end

    def server_restarted
      locks = @locks_mutex.synchronize { @locks.values }
      locks.each { |l| l.mark_lost(:server_restarted) }
    end

    def forget_lock(lock)
      @locks_mutex.synchronize do
        deadline_remove_locked(lock)
        @locks.delete(lock.token) if @locks[lock.token].equal?(lock)
      end
    end

    # Runs on_lost callbacks on the client's callback thread, in order.
    def dispatch(callbacks, lock, reason)
      return if callbacks.empty?

      if @session.closed?
        # No callback thread after close: run these on a thread of their own.
        return Thread.new { callbacks.each { |cb| run_callback(cb, lock, reason) } }
      end

      queue = events_queue
      callbacks.each { |cb| queue.push([cb, lock, reason]) }
    end

    # The callback thread's queue, starting the thread when needed. Lock#on_lost calls it when a
    # callback is registered, so that no thread has to start on the way to a lost signal.
    def events_queue
      @events_mutex.synchronize do
        @events ||= Queue.new.tap do |q|
          Thread.new { run_events(q) }.name = "ticketing-callbacks"
        end
      end
    end

    def run_events(queue)
      loop do
        item = queue.pop
        return if item == :stop

        run_callback(*item)
      end
    end

    def run_callback(callback, lock, reason)
      callback.call(lock, reason)
    rescue StandardError => e
      @logger&.error("ticketing: on_lost callback failed: #{e.class}: #{e.message}")
    end
  end

  @fork_generation = 0
  @fork_mutex = Mutex.new

  class << self
    # @api private
    # Counts the forks this process descends from (0 in the original process).
    attr_reader :fork_generation

    # @api private
    # Guards the clients' after-fork reset (a new mutex in every child).
    attr_reader :fork_mutex

    # @api private
    # Called in a forked child, by ForkHook, before any other code runs there.
    def forked!
      @fork_mutex = Mutex.new
      @fork_generation += 1
    end
  end

  # @api private
  # Ruby 3.1's Process._fork hook: in the child, every client starts a new session on its next
  # call (Client#check_fork), and never uses the parent's socket.
  module ForkHook
    def _fork
      pid = super
      Ticketing.forked! if pid.zero?
      pid
    end
  end
  Process.singleton_class.prepend(ForkHook)
end
