# frozen_string_literal: true

require "open3"
require "rbconfig"
require_relative "test_helper"

# Ticketing::Clock: the deadlines' clock counts the time the host is suspended.
class ClockTest < Minitest::Test
  # Each interval counts as the larger of the monotonic and the wall clock's advance.
  def test_fallback_counts_a_wall_clock_ahead_and_ignores_one_stepped_back
    mono = 100.0
    wall = 1_700_000_000.0
    clock = Ticketing::Clock::Fallback.new(mono: -> { mono }, wall: -> { wall })
    start = clock.now
    steps = [[1, 1, 1], [1, 61, 61],  # a suspend of a minute: the wall clock ran ahead
             [1, -3600, 1],           # the wall clock stepped back: ignored
             [1, 1, 1],               # and owed nothing afterwards
             [0.5, 0.2, 0.5]]         # a slow wall clock: the monotonic advance counts
    steps.each do |dm, dw, counted|
      before = clock.now
      mono += dm
      wall += dw
      assert_in_delta counted, clock.now - before, 1e-9, "mono +#{dm}, wall +#{dw}"
    end
    assert_in_delta 64.5, clock.now - start, 1e-9
  end

  # On Linux the clock is CLOCK_BOOTTIME: in a time namespace whose boot time is 100000 s ahead
  # (unshare --time --boottime), it reads what /proc/uptime says, not the monotonic clock.
  def test_linux_clock_is_boottime
    skip "CLOCK_BOOTTIME is Linux's" unless RUBY_PLATFORM.include?("linux")
    code = 'print Ticketing::Clock.now, " ", Process.clock_gettime(Process::CLOCK_MONOTONIC), " ", ' \
           'File.read("/proc/uptime").split.first'
    lib = File.expand_path("../lib", __dir__)
    begin
      out, err, status = Open3.capture3("unshare", "--time", "--boottime", "100000", RbConfig.ruby, "-I", lib,
                                        "-rticketing", "-e", code)
    rescue SystemCallError => e
      skip "unshare --time is not available here: #{e.message}"
    end
    skip "unshare --time is refused here: #{err.lines.first&.chomp}" unless status.success?
    clock, mono, uptime = out.split.map(&:to_f)
    assert_operator uptime - mono, :>, 99_000, "the namespace moves boot time only"
    assert_in_delta uptime, clock, 0.1 # /proc/uptime has 10 ms steps
  end
end
