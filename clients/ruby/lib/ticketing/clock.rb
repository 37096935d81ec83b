# frozen_string_literal: true

module Ticketing
  # The clock of lock deadlines (Lock#deadline), in float seconds. It keeps counting while the
  # host is suspended, as the server's leases do (PROTOCOL.md, "The lost signal"): a client that
  # wakes from a suspend must not believe it still holds a lock whose lease ran out meanwhile.
  # On Linux it is +CLOCK_BOOTTIME+ (read through the vDSO, as cheap as the monotonic clock).
  # Where the system has no such clock, each interval between two readings counts as the larger
  # of the monotonic clock's and the wall clock's advance (Fallback).
  module Clock
    # The suspend-counting clock for systems without +CLOCK_BOOTTIME+: a suspend shows as the wall
    # clock running ahead of the monotonic one. A wall clock stepped back is ignored; one stepped
    # forward only makes deadlines earlier. Never goes backwards. Safe for concurrent use.
    class Fallback
      # +mono+ and +wall+ read the two clocks in float seconds (replaceable for tests).
      def initialize(mono: -> { Process.clock_gettime(Process::CLOCK_MONOTONIC) },
                     wall: -> { Process.clock_gettime(Process::CLOCK_REALTIME) })
        @mono = mono
        @wall = wall
        @mutex = Mutex.new
        @last_mono = mono.call
        @last_wall = wall.call
        @now = @last_mono
      end

      def now
        @mutex.synchronize do
          mono = @mono.call
          wall = @wall.call
          @now += [mono - @last_mono, wall - @last_wall].max
          @last_mono = mono
          @last_wall = wall
          @now
        end
      end
    end

    # Whether this system has +CLOCK_BOOTTIME+ (some platforms define the constant but refuse it).
    def self.boottime?
      Process.const_defined?(:CLOCK_BOOTTIME) && Process.clock_gettime(Process::CLOCK_BOOTTIME) && true
    rescue SystemCallError
      false
    end
    private_class_method :boottime?

    if boottime?
      # The clock now, in float seconds.
      def self.now
        Process.clock_gettime(Process::CLOCK_BOOTTIME)
      end
    else
      FALLBACK = Fallback.new
      private_constant :FALLBACK

      # The clock now, in float seconds.
      def self.now
        FALLBACK.now
      end
    end
  end
end
