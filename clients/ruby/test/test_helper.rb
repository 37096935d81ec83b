# frozen_string_literal: true

$LOAD_PATH.unshift(File.expand_path("../lib", __dir__))
require "minitest/autorun"
require "json"
require "ticketing"

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

  def hex(str)
    [str].pack("H*")
  end

  # The clock of lock deadlines (Ticketing::Clock), so that tests can compare Lock#deadline
  # with it; without a suspend it runs as the monotonic clock.
  def now
    Ticketing::Clock.now
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
