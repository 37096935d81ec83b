# frozen_string_literal: true

module Ticketing
  # A held lock: its key, its fencing token, and a lease that runs out at #deadline unless it is
  # extended. Pass #token to the resource you protect, and have the resource reject any token
  # lower than the highest it has seen (fencing).
  #
  # The lock is *lost* at the first of: its local deadline (the lease measured from when the
  # request was first sent, slightly shortened for clock-rate error; never later than the
  # server's), the server's +EXPIRED+ notice, a +NOT_HELD+ answer to an extend or release, or a
  # reconnect that finds the server restarted. Then #lost? is true, #lost_reason says why, and
  # the callbacks given to #on_lost run. A lock is never reported lost after a successful
  # #release.
  #
  # The owner is the token, not the thread: any thread may release or extend. Methods are safe
  # for concurrent use.
  class Lock
    # The key (a frozen binary String).
    attr_reader :key
    # The fencing token (Integer): larger than every token granted before it, on any key.
    attr_reader :token
    # @api private
    # The lock's place in its client's heap of lost deadlines (nil: not there) and the time it
    # is kept under there (guarded by the client's locks mutex; see Client#deadline_add_locked).
    attr_accessor :heap_index, :heap_at

    # @api private
    def initialize(client, key, token, lease_ms, deadline)
      @client = client
      @key = key
      @token = token
      @mutex = Mutex.new
      @lease_ms = lease_ms
      @deadline = deadline
      @fire_at = Lock.fire_at(deadline, lease_ms)
      @extend_id = 0 # the request id of the EXTEND whose answer set @deadline (0: the grant's)
      @released = false
      @keep_alive = false
      # Unset (nil) until needed: @callbacks (the first #on_lost), @cond (the first
      # #wait_lost), @lost_reason, @release_error, @heap_index, @heap_at, @keep_alive_until,
      # @keep_alive_task, @detached (true after fork).
    end

    # The lease last granted (by the acquire or the last successful extend), in seconds.
    def lease
      @mutex.synchronize { @lease_ms / 1000.0 }
    end

    # The local deadline, in seconds of Ticketing::Clock (+CLOCK_BOOTTIME+ on Linux: it counts
    # the time the host is suspended, as the server's lease does): no later than the server's.
    def deadline
      @mutex.synchronize { @deadline }
    end

    # Seconds left until the local deadline (0.0 once passed).
    def remaining
      [deadline - Clock.now, 0.0].max
    end

    # Whether the lock is lost (see Lock). Checks the local deadline too, so it is exact even
    # when the client is closed.
    def lost?
      check_deadline
      @mutex.synchronize { !@lost_reason.nil? }
    end

    # Why the lock was lost: +:expired+ (the lease ran out: local deadline or the server's
    # notice), +:not_held+ (the server answered +NOT_HELD+ to an extend or release: someone
    # released it by token, or it expired), +:server_restarted+ (the server restarted and forgot
    # it), +:server_stopping+ (the server is stopping). nil while not lost.
    def lost_reason
      check_deadline
      @mutex.synchronize { @lost_reason }
    end

    # Whether #release succeeded (or the lock was released after being lost).
    def released?
      @mutex.synchronize { @released }
    end

    # Whether the lock is held as far as this client knows: not released, not lost.
    def held?
      !lost? && !released?
    end

    # Whether keep-alive is extending the lease in the background.
    def keep_alive?
      @mutex.synchronize { @keep_alive }
    end

    # Registers a callback run once when the lock is lost, with the lock and the reason:
    #
    #   lock.on_lost { |lock, reason| logger.warn("lost #{lock.token}: #{reason}") }
    #
    # Callbacks run on one background thread of the client, in order (at once if the lock is
    # already lost); a callback may call blocking client methods. Never called after a
    # successful #release. Returns self.
    def on_lost(&block)
      raise ArgumentError, "on_lost needs a block" unless block

      @client.__send__(:events_queue) unless @detached || @client.closed?
      reason = @mutex.synchronize do
        (@callbacks ||= []) << block if @lost_reason.nil?
        @lost_reason
      end
      @client.__send__(:dispatch, [block], self, reason) if reason
      self
    end

    # Blocks until the lock is lost or +timeout+ seconds pass (nil: without limit). Returns true
    # when lost. Returns false at once after a successful release.
    def wait_lost(timeout = nil)
      limit = timeout && Scheduler.now + Args.duration(timeout, :timeout)
      loop do
        check_deadline
        @mutex.synchronize do
          return true if @lost_reason
          return false if @released

          now = Scheduler.now
          return false if limit && now >= limit

          # The wait runs on the monotonic clock, which stops while the host is suspended: look
          # at Clock again at least every LOST_CHECK_MS (also when the client is closed).
          wait = @detached ? nil : [fire_at - Clock.now, Scheduler::CHECK_EVERY].min
          wait = [wait || Float::INFINITY, limit - now].min if limit
          (@cond ||= ConditionVariable.new).wait(@mutex, wait && [wait, 0.001].max)
        end
      end
    end

    # Releases the lock; the next waiter is granted it at once. Keep-alive stops first (no
    # extend is sent after this call starts). Returns true.
    #
    # Safe to call more than once: after a success, later calls return true without a round
    # trip. If the lock was lost before (#lost?), it raises LockLostError at once, naming the
    # reason, without waiting for the server (which may be unreachable): the work done under
    # the lock may not have been protected. It still tells the server, in the background (the
    # server may not have reclaimed the lock yet, so the next waiter need not wait for the
    # lease), unless the lock was lost to a restarted server or a +NOT_HELD+ answer: nothing is
    # left to release then. A +NOT_HELD+ answer marks the lock lost (+:not_held+) and raises
    # LockLostError. Transport errors (TimeoutError, ...) leave the lock as it was; call
    # #release again.
    def release
      # Keep-alive stops, and the lock's state is read, in one look (the common case: held and
      # not due, then one round trip and one more look).
      due = false
      reason = @mutex.synchronize do
        @keep_alive = false
        @keep_alive_task&.cancel
        return true if @released && @release_error.nil?
        raise @release_error if @released

        due = @lost_reason.nil? && !@detached && Clock.now >= @fire_at
        @lost_reason
      end
      if due
        mark_lost(:expired)
        reason = lost_reason
      end
      if reason
        @client.__send__(:release_in_background, @key, @token) unless %i[server_restarted not_held].include?(reason)
        return finish_release(reason)
      end

      begin
        @client.__send__(:release_token, @key, @token, self)
      rescue NotHeldError
        mark_lost(:not_held)
        return finish_release(lost_reason || :not_held)
      end
      released = @mutex.synchronize do
        # Still held and not due: released (else the slower path below marks it lost first).
        if @lost_reason.nil? && (@detached || Clock.now < @fire_at)
          @released = true
          @release_error = nil
          @cond&.broadcast
          true
        end
      end
      return finish_release(lost_reason) unless released

      @client.__send__(:forget_lock, self)
      true
    end

    # Sets the lease to +lease+ seconds from now (it may shorten it; default: the lease last
    # granted) and moves the deadline. Keep-alive then asks for this lease too. Returns the
    # lease granted, in seconds.
    #
    # Raises LockLostError if the lock is lost (or the server answers +NOT_HELD+, which marks it
    # lost), NotHeldError after #release. Transport errors leave the lock as it was: it is lost
    # at its deadline unless a later extend succeeds.
    #
    # (Given modules and no lease, this is Object#extend.)
    def extend(*modules, lease: nil)
      return super(*modules) if !modules.empty? && lease.nil? && modules.all?(Module)
      raise ArgumentError, "Lock#extend takes lease: (seconds)" unless modules.empty?

      ms = lease.nil? ? @mutex.synchronize { @lease_ms } : Args.lease_ms(lease)
      check_deadline
      @mutex.synchronize do
        raise lost_error if @lost_reason
        raise NotHeldError.new("#{describe}: released", key: @key, token: @token) if @released
      end
      begin
        resp, t_first = @client.__send__(:extend_token, @key, @token, ms)
      rescue NotHeldError
        mark_lost(:not_held)
        raise lost_error
      end
      raise lost_error unless extended(resp, t_first)

      resp.lease_ms / 1000.0
    end

    # Asks the server whether this lock still holds its key (+INSPECT+ with the token). Returns
    # true or false; does not change the lock's state.
    def verify
      @client.inspect_key(@key, token: @token).token_match?
    end

    # A short description: key and token.
    def to_s
      "#<#{self.class.name} #{describe}>"
    end

    alias inspect to_s

    # @api private
    # Marks the lock lost (once, never after a release) and runs the on_lost callbacks.
    def mark_lost(reason)
      callbacks = @mutex.synchronize do
        return false if @lost_reason || @released

        @lost_reason = reason
        @keep_alive_task&.cancel
        @cond&.broadcast
        list = @callbacks || []
        @callbacks = nil
        list
      end
      stop_keep_alive
      @client.__send__(:forget_lock, self)
      @client.__send__(:dispatch, callbacks, self, reason) unless @detached
      true
    end

    # @api private
    # Arms keep-alive when asked (for +max_hold+ seconds, nil: no cap). The lost deadline is
    # already in the client's heap (Client#acquire_answered).
    def arm(keep_alive:, max_hold:)
      return unless keep_alive

      @mutex.synchronize do
        @keep_alive = true
        @keep_alive_until = max_hold && Scheduler.now + max_hold
      end
      schedule_keep_alive(@lease_ms / 3000.0)
    end

    # @api private
    # In a forked child: this lock belongs to the parent's session. It keeps its key and token
    # (release and extend by token still work) but gets no lost signal and no keep-alive here.
    def detach_after_fork
      @mutex = Mutex.new
      @cond = nil
      @detached = true
      @extend_id = 0 # the child's session numbers its requests from 1
      @keep_alive = false
      @heap_index = nil
      @keep_alive_task = nil
      @callbacks = nil
    end

    # @api private
    # Stops keep-alive (idempotent).
    def stop_keep_alive
      @mutex.synchronize do
        @keep_alive = false
        @keep_alive_task&.cancel
      end
    end

    private

    # Whether the lock was certainly still held before a release whose first attempt's outcome
    # is unknown (Client#release_token).
    def held_before_release?
      @mutex.synchronize { @lost_reason.nil? && Clock.now < @deadline }
    end

    # The moment the lost signal fires: the deadline minus min(5 ms, lease / 10). The client's
    # deadline heap reads it without the mutex, after the write that moved it (#extended); a
    # look in the middle of that write is corrected by the add that follows it, or by
    # #deadline_reached.
    def fire_at
      @fire_at
    end

    # @api private
    # #fire_at for +deadline+ and a lease of +lease_ms+ (kept with the deadline: it is read on
    # every release and by the deadline heap).
    def self.fire_at(deadline, lease_ms)
      deadline - ([Protocol::ClientRule::LOST_MARGIN_MS, lease_ms / 10.0].min / 1000.0)
    end

    # The client's deadline heap found this lock due (its scheduler thread): marks it lost when
    # its lost signal is due; else (extended meanwhile) puts it back in the heap.
    def deadline_reached
      return if check_deadline

      @client.__send__(:deadline_add, self) if @mutex.synchronize { @lost_reason.nil? && !@released }
    end

    def describe
      "#{Errors.describe_key(@key)} token #{@token}"
    end

    def lost_error
      reason = @mutex.synchronize { @lost_reason }
      LockLostError.new("#{describe}: lock lost (#{reason.to_s.tr('_', ' ')})", reason: reason, key: @key,
                                                                                 token: @token)
    end

    def finish_release(reason)
      error = reason && lost_error
      @mutex.synchronize do
        @released = true
        @release_error = error
        @cond&.broadcast
      end
      @client.__send__(:forget_lock, self)
      raise error if error

      true
    end

    # Applies an EXTEND OK +resp+ to the request first sent at +t_first+: the deadline becomes
    # t_first + lease_ms (1 - 2 rho). Several extends may be in flight (keep-alive and the
    # application); the server applies them in request-id order, so only the answer to the
    # highest id so far counts: an older one read or processed after it changes nothing, even
    # when longer (checked under @mutex, which also guards the deadline). Returns false when
    # the lock was lost first.
    def extended(resp, t_first)
      @mutex.synchronize do
        return false if @lost_reason
        return true if @released || resp.id < @extend_id

        @extend_id = resp.id
        @lease_ms = resp.lease_ms
        @deadline = t_first + (resp.lease_ms / 1000.0 * Session::RATE_FACTOR)
        @fire_at = Lock.fire_at(@deadline, @lease_ms)
      end
      # The heap reads the new deadline (a later add for an older extend reads it too).
      @client.__send__(:deadline_add, self) unless @detached
      true
    end

    # Marks the lock lost when its lost signal is due. Returns true when it did.
    def check_deadline
      due = @mutex.synchronize { @lost_reason.nil? && !@released && !@detached && Clock.now >= fire_at }
      due ? mark_lost(:expired) : false
    end

    def schedule_keep_alive(delay)
      task = @client.__send__(:scheduler).after([delay, 0.001].max) { keep_alive_tick }
      @mutex.synchronize do
        if @keep_alive
          @keep_alive_task = task
        else
          task.cancel
        end
      end
    end

    # Runs on the scheduler thread: sends one EXTEND (asynchronously) with the current lease.
    def keep_alive_tick
      ms = @mutex.synchronize do
        return unless @keep_alive && @lost_reason.nil? && !@released

        if @keep_alive_until && Scheduler.now >= @keep_alive_until
          nil
        else
          @lease_ms
        end
      end
      return stop_keep_alive if ms.nil? # max hold reached: the lock runs out its lease

      @client.__send__(:extend_async, @key, @token, ms, &method(:keep_alive_answer))
    rescue ClosedError
      stop_keep_alive
    end

    def keep_alive_answer(resp, error, t_first)
      return unless keep_alive?

      if resp&.status == Protocol::Status::OK
        extended(resp, t_first)
        # The lease now running: this answer's, unless a later extend's was applied first.
        schedule_keep_alive(lease / 3)
      elsif resp&.status == Protocol::Status::NOT_HELD
        mark_lost(:not_held)
      elsif error.is_a?(ClosedError)
        stop_keep_alive
      else
        # Transport trouble or a transient server answer: try again soon, before the deadline.
        retry_in = [@mutex.synchronize { @lease_ms } / 12_000.0, remaining / 4].min
        schedule_keep_alive([retry_in, 0.01].max)
      end
    end
  end
end
