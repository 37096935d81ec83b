# frozen_string_literal: true

require_relative "lib/ticketing/version"

Gem::Specification.new do |spec|
  spec.name = "ticketing"
  spec.version = Ticketing::VERSION
  spec.summary = "Ruby client for Ticketing, a distributed lock server (FIFO queues, fencing tokens, leases)"
  spec.description = <<~TEXT
    The official Ruby client of Ticketing: one pipelined connection shared by every thread,
    sessions that survive reconnects, fencing tokens, leases with a local lost signal, keep-alive,
    cancellation without Timeout, TLS and mutual TLS. Standard library only.
  TEXT
  spec.authors = ["The Ticketing authors"]
  spec.files = Dir["lib/**/*.rb"] + ["README.md"]
  spec.require_paths = ["lib"]
  spec.required_ruby_version = ">= 3.1"
  spec.metadata = { "rubygems_mfa_required" => "true" }
end
