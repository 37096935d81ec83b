# frozen_string_literal: true

require "securerandom"

module Ticketing
  # @api private
  # One request on its way: the fields of its frame, its request id once it is queued for the
  # wire, and its outcome. All fields are guarded by the session's mutex, except the constant
  # request fields.
  class Call
    EMPTY_KEY = "".b.freeze
    # A request frame's header (Protocol's layout) and its length field without the key.
    FRAME_FORMAT = "NCCnQ>Q>NN"
    FRAME_BASE = Protocol::Size::HEADER - 4
    private_constant :FRAME_FORMAT, :FRAME_BASE
    attr_reader :op, :key, :token, :lease_ms, :wait_ms
    # Request id (nil until queued for the wire), and the Clock time it was first queued for the
    # wire: an ACQUIRE's or EXTEND's answer sets the lock's deadline from it, whichever
    # transmission the answer is for (PROTOCOL.md, "The lost signal").
    attr_accessor :id, :t_first
    # answered: the outcome is decided (no abandoning any more); finished: the hook has run.
    attr_accessor :answered, :finished, :abandoned, :cleanup_done
    # withdrawn: CANCEL was queued for it (never twice); closed_out: Client#close withdrew it
    # (its waiter fails ClosedError at once); settled: the caller's own code path took over
    # (nothing left for an unwinding ensure to clean up).
    attr_accessor :withdrawn, :closed_out, :settled
    # The outcome: the response, or the error, and what the hook made of it (e.g. the Lock).
    attr_accessor :response, :error, :value
    # Runs outside the session's mutex once the outcome is decided: hook.call(response, error,
    # abandoned) -> value; or, when it is not a Proc (the Client, for an ACQUIRE), its private
    # #answered(call, response, error, abandoned) -> value.
    attr_accessor :hook
    # An ACQUIRE's options for the Lock its answer makes (the Client's hook reads them).
    attr_accessor :keep_alive, :max_hold

    # +key+: a binary String.
    def initialize(op, key = EMPTY_KEY, token = 0, lease_ms = 0, wait_ms = 0)
      @op = op
      @key = key
      @token = token
      @lease_ms = lease_ms
      @wait_ms = wait_ms
      # The other fields start unset (nil).
    end

    # The waiter's condition variable (on the session's mutex; made when first needed).
    def cond
      @cond ||= ConditionVariable.new
    end

    # Wakes the call's waiters, if any (the session's mutex held): those on #cond, and the
    # caller parked in #park.
    def wake
      @cond&.broadcast
      m = @park_mutex
      return unless m

      m.synchronize do
        @park_woken = true
        @park_cond.signal
      end
    end

    # Readies #park (the session's mutex held, before the caller leaves it to park): a wake
    # from here on is not lost.
    def park_prepare
      unless @park_mutex
        @park_mutex = Mutex.new
        @park_cond = ConditionVariable.new
      end
      @park_woken = false
    end

    # Sleeps until #wake (since #park_prepare) or +timeout+ seconds (nil: no limit), outside the
    # session's mutex: the woken caller takes only this call's own mutex back, which nobody
    # else holds for long, where waking on the session's mutex would find it held often.
    # It may return early; the caller looks at the call's state again.
    def park(timeout)
      m = @park_mutex
      m.synchronize do
        @park_cond.wait(m, timeout) unless @park_woken
        @park_woken = false
      end
    end

    def frame
      Protocol.encode_request_fields(@op, 0, @id, @token, @lease_ms, @wait_ms, @key)
    end

    # Appends the frame to +buf+ (Protocol.append_request_fields, inlined: one pack into the
    # buffer, then the key).
    def frame_into(buf)
      key = @key
      [FRAME_BASE + key.bytesize, @op, 0, key.bytesize, @id, @token, @lease_ms,
       @wait_ms].pack(FRAME_FORMAT, buffer: buf) << key
    end

    def op_name
      Protocol.name_of(Protocol::Op, @op)
    end
  end

  # @api private
  # The protocol session (PROTOCOL.md, "Sessions"): the session id, request ids in send order,
  # every request not yet answered, and the connection's life. It connects, follows NOT_LEADER /
  # GOAWAY, reconnects with backoff, resumes (re-sending unanswered requests with their ids, in id
  # order, before anything new), notices a restarted server (a new state id), sends ACK and the
  # heartbeat.
  #
  # Locking: @mutex guards every field and every Call's mutable fields. It is never held during
  # I/O, nor while calling the client back (hooks, lock notices). Lock order: @mutex, then a
  # Connection's write mutex (#enqueue), a Cancellation's mutex (#cancelled?) or a Call's park
  # mutex (Call#wake; a parked caller holds it without @mutex); nothing else is taken under
  # @mutex, and callers hold no Lock or Client mutex when they call in here.
  class Session
    # The client's options the session reads (see Client#initialize).
    Config = Struct.new(:endpoints, :token, :tls_context, :server_name, :connect_timeout, :request_timeout,
                        :heartbeat_interval, :reconnect_delay, :reconnect_delay_max, :logger, keyword_init: true)

    # The factor (1 - 2 rho) applied to leases for the local deadline.
    RATE_FACTOR = 1.0 - (2.0 * Protocol::ClientRule::CLOCK_RATE_BOUND_PPM / 1_000_000)
    # Redirects (CHALLENGE NOT_LEADER hints) followed within one round of endpoints.
    MAX_HINTS_PER_ROUND = 3
    # The heartbeat while any request waits for an answer (a queued ACQUIRE included): PING
    # after at most this much silence, in seconds (docs/clients.md, the heartbeat interval).
    BUSY_HEARTBEAT = 0.25
    # A PING unanswered for min(heartbeat, this) seconds gives the connection up: it is replaced
    # and the session resumed (a frozen leader is left about 1 s after it froze).
    MAX_PING_WAIT = 0.75
    # How long, in seconds, a node whose connection went silent (a PING unanswered: frozen, or
    # cut off) is left out of the connect rounds, as an endpoint and as a leader hint, when there
    # are other endpoints: it still accepts TCP and would cost the handshake wait, and the other
    # nodes keep naming it as the leader until they elect another (docs/clients.md, rule 1).
    SILENT_SKIP = 2.0
    # The background reader takes the read role back once no caller has taken it for this long,
    # in seconds (a push or a lost connection is noticed within about twice this while no call
    # waits). Between a caller's back-to-back calls the role stays free, so that the next call
    # reads its own answer without a hand-off to another thread.
    BG_IDLE = 0.01

    attr_reader :config

    # +events+ receives the session's notices: lock_expired(token, key, reason) and
    # server_restarted, called outside the mutex.
    def initialize(config, events, scheduler)
      @config = config
      @events = events
      @scheduler = scheduler
      init_state
    end

    # The 16-byte session id (binary String).
    def id
      @mutex.synchronize { @session_id }
    end

    def closed?
      @mutex.synchronize { @state == :closed }
    end

    def connected?
      @mutex.synchronize { @state == :ready }
    end

    # Connects now unless connected: one round over the endpoints (the leader hint first). Raises
    # the connect error (UnavailableError, AuthFailedError, TLSError, ...). Used for the first
    # connection; later drops are handled by the reconnector thread. A round in which a node
    # answered NOT_LEADER (a cluster electing a leader, as when the application and the cluster
    # start together) is retried after the shortest reconnect delay (with jitter) until it
    # connects or the request timeout has passed since this call began; it then raises the last
    # round's UnavailableError. Any other failed round raises at once. A +cancel+ (Cancellation)
    # that is cancelled raises CancelledError before the next round, and ends the wait between
    # rounds at once; a round under way finishes first (each dial is bounded by the connect
    # timeout).
    def connect(cancel: nil)
      give_up = Scheduler.now + @config.request_timeout
      handle = cancel&.subscribe { @mutex.synchronize { @state_cond.broadcast } }
      @dial_mutex.synchronize do
        loop do
          @mutex.synchronize do
            raise ClosedError, "the client is closed" if @state == :closed
            return if @state != :idle
          end
          raise CancelledError, "connect: cancelled" if cancel&.cancelled?

          begin
            return connect_round
          rescue UnavailableError => e
            raise unless @mutex.synchronize { @election }

            delay = @config.reconnect_delay
            delay = (delay / 2) + (rand * delay / 2)
            raise if Scheduler.now + delay >= give_up

            log(:debug, "no leader yet (#{e.message}); connecting again in #{format('%.3f', delay)} s")
            @mutex.synchronize { @state_cond.wait(@mutex, delay) if @state == :idle && !cancel&.cancelled? }
          end
        end
      end
    ensure
      cancel&.unsubscribe(handle)
    end

    # Queues +call+: with a request id on the wire at once when connected, else in the backlog
    # for the next connection (starting the reconnector). Never blocks on the network. An
    # asynchronous interrupt (Timeout, Thread#raise, Thread#kill) waits until the call is
    # queued whole: never an id in the table without its frame on the way.
    #
    # +awaits+: the caller calls #await for this call next (it may then keep the read role
    # from here); false for a call nobody waits for (its answer runs its hook). +lead+ (with
    # +awaits+, for a caller without a cancellation): when the call keeps the read role here,
    # its caller reads its answer at once, until +limit+ (monotonic seconds, nil: no bound; the
    # deadline it then passes to #await), within this method's interrupt mask: one mask per
    # request, not two. The caller looks at Call#finished before calling #await.
    def submit(call, awaits = false, lead = false, limit = nil)
      Thread.handle_interrupt(DEFER_INTERRUPTS) do
        got = :unread
        reading = nil
        probe = @mutex.synchronize do
          state = @state
          raise ClosedError, "the client is closed" if state == :closed

          # No thread reads the connection: take what the server sent meanwhile (an answer, a
          # push, the connection's end: a server that went away or restarted) before this call
          # goes out, as a reader thread would have, so that the call follows it.
          c = @conn
          unless state == :ready && c && c.reader.nil?
            queue_locked(call)
            next nil
          end
          if @pending.empty?
            # Nothing in flight: look at the socket here (a read that does not wait, so no
            # other thread is held up). Nothing there (nearly always): the call goes out now,
            # written by this thread, and keeps the read role for its answer (#await), with no
            # hand-over. Else the bytes are handled below, outside the mutex.
            got = c.peek
            if got == :wait_readable
              if awaits
                c.reader = call
                c.activity += 1
                reading = c if lead
              end
              # (Without +awaits+ the role stays free: with nothing in flight no caller waits
              # for it, so there is nobody to hand it to.)
              assign_locked(call, c, Clock.now, true)
              next nil
            end
          end
          c.reader = :probe
          c
        end
        if probe
          probe.read_pending(got)
          @mutex.synchronize do
            release_role_locked(probe, :probe)
            raise ClosedError, "the client is closed" if @state == :closed

            queue_locked(call)
          end
        elsif reading
          # Queued and written, with the read role kept for it: read its answer now. (Only
          # this thread gives the role up then, so no look under the mutex is needed.)
          lead_deferred(reading, call, limit, nil)
        end
      end
    end

    # #submit: gives +call+ its id and frame on the connection, or puts it in the backlog for
    # the next one. Nothing else in flight: this caller writes its frame itself (no hand-off
    # to the writer thread) and will read the answer itself. Otherwise the writer thread writes
    # the frames queued meanwhile in one batch (fewer, larger writes for the server). @mutex
    # must be held.
    def queue_locked(call)
      if @state == :ready
        assign_locked(call, @conn, Clock.now, @pending.empty?)
      else
        @backlog << call
        start_reconnector_locked if @state == :disconnected
      end
    end

    # The last reconnect error (nil when none), for messages.
    def last_error
      @mutex.synchronize { @last_error }
    end

    # Whether the session is connected or has connected before (a call may then wait for the
    # reconnector instead of dialing itself).
    def started?
      @state != :idle # one read of a field that leaves :idle once (no lock needed)
    end

    # Waits for +call+ to finish. Returns :finished, or :cancelled / :timeout when the wait ended
    # first (the call is then marked abandoned; its answer, if any, still runs its hook).
    # +deadline+ bounds the wait once the call is on the wire (nil: no bound), +send_deadline+
    # while it is still waiting for a connection.
    #
    # While the call is on the wire and no other thread reads the connection, the caller reads
    # it itself (leader/follower): it handles every frame that arrives, its own answer, other
    # calls' answers and pushes, and once its answer is in hands the read role to another
    # waiting caller (or, after BG_IDLE without one, back to the background reader). A waiter
    # that finds the background reader reading asks it to give the role up.
    def await(call, deadline:, send_deadline:, cancel: nil)
      if cancel.nil? && (c = @conn) && c.reader.equal?(call)
        # #submit kept the read role for this call (only this thread gives it up then, so the
        # look needs no lock): read at once. The loop below takes the other outcomes.
        lead(c, call, deadline, nil)
        return :finished if call.finished && !call.closed_out
      end
      handle = cancel&.subscribe { wake_call(call) }
      while true # rubocop:disable Style/InfiniteLoop -- Kernel#loop costs a block per call
        conn = nil
        limit = nil
        wait = nil
        @mutex.synchronize do
          if call.closed_out || call.finished
            @waiting.delete(call)
            drop_role_locked(call)
            return call.closed_out ? :closed : :finished
          end

          unless call.answered
            return abandon_waiter_locked(call, :cancelled) if cancel&.cancelled?

            limit = call.id ? deadline : send_deadline
            now = Scheduler.now
            return abandon_waiter_locked(call, :timeout) if limit && now >= limit

            c = @conn
            if call.id && c
              if c.reader.equal?(call)
                # #submit kept the read role for this call.
                conn = c
                next
              elsif c.reader.nil?
                c.reader = call
                c.activity += 1
                @waiting.delete(call)
                conn = c
                next
              elsif c.reader == :bg && !c.yield_asked
                c.yield_asked = true
                c.poke
              end
              @waiting[call] = true
            end
            wait = [limit - now, 0.001].max if limit
          end
          call.park_prepare
        end
        unless conn
          # Parked outside the session's mutex until woken (an answer, the read role free, a
          # cancellation, close) or the wait's bound; then looked at again.
          call.park(wait)
          next
        end
        lead(conn, call, limit, cancel)
        # Its own answer read and its hook run on this thread: done without another look.
        return :finished if call.finished && !call.closed_out
      end
    ensure
      cancel&.unsubscribe(handle)
      if @waiting.key?(call)
        @mutex.synchronize do
          @waiting.delete(call)
          handoff_locked(@conn) if @conn && @conn.reader.nil?
        end
      end
    end

    # The background reader (+conn+'s thread): waits until the read role is free and no caller
    # has taken it for BG_IDLE (at once when +first+: a new connection), then takes it. Returns
    # false once +conn+ is no longer the session's connection.
    def bg_take_role(conn, first)
      @mutex.synchronize do
        seen = first ? conn.activity : -1
        loop do
          return false unless conn.equal?(@conn)

          if conn.reader.nil? && conn.activity == seen
            conn.reader = :bg
            conn.yield_asked = false
            return true
          end
          seen = conn.activity
          conn.bg_cond.wait(@mutex, BG_IDLE)
        end
      end
    end

    # The background reader, after each read: whether it keeps the read role. It gives it up
    # when a caller asked for it, and hands it to a waiting caller.
    def bg_keep_role?(conn)
      @mutex.synchronize do
        return false unless conn.equal?(@conn)
        return true unless conn.yield_asked

        conn.yield_asked = false
        conn.reader = nil if conn.reader == :bg
        handoff_locked(conn)
        false
      end
    end

    # Reads +conn+ as the holder of its read role until +call+ is answered, +limit+ passes, the
    # call is cancelled or the connection fails; then gives the role up and hands it on
    # (#release_role_locked). Frames are handled with asynchronous interrupts deferred: one
    # lands only while waiting for bytes.
    def lead(conn, call, limit, cancel)
      Thread.handle_interrupt(DEFER_INTERRUPTS) { lead_deferred(conn, call, limit, cancel) }
    end

    # #lead, for a thread that runs with asynchronous interrupts deferred already (#submit).
    def lead_deferred(conn, call, limit, cancel)
      while true # rubocop:disable Style/InfiniteLoop -- Kernel#loop costs a block per call
        break if call.answered || call.closed_out || cancel&.cancelled?
        break unless conn.read_some(limit) == true
      end
    ensure
      @mutex.synchronize { release_role_locked(conn, call) }
    end

    # Gives up the read role +holder+ holds on +conn+ and hands it on. @mutex must be held.
    def release_role_locked(conn, holder)
      return unless conn.reader.equal?(holder)

      conn.reader = nil
      handoff_locked(conn)
    end

    # The read role of +conn+ is free: wakes a caller still waiting for its answer, which takes
    # it (with none, the background reader takes it after BG_IDLE). @mutex must be held.
    def handoff_locked(conn)
      return if @waiting.empty? || !conn.equal?(@conn)

      @waiting.each_key do |c|
        next if c.answered

        c.wake
        return
      end
    end

    # Wakes +call+'s waiter (its cancellation): from its condition variable, or from its read.
    def wake_call(call)
      @mutex.synchronize do
        call.wake
        @conn.poke if @conn&.reader.equal?(call)
      end
    end

    # Marks +call+ abandoned unless its outcome is already decided (for a caller unwound by an
    # exception, a throw or Thread#kill). Returns true when it was not answered: the caller then
    # withdraws it (#withdraw); false when its outcome is decided (see #await_finished).
    def abandon(call)
      @mutex.synchronize do
        drop_role_locked(call)
        call.answered ? false : (abandon_locked(call, :interrupted) && true)
      end
    end

    # Waits until +call+'s hook has run (its outcome is decided: the reader thread is running
    # it) or +deadline+ passes. Returns whether it finished.
    def await_finished(call, deadline)
      @mutex.synchronize do
        until call.finished
          remaining = deadline - Scheduler.now
          return false if remaining <= 0

          call.cond.wait(@mutex, remaining)
        end
        true
      end
    end

    # Withdraws an abandoned ACQUIRE that reached the wire: CANCEL it, on this connection or
    # the session's next one, once (later calls do nothing). The ACQUIRE's hook releases a grant
    # that still arrives. Nothing to do for a call never sent, or after close.
    def withdraw(call)
      @mutex.synchronize do
        return if call.id.nil? || call.withdrawn || call.finished || @state == :closed

        call.withdrawn = true
        cancel = Call.new(Protocol::Op::CANCEL, Call::EMPTY_KEY, call.id)
        if @state == :ready
          assign_locked(cancel, @conn)
        else
          @backlog << cancel
          start_reconnector_locked if @state == :disconnected
        end
      end
    end

    # Client#close, first step: withdraws every ACQUIRE still queued on the server (CANCEL; its
    # waiter fails ClosedError at once, and the hook releases a grant that races the CANCEL).
    # ACQUIREs not sent yet fail ClosedError here. Returns the withdrawn calls, for
    # #await_cleanups. Without a connection nothing can be withdrawn: the server drops the waits
    # once the session grace has passed.
    def withdraw_acquires
      unsent = []
      withdrawn = []
      @mutex.synchronize do
        return [] if @state == :closed

        unsent = @backlog.select { |c| c.op == Protocol::Op::ACQUIRE && !c.answered }
        unsent.each do |c|
          @backlog.delete(c)
          c.answered = true
        end
        if @state == :ready
          @pending.each_value do |c|
            next unless c.op == Protocol::Op::ACQUIRE && !c.answered && !c.abandoned

            c.abandoned = true
            c.closed_out = true
            c.withdrawn = true
            withdrawn << c
          end
          withdrawn.each do |c|
            assign_locked(Call.new(Protocol::Op::CANCEL, Call::EMPTY_KEY, c.id), @conn)
            c.wake
          end
          # A withdrawn call's caller that is reading the connection returns at once too.
          @conn.poke if withdrawn.any? { |c| @conn.reader.equal?(c) }
        end
      end
      deliver_all(unsent, ClosedError, "failed: the client was closed before the acquire was sent")
      withdrawn
    end

    # Waits until every call of +calls+ is cleaned up (see Client), +deadline+ passes, or the
    # connection is lost (the withdrawal cannot finish then).
    def await_cleanups(calls, deadline)
      calls.each do |call|
        @mutex.synchronize do
          until call.cleanup_done
            remaining = deadline - Scheduler.now
            return false if remaining <= 0 || @state != :ready

            call.cond.wait(@mutex, [remaining, 0.05].min)
          end
        end
      end
      true
    end

    # Forgets an abandoned call that is not an ACQUIRE: its answer, if it comes, is ignored and
    # ACK may pass its id.
    def forget(call)
      @mutex.synchronize do
        drop_role_locked(call)
        @pending.delete(call.id) if call.id && @pending[call.id].equal?(call)
      end
    end

    # Waits until +call+'s clean-up is done (see Client) or +deadline+ passes.
    def await_cleanup(call, deadline)
      @mutex.synchronize do
        until call.cleanup_done
          remaining = deadline - Scheduler.now
          return false if remaining <= 0

          call.cond.wait(@mutex, remaining)
        end
        true
      end
    end

    # Marks +call+'s clean-up done and wakes its waiter.
    def cleanup_done(call)
      @mutex.synchronize do
        call.cleanup_done = true
        call.wake
      end
    end

    # A lock was granted (the client holds it now): while any is held, a dropped connection is
    # re-established at once (for keep-alive, EXPIRED notices and releases). A drop that came
    # before the client counted the lock started no reconnector for it: start it now. (A drop
    # after that sees the lock: Client#holding_locks?.) The state is read without the mutex
    # first: it is :ready nearly always.
    def lock_granted
      return unless @state == :disconnected

      @mutex.synchronize { start_reconnector_locked if @state == :disconnected }
    end

    # Closes the session: fails every call with ClosedError and closes the connection. Idempotent.
    def close
      conn, calls, dialing = @mutex.synchronize do
        return if @state == :closed

        @state = :closed
        calls = @pending.values + @backlog
        @pending.clear
        @backlog.clear
        calls.each { |c| c.answered = true }
        @state_cond.broadcast
        c = @conn
        @conn = nil
        c&.bg_cond&.broadcast
        [c, calls, @dialing_socket]
      end
      Connection.close_quietly(dialing)
      conn&.close
      deliver_all(calls, ClosedError, "failed: the client was closed")
      @reconnector&.join(1) unless @reconnector == Thread.current
    end

    # In a forked child: a new session id, no connection, no calls (they belong to the parent's
    # threads, which do not exist here). The parent's socket is left untouched.
    def reset_after_fork
      conn = @conn
      closed = @state == :closed
      init_state
      @state = :closed if closed
      conn&.abandon
    end

    # Called by the connection's reader for every frame.
    def handle_frame(conn, resp)
      id = resp.id
      return handle_push(conn, resp) if id.zero?

      # The usual answer (its request's op, not NOT_LEADER or SHUTTING_DOWN) in one look;
      # anything else goes the long way (#handle_other_frame), which looks again.
      call = @mutex.synchronize do
        return unless conn.equal?(@conn)

        c = @pending[id]
        return unless c

        status = resp.status
        next nil if resp.op != c.op || status == Protocol::Status::NOT_LEADER ||
                    status == Protocol::Status::SHUTTING_DOWN

        @pending.delete(id)
        c.answered = true
        # An answered call no longer waits for the read role: out of the list that
        # #handoff_locked walks (it would only pass it by).
        @waiting.delete(c) unless @waiting.empty?
        @answers += 1
        maybe_ack_locked if @answers >= Protocol::ClientRule::ACK_EVERY
        unless c.hook
          # No hook to run outside the lock: the outcome is set here (as #deliver would).
          c.response = resp
          c.finished = true
          c.cleanup_done = true
          c.wake
          return
        end
        c
      end
      return handle_other_frame(conn, resp) unless call

      # Answered (under the lock above), so no longer abandoned by anyone: read it here.
      deliver(call, resp, nil, call.abandoned)
    end

    def handle_other_frame(conn, resp)
      call = nil
      mismatch = false
      redirect = false
      advance = false
      abandoned = false
      @mutex.synchronize do
        return unless conn.equal?(@conn)

        call = @pending[resp.id]
        return unless call

        if resp.op != call.op
          mismatch = true
        elsif resp.status == Protocol::Status::NOT_LEADER
          # Not run: keep it pending; it is re-sent with its id on the leader's connection.
          @hint = parse_hint(resp.data)
          redirect = true
        else
          @pending.delete(resp.id)
          call.answered = true
          abandoned = call.abandoned
          advance = resp.status == Protocol::Status::SHUTTING_DOWN && @config.endpoints.size > 1
          @answers += 1
          maybe_ack_locked
        end
      end
      if mismatch
        # The answer does not fit its request: this connection cannot be trusted. The request
        # stays pending and is re-sent on the next connection.
        connection_failed(conn, ProtocolError.new("#{conn}: answer op #{resp.op} to request #{resp.id} " \
                                                  "(#{call.op_name})"))
        return
      end
      if redirect
        log(:info, "#{conn}: NOT_LEADER (leader: #{@hint || 'unknown'}); moving")
        connection_failed(conn, nil, reconnect: true)
        return
      end
      connection_failed(conn, nil, advance: true) if advance
      deliver(call, resp, nil, abandoned)
    end

    # Called once the connection failed (by its threads, the heartbeat, a redirect): forget it
    # and reconnect when something needs the connection. +error+ nil: a planned move.
    # +advance+ (SHUTTING_DOWN, GOAWAY without a hint, a silent node found by the heartbeat):
    # the next round starts at the next endpoint, so the node just left is tried last. +silent+
    # (the heartbeat's verdict): that node is also neither dialled nor followed as a hint for
    # SILENT_SKIP. The calls in flight stay pending: they are re-sent when the session resumes.
    def connection_failed(conn, error, advance: false, reconnect: false, silent: false)
      @mutex.synchronize do
        return unless conn.equal?(@conn)

        @conn = nil
        conn.bg_cond.broadcast
        @state = :disconnected
        @dropped_at = Scheduler.now
        n = @config.endpoints.size
        @next_index = advance ? (conn.index + 1) % n : conn.index if conn.index
        if silent
          @silent = conn.endpoint
          @silent_till = @dropped_at + SILENT_SKIP
        end
        drop_ping_locked(conn)
        start_reconnector_locked if reconnect || demand_locked?
      end
      log(:warn, "connection lost: #{error.message}") if error
      conn.close
    end

    private

    # One connect round for #connect (again at once with a new session id should the server's
    # state id change).
    def connect_round
      3.times do
        conn = dial_round
        return if install(conn) != :redial
      end
      raise ConnectionLostError, "the server's state id kept changing while connecting"
    end

    def init_state
      @mutex = Mutex.new
      @dial_mutex = Mutex.new
      @state_cond = ConditionVariable.new
      @session_id = new_session_id
      @next_id = 1
      @pending = {}    # request id => Call, in id order
      # Calls on the wire whose callers wait in #await without the read role (insertion order).
      @waiting = {}.compare_by_identity
      @backlog = []    # Calls waiting for a connection (no id yet)
      @conn = nil
      @state = :idle   # :idle, :ready, :disconnected, :closed
      @state_id = nil
      @grace = 0.0
      @dropped_at = nil
      @answers = 0
      @ack_call = nil
      @hint = nil
      @next_index = 0
      @silent = nil      # the node the heartbeat last found silent...
      @silent_till = 0.0 # ...neither dialled nor followed as a hint until then (monotonic)
      @reconnector = nil
      @dialing_socket = nil
      @last_error = nil
      @election = false # a node answered NOT_LEADER in the last failed round
    end

    def new_session_id
      loop do
        id = SecureRandom.random_bytes(Protocol::Size::SESSION_ID)
        return id unless id.bytes.all?(&:zero?)
      end
    end

    def log(level, message)
      @config.logger&.public_send(level, "ticketing: #{message}")
    end

    # Gives +call+ the next request id and queues its frame (+now+: Clock.now). @mutex must be
    # held. With +direct+ this thread writes the frame now, unless another is writing
    # (Connection#send_call: a write that does not wait, so holding @mutex across it holds
    # nobody up); otherwise the writer thread writes it, with whatever else is queued.
    def assign_locked(call, conn, now = Clock.now, direct = false)
      id = @next_id
      @next_id = id + 1
      call.id = id
      call.t_first = now
      @pending[id] = call
      if direct
        conn.send_call(call)
      else
        conn.enqueue_call(call)
      end
    end

    # The heartbeat PING of a connection given up is not re-sent on the next one.
    def drop_ping_locked(conn)
      ping = conn.ping_call
      return unless ping

      conn.ping_call = nil
      conn.ping_sent_at = nil
      @pending.delete(ping.id) if @pending[ping.id].equal?(ping)
      ping.answered = true
      ping.finished = true
    end

    # #abandon_locked for a waiter leaving #await: it no longer takes the read role.
    def abandon_waiter_locked(call, reason)
      if @waiting.delete(call) && @conn && @conn.reader.nil?
        handoff_locked(@conn)
      end
      drop_role_locked(call)
      abandon_locked(call, reason)
    end

    # Gives up the read role if +call+ holds it without reading (#submit kept it for the call,
    # whose caller left before #lead). @mutex must be held.
    def drop_role_locked(call)
      c = @conn
      release_role_locked(c, call) if c && c.reader.equal?(call)
    end

    def abandon_locked(call, reason)
      call.abandoned = true
      if call.id.nil?
        # Never sent: nothing to withdraw.
        @backlog.delete(call)
        call.answered = true
        call.finished = true
        call.cleanup_done = true
      end
      reason
    end

    def demand_locked?
      !@pending.empty? || !@backlog.empty? || @events.__send__(:holding_locks?)
    end

    def parse_hint(data)
      text = data.to_s.dup.force_encoding(Encoding::UTF_8)
      return nil if text.empty? || !text.valid_encoding?

      Endpoint.parse(text)
    rescue InvalidArgumentError
      nil
    end

    # Sends ACK when ACK_EVERY answers came since the last one and none is outstanding.
    # @mutex must be held.
    def maybe_ack_locked
      return if @answers < Protocol::ClientRule::ACK_EVERY || @ack_call || @state != :ready

      lowest = @pending.each_value.find { |c| c.op != Protocol::Op::ACQUIRE }&.id || @next_id
      ack = Call.new(Protocol::Op::ACK, Call::EMPTY_KEY, lowest)
      ack.hook = lambda do |_resp, _err, _abandoned|
        @mutex.synchronize { @ack_call = nil if @ack_call.equal?(ack) }
        nil
      end
      @ack_call = ack
      @answers = 0
      assign_locked(ack, @conn)
    end

    def handle_push(conn, resp)
      case resp.op
      when Protocol::Op::EXPIRED
        return unless @mutex.synchronize { conn.equal?(@conn) }

        @events.__send__(:lock_expired, resp.token, resp.data, resp.detail)
      when Protocol::Op::GOAWAY
        hint = parse_hint(resp.data)
        @mutex.synchronize { @hint = hint if hint }
        log(:info, "#{conn}: GOAWAY (reason #{resp.detail}, leader: #{hint || 'unknown'}); reconnecting")
        connection_failed(conn, nil, advance: hint.nil?, reconnect: true)
      when 0
        log(:warn, "#{conn}: the server rejected a frame: #{resp.data.dup.force_encoding(Encoding::UTF_8).scrub}")
      else
        log(:debug, "#{conn}: ignoring push op #{resp.op}")
      end
    end

    def deliver(call, resp, error, abandoned)
      value = nil
      begin
        hook = call.hook
        if hook
          value = hook.is_a?(Proc) ? hook.call(resp, error, abandoned) : hook.__send__(:answered, call, resp, error, abandoned)
        end
      rescue StandardError => e
        log(:error, "internal callback failed: #{e.class}: #{e.message}")
      end
      @mutex.synchronize do
        call.response = resp
        call.error = error
        call.value = value
        call.finished = true
        # An abandoned ACQUIRE granted after all is cleaned up once its release is answered.
        granted = resp && resp.status == Protocol::Status::OK
        call.cleanup_done = true unless call.abandoned && call.op == Protocol::Op::ACQUIRE && granted
        call.wake
      end
    end

    # Fails +calls+ (already removed from @pending/@backlog and marked answered), each with its
    # own exception of +klass+.
    def deliver_all(calls, klass, message)
      calls.each do |call|
        what = call.key.empty? ? call.op_name : "#{call.op_name} #{Errors.describe_key(call.key)}"
        deliver(call, nil, klass.new("#{what} #{message}"), call.abandoned)
      end
    end

    # Tries the leader hint, then every endpoint once from @next_index, leaving out a node found
    # silent less than SILENT_SKIP ago (unless it is the only endpoint). Returns a Connection.
    def dial_round
      endpoints = @config.endpoints
      hint, start, skip = @mutex.synchronize do
        skip = @silent if endpoints.size > 1 && Scheduler.now < @silent_till
        [@hint, @next_index, skip]
      end
      hint = nil if hint && hint == skip
      targets = []
      targets << [hint, endpoints.index(hint)] if hint
      endpoints.size.times do |i|
        j = (start + i) % endpoints.size
        targets << [endpoints[j], j] unless endpoints[j] == hint || endpoints[j] == skip
      end
      errors = []
      hints = 0
      until targets.empty?
        endpoint, index = targets.shift
        begin
          conn = open_connection(endpoint, index)
          @mutex.synchronize do
            @hint = nil
            @next_index = index if index
          end
          return conn
        rescue Connection::Redirect => e
          errors << e
          leader = parse_hint(e.hint)
          if leader && leader != skip && hints < MAX_HINTS_PER_ROUND
            hints += 1
            targets.unshift([leader, endpoints.index(leader)])
          end
        rescue AuthFailedError, UnsupportedVersionError, ClosedError
          raise
        rescue Error => e
          errors << e
        end
      end
      @mutex.synchronize { @election = errors.any?(Connection::Redirect) }
      raise combine_errors(errors)
    end

    def open_connection(endpoint, index)
      session_id = @mutex.synchronize do
        raise ClosedError, "the client is closed" if @state == :closed

        @session_id
      end
      Connection.open(endpoint, index: index, session_id: session_id, token: @config.token,
                                tls_context: @config.tls_context, server_name: @config.server_name,
                                deadline: Scheduler.now + @config.connect_timeout, timeout: @config.connect_timeout,
                                on_socket: ->(sock) { track_dial(sock) })
    ensure
      track_dial(nil)
    end

    def track_dial(sock)
      closed = @mutex.synchronize do
        @dialing_socket = sock
        @state == :closed
      end
      Connection.close_quietly(sock) if closed && sock
    end

    def combine_errors(errors)
      errors = errors.map { |e| e.is_a?(Connection::Redirect) ? UnavailableError.new(e.message) : e }
      return errors.first if errors.size == 1

      klass = errors.map(&:class).uniq.size == 1 ? errors.first.class : UnavailableError
      klass.new(errors.map(&:message).join("; "))
    end

    # Makes +conn+ the session's connection: checks the state id and the resumed flag, re-sends
    # unanswered requests, then the backlog, and starts the connection's threads. Returns :ok,
    # :redial (the server restarted: start over with a new session id) or :closed.
    def install(conn)
      welcome = conn.welcome
      failed = []
      failure = nil
      restarted = false
      @mutex.synchronize do
        if @state == :closed
          conn.close
          return :closed
        end
        if @state_id && welcome.state_id != @state_id
          restarted = true
          failed = @pending.values
          failed.each { |c| c.answered = true }
          @pending.clear
          @session_id = new_session_id
          @next_id = 1
          @state_id = nil
          @ack_call = nil
          @answers = 0
        else
          @state_id ||= welcome.state_id
          unless welcome.resumed? || @pending.empty?
            failed = @pending.values
            @pending.clear
            @ack_call = nil
            failure = "failed: the connection was lost and the session could not be resumed " \
                      "(its outcome is unknown)"
          end
          failed.each { |c| c.answered = true }
          @grace = welcome.session_grace_ms / 1000.0
          @conn = conn
          @state = :ready
          @dropped_at = nil
          @last_error = nil
          @pending.each_value { |c| conn.enqueue(c.frame) }
          now = Clock.now
          @backlog.each { |c| assign_locked(c, conn, now) }
          @backlog.clear
          conn.start(self)
          @state_cond.broadcast
        end
      end
      if restarted
        conn.close
        log(:warn, "#{conn}: the server's state id changed (it restarted): every lock is lost")
        deliver_all(failed, ServerRestartedError, "failed: the server restarted (its state id changed)")
        @events.__send__(:server_restarted)
        return :redial
      end
      deliver_all(failed, ConnectionLostError, failure) if failure
      schedule_heartbeat(conn)
      :ok
    end

    def start_reconnector_locked
      return if @reconnector || @state != :disconnected

      @reconnector = Thread.new { reconnect_loop }
      @reconnector.name = "ticketing-reconnect" if @reconnector.respond_to?(:name=)
    end

    # Reconnects with backoff while something needs the connection: unanswered calls (until the
    # session grace has passed), calls waiting for a connection (until their own timeouts), or
    # held locks (until their deadlines). Bounded by that demand.
    def reconnect_loop
      attempt = 0
      redials = 0
      loop do
        if attempt.positive?
          delay = [@config.reconnect_delay * (2**[attempt - 1, 16].min), @config.reconnect_delay_max].min
          delay = (delay / 2) + (rand * delay / 2)
          @mutex.synchronize { @state_cond.wait(@mutex, delay) if @state == :disconnected }
        end
        expired = @mutex.synchronize do
          return reconnector_done_locked unless @state == :disconnected

          expire_grace_locked
        end
        deliver_all(expired, ConnectionLostError, "failed: the connection was lost and the session grace passed")
        @mutex.synchronize do
          # The first attempt always runs (a planned move, a restart); later ones while needed.
          return reconnector_done_locked unless @state == :disconnected && (attempt.zero? || demand_locked?)
        end
        begin
          if install(dial_round) == :redial && (redials += 1) <= 3
            attempt = 0
            next
          end
          return @mutex.synchronize { reconnector_done_locked }
        rescue ClosedError
          return @mutex.synchronize { reconnector_done_locked }
        rescue AuthFailedError, UnsupportedVersionError => e
          fail_everything(e)
          return @mutex.synchronize { reconnector_done_locked }
        rescue Error => e
          election = @mutex.synchronize do
            @last_error = e
            @election
          end
          log(:warn, "reconnect failed: #{e.message}")
          # A node answered NOT_LEADER: the cluster is electing a leader, which takes well under
          # a second, so the next round comes after the shortest pause, not a grown backoff.
          attempt = election ? 1 : attempt + 1
        end
      end
    rescue StandardError => e
      log(:error, "reconnector failed: #{e.class}: #{e.message}")
      @mutex.synchronize { reconnector_done_locked }
    end

    def reconnector_done_locked
      @reconnector = nil if @reconnector == Thread.current
      nil
    end

    # Takes the unanswered calls once the grace has passed since the drop.
    def expire_grace_locked
      return [] if @dropped_at.nil? || Scheduler.now - @dropped_at < @grace || @pending.empty?

      calls = @pending.values
      @pending.clear
      @ack_call = nil
      calls.each { |c| c.answered = true }
      calls
    end

    def fail_everything(error)
      calls = @mutex.synchronize do
        list = @pending.values + @backlog
        @pending.clear
        @backlog.clear
        @ack_call = nil
        list.each { |c| c.answered = true }
        list
      end
      log(:error, "reconnect refused: #{error.message}")
      deliver_all(calls, error.class, "failed: #{error.message}")
    end

    # The heartbeat (docs/clients.md): after heartbeat_interval without receiving anything
    # (BUSY_HEARTBEAT at most while a request waits for its answer), PING; a PING unanswered
    # within min(heartbeat_interval, MAX_PING_WAIT) gives the connection up as silent (a frozen
    # node, a cut network): it is replaced like a dropped one, the session resumes on the next
    # connection and the calls in flight keep waiting; for SILENT_SKIP the node just left is
    # neither dialled nor followed as a hint (unless it is the only endpoint), then tried last.
    def schedule_heartbeat(conn, delay = nil)
      interval = @config.heartbeat_interval
      return if interval.nil? || interval.zero?

      delay ||= [interval, BUSY_HEARTBEAT].min
      @scheduler.after([delay, 0.005].max) { heartbeat_tick(conn) }
    end

    def heartbeat_tick(conn)
      interval = @config.heartbeat_interval
      wait = [interval, MAX_PING_WAIT].min
      silent = false
      next_check = @mutex.synchronize do
        return unless conn.equal?(@conn)

        now = Scheduler.now
        if conn.ping_sent_at
          waited = now - conn.ping_sent_at
          silent = waited >= wait
          wait - waited
        else
          limit = @pending.empty? ? interval : [interval, BUSY_HEARTBEAT].min
          idle = now - conn.last_recv
          if idle < limit
            [limit - idle, BUSY_HEARTBEAT].min
          else
            ping = Call.new(Protocol::Op::PING)
            ping.hook = lambda do |_resp, _err, _abandoned|
              @mutex.synchronize do
                if conn.ping_call.equal?(ping)
                  conn.ping_sent_at = nil
                  conn.ping_call = nil
                end
              end
              nil
            end
            conn.ping_sent_at = now
            conn.ping_call = ping
            assign_locked(ping, conn)
            wait
          end
        end
      end
      if silent
        ms = (wait * 1000).round
        connection_failed(conn, TimeoutError.new("#{conn}: heartbeat: no answer to a PING within #{ms} ms; " \
                                                 "replacing the connection"), advance: true, silent: true)
      else
        schedule_heartbeat(conn, next_check)
      end
    end
  end
end
