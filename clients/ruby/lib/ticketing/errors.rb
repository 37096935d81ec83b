# frozen_string_literal: true

module Ticketing
  # Base class of every error this gem raises. Rescue it to handle all of them:
  #
  #   begin
  #     client.lock("order-1", lease: 30) { |lock| work(lock.token) }
  #   rescue Ticketing::LockLostError => e
  #     warn "the lock was lost (#{e.reason}): the work may not have been protected"
  #   rescue Ticketing::Error => e
  #     warn e.message
  #   end
  #
  # Messages are one line and carry context (key, token, timeout, endpoint).
  class Error < StandardError; end

  # The wait timeout passed, or a try found the key taken (status +TIMED_OUT+). Raised only by the
  # raising forms (+lock!+); +acquire+, +try_acquire+ and +lock+ return or yield +nil+ instead.
  class NotAcquiredError < Error
    # The key that was not acquired (a String).
    attr_reader :key

    # @api private
    def initialize(message = "not acquired", key: nil)
      super(message)
      @key = key
    end
  end

  # The call was cancelled by its Ticketing::Cancellation (or the server answered +CANCELLED+).
  # A cancelled acquire never leaves a lock held: the client withdrew the wait, and released a
  # grant that raced the cancellation.
  class CancelledError < Error; end

  # The server answered +NOT_HELD+ to a release or extend by key and token: that token does not
  # hold the key (expired, already released, or wrong). Nothing changed on the server.
  class NotHeldError < Error
    # The key (String) and the token (Integer) of the request.
    attr_reader :key, :token

    # @api private
    def initialize(message = "not held", key: nil, token: nil)
      super(message)
      @key = key
      @token = token
    end
  end

  # An operation on a Lock that is lost, or a scoped helper (+lock+ with a block) whose lock was
  # lost while the block ran. #reason is one of +:expired+, +:not_held+, +:server_restarted+,
  # +:server_stopping+ (see Lock#lost_reason).
  class LockLostError < Error
    # Why the lock was lost (a Symbol).
    attr_reader :reason
    # The lock's key (String) and token (Integer).
    attr_reader :key, :token

    # @api private
    def initialize(message = "lock lost", reason: nil, key: nil, token: nil)
      super(message)
      @reason = reason
      @key = key
      @token = token
    end
  end

  # A bad argument, rejected before anything was sent, or an +INVALID+ answer from the server.
  # #field names the offending field (+:key+, +:lease+, +:timeout+, +:token+, ...).
  class InvalidArgumentError < Error
    # The field that was rejected (a Symbol), when known.
    attr_reader :field

    # @api private
    def initialize(message = "invalid argument", field: nil)
      super(message)
      @field = field
    end
  end

  # +refuse_held: true+ was given and this client already holds the key.
  class AlreadyHeldError < Error; end

  # The handshake's authentication failed: a wrong token, a server that requires a token when
  # none was configured, a server that does not prove it holds the token, or (with a token) a
  # server that does not require one.
  class AuthFailedError < Error; end

  # The server does not speak protocol version 1.
  class UnsupportedVersionError < Error; end

  # A server limit was reached (status +BUSY+). #limit names it: +:connections+,
  # +:waiters_per_key+, +:waiters_total+, +:locks+, +:inflight+, +:storage+, +:sessions+.
  class BusyError < Error
    # The limit that was reached (a Symbol), or the raw code when it is unknown.
    attr_reader :limit

    # @api private
    def initialize(message = "server busy", limit: nil)
      super(message)
      @limit = limit
    end
  end

  # The server is stopping (status +SHUTTING_DOWN+).
  class ShuttingDownError < Error; end

  # The client was closed.
  class ClosedError < Error; end

  # The server answered a status this client does not know. #status is its number.
  class ServerError < Error
    # The status code (Integer).
    attr_reader :status

    # @api private
    def initialize(message = "server error", status: nil)
      super(message)
      @status = status
    end
  end

  # The server sent bytes that break the protocol. The client drops that connection and
  # reconnects; you see this error only from a handshake.
  class ProtocolError < Error; end

  # Base class of the transport errors below.
  class ConnectionError < Error; end

  # No endpoint could be connected to (refused, unreachable, not the leader, closed during the
  # handshake, or no answer within the connect timeout: TCP, TLS or the handshake).
  class UnavailableError < ConnectionError; end

  # The TLS handshake failed, or TLS met a plaintext peer (the message says so).
  class TLSError < ConnectionError; end

  # A call's own timeout passed: no answer from the server in time (a frozen or half-open server),
  # or no connection within it while the client reconnects.
  class TimeoutError < ConnectionError; end

  # The connection dropped and the session could not be resumed: the request's outcome is
  # unknown (an acquire may have been granted; such a lock runs out its lease).
  class ConnectionLostError < ConnectionError; end

  # The server's state id changed while the call was in flight: the server restarted (or a
  # cluster was restored) and forgot every lock. Nothing was re-queued.
  class ServerRestartedError < ConnectionError; end

  # @api private
  # Maps server answers to exceptions and renders keys for messages.
  module Errors
    # How much of a key a message shows, in bytes (longer keys are cut, with their length).
    MAX_KEY_IN_MESSAGE = 64

    module_function

    # The key as text when it is valid UTF-8, else as hex; a key longer than 64 bytes is cut
    # (never inside a character) and its length follows: a 5,000-byte key is never echoed whole.
    def describe_key(key)
      return "key (none)" if key.nil?

      bytes = key.b
      cut = bytes.byteslice(0, MAX_KEY_IN_MESSAGE)
      text = bytes.dup.force_encoding(Encoding::UTF_8)
      if text.valid_encoding? && text.each_char.none? { |c| c.ord < 0x20 }
        shown = cut.dup.force_encoding(Encoding::UTF_8)
        shown = shown.byteslice(0, shown.bytesize - 1) until shown.valid_encoding?
        out = "key #{shown.inspect}"
        cut = shown.b
      else
        out = "key 0x#{cut.unpack1('H*')}"
      end
      cut.bytesize < bytes.bytesize ? "#{out}\u2026(#{bytes.bytesize} bytes)" : out
    end

    # +text+ on one line (line breaks become "; ").
    def one_line(text)
      text = text.to_s
      return text unless text.match?(/[\r\n]/)

      text.split(/[\r\n]+/).reject(&:empty?).join("; ")
    end

    # "+phrase+: +detail+", one line, without saying the same thing twice: when one contains the
    # other (the server's "server shutting down" after our "server shutting down"), only the
    # longer one.
    def phrase(phrase, detail)
      detail = one_line(detail).strip
      return phrase if detail.empty?

      p = phrase.downcase
      d = detail.downcase
      return phrase if p.include?(d)
      return detail if d.include?(p)

      "#{phrase}: #{detail}"
    end

    # A system error's message without Ruby's " - connect(2) for host:port" tail (the caller
    # names the endpoint already).
    def syscall_text(error)
      return error.message unless error.is_a?(SystemCallError)

      error.message.split(" - ", 2).first
    end

    # The exception for a non-OK response +resp+ to a request with op name +op+ (a String).
    # +wait_ms+: an ACQUIRE's wait timeout, for a TIMED_OUT message (nil: not known).
    def from_response(op, resp, key: nil, token: nil, wait_ms: nil)
      msg = resp.data.to_s.dup.force_encoding(Encoding::UTF_8).scrub
      ctx = [op, key && describe_key(key), token && "token #{token}"].compact.join(" ")
      case resp.status
      when Protocol::Status::TIMED_OUT
        NotAcquiredError.new("#{ctx}: #{phrase(not_acquired_text(wait_ms), msg)}", key: key)
      when Protocol::Status::NOT_HELD
        NotHeldError.new("#{ctx}: #{phrase('not held', msg)}", key: key, token: token)
      when Protocol::Status::INVALID
        field = Protocol.name_of(Protocol::InvalidField, resp.detail)
        InvalidArgumentError.new("#{ctx}: #{phrase("invalid #{field || resp.detail}", msg)}",
                                 field: field&.downcase&.to_sym)
      when Protocol::Status::BUSY
        limit = Protocol.name_of(Protocol::BusyLimit, resp.detail)
        BusyError.new("#{ctx}: #{phrase("server busy (limit #{limit || resp.detail})", msg)}",
                      limit: limit ? limit.downcase.to_sym : resp.detail)
      when Protocol::Status::SHUTTING_DOWN
        ShuttingDownError.new("#{ctx}: #{phrase('server shutting down', msg)}")
      when Protocol::Status::CANCELLED
        CancelledError.new("#{ctx}: cancelled")
      when Protocol::Status::AUTH_FAILED
        AuthFailedError.new("#{ctx}: #{phrase('authentication failed', msg)}")
      when Protocol::Status::UNSUPPORTED_VERSION
        UnsupportedVersionError.new("#{ctx}: #{phrase('unsupported protocol version', msg)}")
      else
        ServerError.new("#{ctx}: #{phrase("server answered status #{resp.status}", msg)}", status: resp.status)
      end
    end

    def not_acquired_text(wait_ms)
      case wait_ms
      when nil, Protocol::Size::WAIT_FOREVER then "not acquired (timed out)"
      when 0 then "not acquired: the key is taken"
      else "not acquired within #{format_seconds(wait_ms / 1000.0)} s"
      end
    end

    # Seconds for messages: "0.3", "5", "1.25".
    def format_seconds(seconds)
      seconds = seconds.to_f
      seconds == seconds.round ? seconds.round.to_s : seconds.round(3).to_s
    end
  end
end
