# frozen_string_literal: true

require "openssl"

module Ticketing
  # Protocol version 1 (PROTOCOL.md): the code tables and the frame layouts, as pure functions
  # over binary Strings. No I/O and no state: the client's connection feeds it bytes, and the
  # tests check every table against protocol/constants.json and every frame against
  # protocol/vectors.json.
  #
  # All integers are big-endian. After the handshake every frame is a 32-byte header plus a
  # variable part (a request's key, a response's data):
  #
  #   request:  length(4) op(1) flags(1) key_len(2) id(8) token(8) lease_ms(4) wait_ms(4) key
  #   response: length(4) op(1) status(1) data_len(2) id(8) token(8) lease_ms(4) detail(4) data
  module Protocol
    # The protocol version sent in HELLO.
    VERSION = 1

    # Frame and field sizes, in bytes (+WAIT_FOREVER+ is the +wait_ms+ meaning "without limit").
    module Size
      HEADER = 32
      HELLO = 56
      CHALLENGE = 48
      AUTH = 40
      WELCOME = 64
      SESSION_ID = 16
      STATE_ID = 16
      NONCE = 32
      PROOF = 32
      INSPECT_DATA = 12
      MAX_CHALLENGE_DATA = 1024
      MAX_DATA_LEN = 65_535
      MAX_KEY_LEN = 65_535
      WAIT_FOREVER = 0xFFFF_FFFF
      CHALLENGE_AUTH_REQUIRED = 1
      WELCOME_RESUMED = 1
    end

    # Operation codes (the +op+ byte).
    module Op
      HELLO = 0x01
      CHALLENGE = 0x02
      AUTH = 0x03
      WELCOME = 0x04
      ACQUIRE = 0x10
      RELEASE = 0x11
      EXTEND = 0x12
      CANCEL = 0x13
      PING = 0x14
      INSPECT = 0x15
      ACK = 0x16
      EXPIRED = 0x20
      GOAWAY = 0x21
    end

    # Response status codes.
    module Status
      OK = 0
      TIMED_OUT = 1
      NOT_HELD = 2
      INVALID = 3
      NOT_LEADER = 4
      BUSY = 5
      SHUTTING_DOWN = 6
      AUTH_FAILED = 7
      UNSUPPORTED_VERSION = 8
      CANCELLED = 9
    end

    # +INVALID+ field codes (the +detail+ of an +INVALID+ answer).
    module InvalidField
      LENGTH = 1
      OP = 2
      FLAGS = 3
      KEY = 4
      LEASE = 5
      WAIT = 6
      TOKEN = 7
      REQUEST_ID = 8
      HANDSHAKE = 9
      SESSION = 10
    end

    # +BUSY+ limit codes (the +detail+ of a +BUSY+ answer).
    module BusyLimit
      CONNECTIONS = 1
      WAITERS_PER_KEY = 2
      WAITERS_TOTAL = 3
      LOCKS = 4
      INFLIGHT = 5
      STORAGE = 6
      SESSIONS = 7
    end

    # Reasons of an +EXPIRED+ push.
    module ExpiredReason
      LEASE = 1
      STOPPING = 2
    end

    # Reasons of a +GOAWAY+ push.
    module GoawayReason
      LEADERSHIP = 1
      STOPPING = 2
    end

    # Flags in the data of an +INSPECT+ answer.
    module InspectFlag
      HELD = 0x1
      TOKEN_MATCH = 0x2
      SESSION = 0x4
      STALLED = 0x8
      STARTUP = 0x10
    end

    # Numbers every client follows (PROTOCOL.md, "The lost signal" and "ACK").
    module ClientRule
      # Send ACK at least once per this many answers.
      ACK_EVERY = 1024
      # Bound on each clock's rate error, in parts per million (rho = 0.001).
      CLOCK_RATE_BOUND_PPM = 1000
      # While a lock is held, its deadline is compared with the clock at least this often (ms):
      # runtime timers stop while the host is suspended, the deadlines' clock does not.
      LOST_CHECK_MS = 250
      # The lost signal fires min(this, lease / 10) milliseconds before the local deadline.
      LOST_MARGIN_MS = 5
    end

    # The code tables by their name in constants.json.
    TABLES = {
      "ops" => Op, "statuses" => Status, "invalid_fields" => InvalidField,
      "busy_limits" => BusyLimit, "expired_reasons" => ExpiredReason,
      "goaway_reasons" => GoawayReason, "inspect_flags" => InspectFlag
    }.freeze

    # A request frame's fields. +key+ is a binary String (empty for ops without a key).
    Request = Struct.new(:op, :flags, :id, :token, :lease_ms, :wait_ms, :key, keyword_init: true)

    # A response frame's fields. +data+ is a binary String.
    Response = Struct.new(:op, :status, :id, :token, :lease_ms, :detail, :data, keyword_init: true)

    # HELLO (client -> server).
    Hello = Struct.new(:version, :flags, :session_id, :nonce, keyword_init: true)
    # CHALLENGE (server -> client). +data+: the leader hint (NOT_LEADER) or a message.
    Challenge = Struct.new(:status, :version, :flags, :detail, :nonce, :data, keyword_init: true) do
      # Whether the server holds a token (flag +AUTH_REQUIRED+).
      def auth_required?
        (flags & Size::CHALLENGE_AUTH_REQUIRED) != 0
      end
    end
    # AUTH (client -> server).
    Auth = Struct.new(:proof, keyword_init: true)
    # WELCOME (server -> client).
    Welcome = Struct.new(:status, :flags, :detail, :session_grace_ms, :state_id, :proof,
                         keyword_init: true) do
      # Whether the session named in HELLO was live and is resumed (flag +RESUMED+).
      def resumed?
        (flags & Size::WELCOME_RESUMED) != 0
      end
    end

    # A frame that breaks the layout. #kind is +:length+ (a length field disagrees with the
    # layout) or +:too_large+ (the length field is above the reader's limit).
    class FrameError < ProtocolError
      # +:length+ or +:too_large+.
      attr_reader :kind

      # @api private
      def initialize(message, kind:)
        super(message)
        @kind = kind
      end
    end

    HEADER_FORMAT = "NCCnQ>Q>NN"
    private_constant :HEADER_FORMAT
    ZERO_NONCE = ("\0" * Size::NONCE).b.freeze
    private_constant :ZERO_NONCE

    module_function

    # The name (a String) of +value+ in +table+ (one of the modules above), or nil.
    def name_of(table, value)
      table.constants.find { |c| table.const_get(c) == value }&.to_s
    end

    # Encodes a request frame (Request, or a Hash of its fields).
    def encode_request(req)
      key = (req[:key] || "").b
      [Size::HEADER - 4 + key.bytesize, req[:op], req[:flags] || 0, key.bytesize, req[:id],
       req[:token] || 0, req[:lease_ms] || 0, req[:wait_ms] || 0].pack(HEADER_FORMAT) << key
    end

    # Encodes a request frame from its fields (+key+ a binary String).
    def encode_request_fields(op, flags, id, token, lease_ms, wait_ms, key)
      [Size::HEADER - 4 + key.bytesize, op, flags, key.bytesize, id, token, lease_ms,
       wait_ms].pack(HEADER_FORMAT) << key
    end

    # Appends the request frame of these fields to +buf+ (a binary String); returns +buf+.
    def append_request_fields(buf, op, flags, id, token, lease_ms, wait_ms, key)
      [Size::HEADER - 4 + key.bytesize, op, flags, key.bytesize, id, token, lease_ms,
       wait_ms].pack(HEADER_FORMAT, buffer: buf) << key
    end

    # Encodes a response frame (Response, or a Hash of its fields).
    def encode_response(resp)
      data = (resp[:data] || "").b
      [Size::HEADER - 4 + data.bytesize, resp[:op], resp[:status] || 0, data.bytesize,
       resp[:id] || 0, resp[:token] || 0, resp[:lease_ms] || 0,
       resp[:detail] || 0].pack(HEADER_FORMAT) << data
    end

    # Decodes the request frame at +offset+ of +buf+. Returns [Request, bytes consumed], or nil
    # when +buf+ does not yet hold the whole frame (read more). Raises FrameError for a frame
    # that breaks the layout; +max_var+ is the reader's limit on the key length.
    def decode_request(buf, offset = 0, max_var: Size::MAX_KEY_LEN)
      fields = decode_header(buf, offset, max_var)
      return nil unless fields

      len, op, flags, var_len, id, token, lease, wait = fields
      key = buf.byteslice(offset + Size::HEADER, var_len)
      [Request.new(op: op, flags: flags, id: id, token: token, lease_ms: lease, wait_ms: wait,
                   key: key), 4 + len]
    end

    # Decodes the response frame at +offset+ of +buf+; see decode_request. +max_var+ is the
    # reader's limit on the data length.
    def decode_response(buf, offset = 0, max_var: Size::MAX_DATA_LEN)
      fields = decode_header(buf, offset, max_var)
      return nil unless fields

      len, op, status, var_len, id, token, lease, detail = fields
      resp = Response.allocate # the fields one by one: no keyword Hash per frame
      resp.op = op
      resp.status = status
      resp.id = id
      resp.token = token
      resp.lease_ms = lease
      resp.detail = detail
      resp.data = buf.byteslice(offset + Size::HEADER, var_len)
      [resp, 4 + len]
    end

    def decode_header(buf, offset, max_var)
      avail = buf.bytesize - offset
      return nil if avail < 4

      if avail >= Size::HEADER
        # The whole header is there (nearly always): one unpack.
        fields = buf.unpack(HEADER_FORMAT, offset: offset)
        len = fields[0]
      else
        len = buf.unpack1("N", offset: offset)
      end
      if len > Size::HEADER - 4 + max_var
        raise FrameError.new("frame length #{len} above the limit #{Size::HEADER - 4 + max_var}",
                             kind: :too_large)
      end
      raise FrameError.new("frame length #{len} below the header", kind: :length) if len < Size::HEADER - 4
      return nil if avail < 4 + len

      fields ||= buf.unpack(HEADER_FORMAT, offset: offset)
      if fields[3] != len - (Size::HEADER - 4)
        raise FrameError.new("variable length #{fields[3]} disagrees with frame length #{len}",
                             kind: :length)
      end
      fields
    end
    private_class_method :decode_header

    # Encodes HELLO.
    def encode_hello(session_id:, nonce:, version: VERSION, flags: 0)
      check_size(session_id, Size::SESSION_ID, "session id")
      check_size(nonce, Size::NONCE, "nonce")
      [Size::HELLO - 4, Op::HELLO, version, flags].pack("NCCn") << session_id.b << nonce.b
    end

    # Decodes a whole HELLO frame.
    def decode_hello(frame)
      check_frame(frame, Op::HELLO, Size::HELLO, Size::HELLO)
      _, _, version, flags = frame.unpack("NCCn")
      Hello.new(version: version, flags: flags, session_id: frame.byteslice(8, 16),
                nonce: frame.byteslice(24, 32))
    end

    # Encodes CHALLENGE.
    def encode_challenge(status: Status::OK, version: VERSION, flags: 0, detail: 0, nonce: nil, data: "")
      data = data.b
      [Size::CHALLENGE - 4 + data.bytesize, Op::CHALLENGE, status, version, flags, detail,
       data.bytesize, 0].pack("NCCCCNnn") << (nonce || ZERO_NONCE).b << data
    end

    # Decodes a whole CHALLENGE frame.
    def decode_challenge(frame)
      check_frame(frame, Op::CHALLENGE, Size::CHALLENGE, Size::CHALLENGE + Size::MAX_CHALLENGE_DATA)
      _, _, status, version, flags, detail, data_len = frame.unpack("NCCCCNn")
      if data_len != frame.bytesize - Size::CHALLENGE
        raise FrameError.new("CHALLENGE data length #{data_len} disagrees with its frame", kind: :length)
      end
      Challenge.new(status: status, version: version, flags: flags, detail: detail,
                    nonce: frame.byteslice(16, 32), data: frame.byteslice(48, data_len))
    end

    # Encodes AUTH (a nil proof: 32 zero bytes, for a server without auth).
    def encode_auth(proof: nil)
      proof ||= ZERO_NONCE
      check_size(proof, Size::PROOF, "proof")
      [Size::AUTH - 4, Op::AUTH, 0, 0].pack("NCCn") << proof.b
    end

    # Decodes a whole AUTH frame.
    def decode_auth(frame)
      check_frame(frame, Op::AUTH, Size::AUTH, Size::AUTH)
      Auth.new(proof: frame.byteslice(8, 32))
    end

    # Encodes WELCOME.
    def encode_welcome(status: Status::OK, flags: 0, detail: 0, session_grace_ms: 0, state_id: nil, proof: nil)
      state_id ||= "\0" * Size::STATE_ID
      check_size(state_id, Size::STATE_ID, "state id")
      [Size::WELCOME - 4, Op::WELCOME, status, flags, 0, detail, session_grace_ms].pack("NCCCCNN") <<
        state_id.b << (proof || ZERO_NONCE).b
    end

    # Decodes a whole WELCOME frame.
    def decode_welcome(frame)
      check_frame(frame, Op::WELCOME, Size::WELCOME, Size::WELCOME)
      _, _, status, flags, _, detail, grace = frame.unpack("NCCCCNN")
      Welcome.new(status: status, flags: flags, detail: detail, session_grace_ms: grace,
                  state_id: frame.byteslice(16, 16), proof: frame.byteslice(32, 32))
    end

    # The client's proof: HMAC-SHA256(token, "ticketing/1 client" || session id || client nonce
    # || server nonce).
    def client_proof(token, session_id, client_nonce, server_nonce)
      OpenSSL::HMAC.digest("SHA256", token.b, "ticketing/1 client".b << session_id.b << client_nonce.b << server_nonce.b)
    end

    # The server's proof: HMAC-SHA256(token, "ticketing/1 server" || session id || client nonce ||
    # server nonce || WELCOME[5..31]); +welcome_signed+ is those 27 bytes of the WELCOME frame.
    def server_proof(token, session_id, client_nonce, server_nonce, welcome_signed)
      OpenSSL::HMAC.digest("SHA256", token.b, "ticketing/1 server".b << session_id.b << client_nonce.b <<
                                              server_nonce.b << welcome_signed.b)
    end

    # Bytes 5..31 of a WELCOME frame: what the server proof covers.
    def welcome_signed_part(frame)
      frame.byteslice(5, 27)
    end

    # Compares two byte strings in constant time.
    def secure_equal?(left, right)
      left.bytesize == right.bytesize && OpenSSL.fixed_length_secure_compare(left, right)
    end

    def check_size(value, size, what)
      raise ArgumentError, "#{what} must be #{size} bytes" unless value.is_a?(String) && value.bytesize == size
    end
    private_class_method :check_size

    def check_frame(frame, op, min, max)
      unless frame.bytesize.between?(min, max) && frame.unpack1("N") == frame.bytesize - 4 && frame.getbyte(4) == op
        raise FrameError.new("malformed #{name_of(Op, op)} frame (#{frame.bytesize} bytes)", kind: :length)
      end
    end
    private_class_method :check_frame
  end
end
