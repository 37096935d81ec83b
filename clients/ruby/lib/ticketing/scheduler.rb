# frozen_string_literal: true

module Ticketing
  # @api private
  # One background thread per client that runs short tasks at times of Clock (which counts the
  # time the host is suspended): lock deadlines, keep-alive ticks, the heartbeat. Tasks must not
  # block (they only queue frames or flip state). The thread starts on the first task and stops
  # on #shutdown.
  class Scheduler
    # A scheduled task; #cancel keeps it from running.
    class Task
      attr_reader :at

      def initialize(at, seq, block)
        @at = at
        @seq = seq
        @block = block
        @cancelled = false
      end

      def cancel
        @cancelled = true
      end

      def cancelled?
        @cancelled
      end

      def sort_key
        [@at, @seq]
      end

      def run
        @block.call unless @cancelled
      end
    end

    # The longest wait between two looks at Clock while tasks are pending (a held lock always
    # has one: its deadline), in seconds.
    CHECK_EVERY = Protocol::ClientRule::LOST_CHECK_MS / 1000.0

    def initialize(logger: nil)
      @logger = logger
      @mutex = Mutex.new
      @cond = ConditionVariable.new
      @tasks = [] # sorted by [at, seq]
      @seq = 0
      @thread = nil
      @stopped = false
    end

    # The monotonic clock, in float seconds: request timeouts and backoffs.
    def self.now
      Process.clock_gettime(Process::CLOCK_MONOTONIC)
    end

    # Runs +block+ on the scheduler thread at Clock time +at+ (or soon after). Returns a Task.
    def at(at, &block)
      @mutex.synchronize do
        @seq += 1
        task = Task.new(at, @seq, block)
        return task if @stopped

        key = task.sort_key
        idx = @tasks.bsearch_index { |t| (t.sort_key <=> key) >= 0 } || @tasks.size
        @tasks.insert(idx, task)
        @cond.signal if idx.zero?
        @thread ||= Thread.new { run }.tap { |t| t.name = "ticketing-timers" if t.respond_to?(:name=) }
        task
      end
    end

    # Runs +block+ after +delay+ seconds.
    def after(delay, &block)
      at(Clock.now + delay, &block)
    end

    # Stops the thread; pending tasks never run. Idempotent.
    def shutdown
      thread = @mutex.synchronize do
        @stopped = true
        @tasks.clear
        @cond.signal
        @thread
      end
      thread&.join(1) unless thread == Thread.current
    end

    # After fork (in the child): the thread is gone; start afresh.
    def reset_after_fork
      @mutex = Mutex.new
      @cond = ConditionVariable.new
      @tasks = []
      @thread = nil
    end

    private

    def run
      loop do
        task = @mutex.synchronize do
          loop do
            return if @stopped

            @tasks.shift while @tasks.first&.cancelled?
            first = @tasks.first
            if first.nil?
              @cond.wait(@mutex)
            elsif (wait = first.at - Clock.now) > 0
              # The wait runs on the monotonic clock, which stops while the host is suspended:
              # look at Clock again at least every LOST_CHECK_MS, so that a deadline that passed
              # during a suspend fires within that after the resume.
              @cond.wait(@mutex, [wait, CHECK_EVERY].min)
            else
              break @tasks.shift
            end
          end
        end
        begin
          task.run
        rescue StandardError => e
          @logger&.error("ticketing: timer task failed: #{e.class}: #{e.message}")
        end
      end
    end
  end
end
