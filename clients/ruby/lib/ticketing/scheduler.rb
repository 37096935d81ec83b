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

      def initialize(at, block)
        @at = at
        @block = block
        @cancelled = false
      end

      # Keeps the task from running, and drops its block (a cancelled task waits in the list
      # until its time or the next compaction: it should not keep what the block refers to).
      def cancel
        @cancelled = true
        @block = nil
      end

      def cancelled?
        @cancelled
      end

      def run
        block = @block
        block.call if block && !@cancelled
      end
    end

    # The longest wait between two looks at Clock while tasks are pending (a held lock always
    # has one: its deadline), in seconds.
    CHECK_EVERY = Protocol::ClientRule::LOST_CHECK_MS / 1000.0
    # Tasks added between two compactions of the list (#compact_locked).
    COMPACT_EVERY = 4096

    def initialize(logger: nil)
      @logger = logger
      @mutex = Mutex.new
      @cond = ConditionVariable.new
      @tasks = [] # sorted by time, then by order of addition
      @added = 0  # tasks added since the last compaction
      @thread = nil
      @stopped = false
    end

    # The monotonic clock, in float seconds: request timeouts and backoffs.
    def self.now
      Process.clock_gettime(Process::CLOCK_MONOTONIC)
    end

    # Runs +block+ on the scheduler thread at Clock time +at+ (or soon after). Returns a Task.
    # Tasks due at the same time run in the order they were added.
    def at(at, &block)
      task = Task.new(at, block)
      @mutex.synchronize do
        return task if @stopped

        @added += 1
        compact_locked if @added >= COMPACT_EVERY && @tasks.size >= COMPACT_EVERY
        last = @tasks.last
        if last.nil? || last.at <= at
          idx = @tasks.size
          @tasks << task
        else
          idx = @tasks.bsearch_index { |t| t.at > at }
          @tasks.insert(idx, task)
        end
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

    # Drops the cancelled tasks from the list (lock deadlines cancelled by a release would
    # otherwise stay until their time).
    def compact_locked
      @added = 0
      @tasks.reject!(&:cancelled?)
    end

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
