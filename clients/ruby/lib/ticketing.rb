# frozen_string_literal: true

require_relative "ticketing/version"
require_relative "ticketing/errors"
require_relative "ticketing/protocol"
require_relative "ticketing/args"
require_relative "ticketing/cancellation"
require_relative "ticketing/clock"
require_relative "ticketing/scheduler"
require_relative "ticketing/connection"
require_relative "ticketing/session"
require_relative "ticketing/lock"
require_relative "ticketing/client"

# The Ruby client of Ticketing, a distributed lock server: FIFO queues per key, fencing tokens,
# leases, and a lost signal. Standard library only.
#
#   require "ticketing"
#
#   Ticketing::Client.open(endpoints: ["127.0.0.1:7070"]) do |client|
#     client.lock("daily-batch", lease: 30) do |lock|
#       run_batch(fencing_token: lock.token)
#     end
#   end
#
# See Ticketing::Client, Ticketing::Lock, Ticketing::Cancellation and the error classes under
# Ticketing::Error.
module Ticketing
end
