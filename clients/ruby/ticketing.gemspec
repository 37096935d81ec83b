# frozen_string_literal: true

require_relative "lib/ticketing/version"

Gem::Specification.new do |spec|
  spec.name = "ticketing"
  spec.version = Ticketing::VERSION
  spec.summary = "Client for Ticketing, a distributed lock server with fencing tokens and FIFO fairness."
  spec.description = <<~TEXT
    The official Ruby client of Ticketing: one pipelined connection shared by every thread,
    sessions that survive reconnects, fencing tokens, leases with a local lost signal, keep-alive,
    cancellation without Timeout, TLS and mutual TLS. Standard library only.
  TEXT
  spec.authors = ["The Ticketing authors"]
  spec.license = "Apache-2.0"
  spec.homepage = "https://github.com/ticketing/ticketing"
  spec.metadata = {
    "source_code_uri" => "https://github.com/ticketing/ticketing",
    "documentation_uri" => "https://github.com/ticketing/ticketing/tree/main/clients/ruby",
    "bug_tracker_uri" => "https://github.com/ticketing/ticketing/issues",
    "rubygems_mfa_required" => "true"
  }
  # The library, its README and LICENSE; nothing else (no tests, conformance driver or scripts).
  spec.files = Dir.glob("lib/**/*.rb", base: __dir__).sort + %w[README.md LICENSE]
  spec.require_paths = ["lib"]
  spec.required_ruby_version = ">= 3.1"
end
