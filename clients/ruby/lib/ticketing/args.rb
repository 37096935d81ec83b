# frozen_string_literal: true

module Ticketing
  # @api private
  # Argument checks, done before anything is sent (docs/clients.md rule 7). Durations are float
  # seconds in the API and integer milliseconds on the wire.
  module Args
    # Highest lease in ms (the wire field is 32 bits).
    MAX_LEASE_MS = 0xFFFF_FFFF - 1

    module_function

    # A key: a non-empty String of at most 65,535 bytes, returned as a frozen binary String.
    def key(key)
      unless key.is_a?(String)
        raise InvalidArgumentError.new("key must be a String, not #{key.class}", field: :key)
      end

      bytes = key.b
      raise InvalidArgumentError.new("key must not be empty", field: :key) if bytes.empty?
      if bytes.bytesize > Protocol::Size::MAX_KEY_LEN
        raise InvalidArgumentError.new(
          "key is #{bytes.bytesize} bytes; at most #{Protocol::Size::MAX_KEY_LEN}", field: :key
        )
      end
      bytes.freeze
    end

    # A lease in seconds (at least 1 ms, below 2^32 ms) -> whole milliseconds.
    def lease_ms(lease, field: :lease)
      # Whole seconds in range (the usual lease): the same milliseconds, fewer steps.
      return lease * 1000 if lease.is_a?(Integer) && lease.positive? && lease <= MAX_LEASE_MS / 1000

      secs = finite_seconds(lease, field)
      if secs < 0.001
        raise InvalidArgumentError.new(
          "#{field} #{lease.inspect} is below 1 ms (durations are in seconds: 0.5 is 500 ms)", field: field
        )
      end
      ms = (secs * 1000).round
      if ms > MAX_LEASE_MS
        raise InvalidArgumentError.new("#{field} #{lease.inspect} s is above #{MAX_LEASE_MS / 1000.0} s", field: field)
      end
      ms
    end

    # A wait timeout in seconds (nil: without limit; 0: try once) -> wire wait_ms.
    def wait_ms(timeout)
      return Protocol::Size::WAIT_FOREVER if timeout.nil?
      return 0 if timeout.equal?(0) # try once (try_acquire)

      secs = finite_seconds(timeout, :timeout)
      if secs.negative?
        raise InvalidArgumentError.new("timeout #{timeout.inspect} is negative (nil waits without limit)",
                                       field: :timeout)
      end
      [(secs * 1000).round, Protocol::Size::WAIT_FOREVER - 1].min
    end

    # A fencing token: an Integer in 1..2^64-1.
    def token(token)
      unless token.is_a?(Integer) && token.positive? && token < 2**64
        raise InvalidArgumentError.new("token must be an Integer in 1..2^64-1, not #{token.inspect}", field: :token)
      end
      token
    end

    # An option duration in seconds: finite, >= 0 (or > 0 with +positive+); nil allowed with
    # +allow_nil+.
    def duration(value, name, allow_nil: false, positive: false)
      return nil if value.nil? && allow_nil

      secs = finite_seconds(value, name)
      if secs.negative? || (positive && secs.zero?)
        raise InvalidArgumentError.new("#{name} must be #{positive ? 'positive' : 'at least 0'}, not #{value.inspect}",
                                       field: name)
      end
      secs
    end

    def finite_seconds(value, name)
      unless value.is_a?(Numeric) && value.real?
        raise InvalidArgumentError.new("#{name} must be a number of seconds, not #{value.inspect}", field: name)
      end
      secs = value.to_f
      unless secs.finite?
        raise InvalidArgumentError.new("#{name} must be a finite number of seconds, not #{value.inspect}", field: name)
      end
      secs
    end
  end
end
