# frozen_string_literal: true

module Ticketing
  # A cancellation signal for blocking calls, in the manner of a cancellation token: create one,
  # pass it as +cancel:+ to a call, and call #cancel from any other thread. A cancelled
  # +acquire+ withdraws its wait on the server (+CANCEL+), releases a grant that raced the
  # cancellation, and raises CancelledError; no lock is left held.
  #
  #   cancel = Ticketing::Cancellation.new
  #   waiter = Thread.new { client.acquire("report", lease: 60, cancel: cancel) }
  #   cancel.cancel                # from any thread
  #   waiter.value                 # raises Ticketing::CancelledError
  #
  # This is the gem's alternative to +Timeout.timeout+ and Thread#raise, which interrupt a thread
  # at an arbitrary point. (If one does interrupt a waiting +acquire+ anyway, the client still
  # withdraws the wait in the background.) One Cancellation may serve many calls. Do not call
  # #cancel from a signal handler (+trap+): it takes a mutex; signal a thread instead.
  class Cancellation
    # A new, not yet cancelled signal.
    def initialize
      @mutex = Mutex.new
      @cancelled = false
      @callbacks = {}
      @next = 0
    end

    # Cancels every call using this signal, now and later. Idempotent; returns self.
    def cancel
      callbacks = @mutex.synchronize do
        return self if @cancelled

        @cancelled = true
        cbs = @callbacks.values
        @callbacks.clear
        cbs
      end
      callbacks.each(&:call)
      self
    end

    # Whether #cancel was called.
    def cancelled?
      @mutex.synchronize { @cancelled }
    end

    # @api private
    # Runs +block+ once when cancelled (at once if already cancelled). Returns a handle for
    # #unsubscribe.
    def subscribe(&block)
      run_now = @mutex.synchronize do
        unless @cancelled
          @next += 1
          @callbacks[@next] = block
          return @next
        end
        true
      end
      block.call if run_now
      nil
    end

    # @api private
    # Forgets a callback registered by #subscribe.
    def unsubscribe(handle)
      return if handle.nil?

      @mutex.synchronize { @callbacks.delete(handle) }
    end
  end
end
