# frozen_string_literal: true

$LOAD_PATH.unshift(File.expand_path("../lib", __dir__))
require "minitest/autorun"
require "json"
require "ticketing"

# Unwinds a thread with +throw+, as Timeout.timeout does on Ruby 3.1 (timeout 0.2.0), whatever
# the timeout gem in use: Thread#raise of this exception throws in the target thread, so that
# +rescue+ (even of Exception) never sees it and only +ensure+ runs.
class ThrowUnwind < StandardError
  # Runs the block inside the matching catch; yields the exception to raise into this thread.
  # Returns the block's value, or :thrown once unwound.
  def self.catch
    exc = new("unwound by throw")
    exc.instance_variable_set(:@thread, Thread.current)
    ::Kernel.catch(exc) { yield exc }
  end

  def exception(*)
    throw(self, :thrown) if @thread == Thread.current
    super
  end
end

# Shared helpers for the tests.
module TestHelper
  REPO_ROOT = File.expand_path("../../..", __dir__)
  PROTOCOL_DIR = File.join(REPO_ROOT, "protocol")

  module_function

  def vectors
    @vectors ||= JSON.parse(File.read(File.join(PROTOCOL_DIR, "vectors.json")))
  end

  def constants
    @constants ||= JSON.parse(File.read(File.join(PROTOCOL_DIR, "constants.json")))
  end

  # The README's first ```ruby block: the example that test/readme_test.rb (against lib/) and
  # test/package_test.rb (against the installed gem) run as written.
  def readme_example
    File.read(File.join(REPO_ROOT, "clients", "ruby", "README.md"))[/```ruby\n(.*?)```/m, 1]
  end

  def hex(str)
    [str].pack("H*")
  end

  # The clock of lock deadlines (Ticketing::Clock), so that tests can compare Lock#deadline
  # with it; without a suspend it runs as the monotonic clock.
  def now
    Ticketing::Clock.now
  end

  # The ways a thread blocked in a call can be unwound from outside, each as
  # [name, ->(client_call) { thread }, ->(thread) { unwind it }, result check]: a throw
  # (Timeout.timeout on Ruby 3.1), Thread#raise, Thread#kill. Each thread's value is :thrown,
  # :raised or nil (killed).
  UNWINDERS = {
    throw: [
      lambda do |call|
        Thread.new do
          ThrowUnwind.catch do |exc|
            Thread.current[:unwind] = exc
            call.call
          end
        end
      end,
      ->(t) { t.raise(t[:unwind]) }, :thrown
    ],
    raise: [
      lambda do |call|
        Thread.new do
          call.call
        rescue Interrupt
          :raised
        end
      end,
      ->(t) { t.raise(Interrupt) }, :raised
    ],
    kill: [->(call) { Thread.new { call.call } }, lambda(&:kill), nil]
  }.freeze

  # Starts +call+ on a thread and, once +ready+ returns true, unwinds it the +how+ way; asserts
  # the thread ended that way.
  def unwind(how, ready, &call)
    start, stop, want = UNWINDERS.fetch(how)
    thread = start.call(call)
    thread.report_on_exception = false
    assert(eventually(5) { thread[:unwind] || how != :throw } && eventually(5, &ready), "#{how}: the call is waiting")
    stop.call(thread)
    assert thread.join(5), "#{how}: the thread ended"
    if want.nil?
      assert_nil thread.value, "#{how}: the thread was killed"
    else
      assert_equal want, thread.value, "#{how}: the thread was unwound"
    end
  end

  # Polls the block until it returns truthy or +timeout+ seconds pass; returns its last value.
  def eventually(timeout = 5.0, interval = 0.01)
    deadline = now + timeout
    loop do
      value = yield
      return value if value || now >= deadline

      sleep interval
    end
  end
end
