/*
 * ticketing/wire.h - the Ticketing protocol v1 codec: frames to bytes and back, and the
 * handshake's proofs. It does no I/O and never allocates: encoders write into a buffer the caller
 * provides, decoders read a buffer and return views into it (like hiredis' reply reader).
 *
 * PROTOCOL.md in the repository is the specification; every value below is checked against
 * protocol/constants.json and protocol/vectors.json by the tests. Most programs never need this
 * header: <ticketing/ticketing.h> speaks the protocol for them. It is public for tools, proxies
 * and tests that need the bytes themselves.
 */
#ifndef TICKETING_WIRE_H
#define TICKETING_WIRE_H

#include <stddef.h>
#include <stdint.h>

#include "ticketing/export.h"

#ifdef __cplusplus
extern "C" {
#endif

/** The protocol version this library speaks (sent in HELLO). */
#define TK_PROTOCOL_VERSION 1

/* Frame sizes in bytes (length field included). */
#define TK_HEADER_SIZE 32             /**< request and response header */
#define TK_HELLO_SIZE 56              /**< HELLO frame */
#define TK_CHALLENGE_SIZE 48          /**< CHALLENGE frame without its data */
#define TK_AUTH_SIZE 40               /**< AUTH frame */
#define TK_WELCOME_SIZE 64            /**< WELCOME frame */
#define TK_MAX_CHALLENGE_DATA 1024    /**< most data bytes a CHALLENGE carries */
#define TK_MAX_KEY_LEN 65535          /**< the format's ceiling for a key */
#define TK_MAX_DATA_LEN 65535         /**< the format's ceiling for response data */
#define TK_SESSION_ID_SIZE 16         /**< session id bytes */
#define TK_STATE_ID_SIZE 16           /**< state id bytes */
#define TK_NONCE_SIZE 32              /**< nonce bytes */
#define TK_PROOF_SIZE 32              /**< HMAC-SHA256 proof bytes */
#define TK_INSPECT_DATA_SIZE 12       /**< INSPECT answer data bytes */
#define TK_WAIT_FOREVER_MS 0xFFFFFFFFu /**< wait_ms meaning "wait without limit" */

/* Flags. */
#define TK_CHALLENGE_AUTH_REQUIRED 0x01 /**< CHALLENGE flags: the server holds a token */
#define TK_WELCOME_RESUMED 0x01         /**< WELCOME flags: the session was resumed */

/* Client rules (constants.json "client_rules"). */
#define TK_ACK_EVERY 1024              /**< send ACK at least once per this many answers */
#define TK_CLOCK_RATE_BOUND_PPM 1000   /**< bound on each clock's rate error, parts per million */
#define TK_LOST_CHECK_MS 250           /**< while locks are held, deadlines are checked this often */
#define TK_LOST_MARGIN_MS 5            /**< lost fires this much (at most lease/10) before the deadline */

/** Operation codes (byte 4 of every frame). */
typedef enum tk_op {
    TK_OP_HELLO = 0x01,     /**< client -> server, first frame */
    TK_OP_CHALLENGE = 0x02, /**< server -> client: status, flags, server nonce */
    TK_OP_AUTH = 0x03,      /**< client -> server: client proof */
    TK_OP_WELCOME = 0x04,   /**< server -> client: status, resumed, grace, state id, proof */
    TK_OP_ACQUIRE = 0x10,   /**< take a key for lease_ms, waiting up to wait_ms */
    TK_OP_RELEASE = 0x11,   /**< release a key held with a token */
    TK_OP_EXTEND = 0x12,    /**< set the lease of a held key to lease_ms from now */
    TK_OP_CANCEL = 0x13,    /**< withdraw this session's ACQUIRE whose id is in token */
    TK_OP_PING = 0x14,      /**< liveness */
    TK_OP_INSPECT = 0x15,   /**< report a key's state */
    TK_OP_ACK = 0x16,       /**< token = lowest request id still awaited */
    TK_OP_EXPIRED = 0x20,   /**< push: the lock with token on key (data) is lost */
    TK_OP_GOAWAY = 0x21     /**< push: reconnect (to the leader in data) and resume */
} tk_op;

/** Status codes (byte 5 of a response). */
typedef enum tk_status {
    TK_STATUS_OK = 0,                  /**< done */
    TK_STATUS_TIMED_OUT = 1,           /**< the wait timeout passed; nothing is held */
    TK_STATUS_NOT_HELD = 2,            /**< the token does not hold the key; nothing changed */
    TK_STATUS_INVALID = 3,             /**< bad request; detail is the field code */
    TK_STATUS_NOT_LEADER = 4,          /**< not the leader; data is the leader's address */
    TK_STATUS_BUSY = 5,                /**< a server limit was reached; detail is the limit */
    TK_STATUS_SHUTTING_DOWN = 6,       /**< the server is stopping */
    TK_STATUS_AUTH_FAILED = 7,         /**< the handshake proof did not verify */
    TK_STATUS_UNSUPPORTED_VERSION = 8, /**< the server does not speak this version */
    TK_STATUS_CANCELLED = 9            /**< the ACQUIRE was withdrawn by CANCEL */
} tk_status;

/** INVALID field codes (response detail). */
typedef enum tk_invalid_field {
    TK_FIELD_LENGTH = 1,     /**< frame length inconsistent; the connection closes */
    TK_FIELD_OP = 2,         /**< unknown operation */
    TK_FIELD_FLAGS = 3,      /**< reserved flags not zero */
    TK_FIELD_KEY = 4,        /**< key empty or too long */
    TK_FIELD_LEASE = 5,      /**< lease outside the server's range */
    TK_FIELD_WAIT = 6,       /**< reserved */
    TK_FIELD_TOKEN = 7,      /**< token zero */
    TK_FIELD_REQUEST_ID = 8, /**< request id zero, reused, or a differing retry */
    TK_FIELD_HANDSHAKE = 9,  /**< reserved */
    TK_FIELD_SESSION = 10    /**< HELLO's session id is all zero */
} tk_invalid_field;

/** BUSY limit codes (response detail). */
typedef enum tk_busy_limit {
    TK_LIMIT_CONNECTIONS = 1,     /**< too many connections (CHALLENGE) */
    TK_LIMIT_WAITERS_PER_KEY = 2, /**< the key's queue is full */
    TK_LIMIT_WAITERS_TOTAL = 3,   /**< the server's waiter limit */
    TK_LIMIT_LOCKS = 4,           /**< distinct keys */
    TK_LIMIT_INFLIGHT = 5,        /**< queued acquires or stored outcomes of the session */
    TK_LIMIT_STORAGE = 6,         /**< tokens or horizon cannot be made durable now */
    TK_LIMIT_SESSIONS = 7         /**< too many sessions (WELCOME) */
} tk_busy_limit;

/** EXPIRED push reasons (detail). */
typedef enum tk_expired_reason {
    TK_EXPIRED_LEASE = 1,   /**< the lease ran out */
    TK_EXPIRED_STOPPING = 2 /**< the server is stopping */
} tk_expired_reason;

/** GOAWAY push reasons (detail). */
typedef enum tk_goaway_reason {
    TK_GOAWAY_LEADERSHIP = 1, /**< this node is no longer the leader */
    TK_GOAWAY_STOPPING = 2    /**< this node is stopping for maintenance */
} tk_goaway_reason;

/** INSPECT flags (last 4 bytes of the INSPECT data). */
typedef enum tk_inspect_flag {
    TK_INSPECT_HELD = 0x1,        /**< somebody holds the key */
    TK_INSPECT_TOKEN_MATCH = 0x2, /**< the request's token is the holder's */
    TK_INSPECT_SESSION = 0x4,     /**< the asking session holds the key */
    TK_INSPECT_STALLED = 0x8,     /**< the key waits for storage before its next grant */
    TK_INSPECT_STARTUP = 0x10     /**< the server is in its start-up wait: no grant before it ends
                                       (set on every key; the lock-delay field is the time left) */
} tk_inspect_flag;

/** Outcome of a decoder. */
typedef enum tk_wire_result {
    TK_WIRE_OK = 0,        /**< one whole frame decoded */
    TK_WIRE_SHORT = 1,     /**< incomplete: read more bytes (not an error on a stream) */
    TK_WIRE_LENGTH = 2,    /**< a length field disagrees with the layout */
    TK_WIRE_TOO_LARGE = 3, /**< the length field is above the reader's limit */
    TK_WIRE_WRONG_OP = 4   /**< a handshake frame with another op */
} tk_wire_result;

/** A request frame (client -> server). `key` is a view: it is never copied. */
typedef struct tk_request {
    uint8_t op;         /**< tk_op */
    uint8_t flags;      /**< reserved: 0 */
    uint64_t id;        /**< request id, non-zero */
    uint64_t token;     /**< fencing token, CANCEL's target id, or ACK's lowest awaited id */
    uint32_t lease_ms;  /**< ACQUIRE, EXTEND */
    uint32_t wait_ms;   /**< ACQUIRE */
    const uint8_t *key; /**< key bytes (may be NULL when key_len is 0) */
    size_t key_len;     /**< at most TK_MAX_KEY_LEN */
} tk_request;

/** A response or push frame (server -> client). `data` is a view into the decoded buffer. */
typedef struct tk_response {
    uint8_t op;          /**< the request's op, or TK_OP_EXPIRED / TK_OP_GOAWAY */
    uint8_t status;      /**< tk_status (unknown values are possible) */
    uint64_t id;         /**< the request's id; 0 for pushes */
    uint64_t token;      /**< see PROTOCOL.md */
    uint32_t lease_ms;   /**< see PROTOCOL.md */
    uint32_t detail;     /**< field code, limit code, reason, queued ms... */
    const uint8_t *data; /**< data bytes (key, address, message, INSPECT data) */
    size_t data_len;     /**< at most TK_MAX_DATA_LEN */
} tk_response;

/** HELLO (client -> server). */
typedef struct tk_hello {
    uint8_t version;                          /**< TK_PROTOCOL_VERSION */
    uint16_t flags;                           /**< reserved: 0 */
    uint8_t session_id[TK_SESSION_ID_SIZE];   /**< the client's session, never all zero */
    uint8_t nonce[TK_NONCE_SIZE];             /**< fresh random bytes */
} tk_hello;

/** CHALLENGE (server -> client). `data` is a view. */
typedef struct tk_challenge {
    uint8_t status;               /**< tk_status */
    uint8_t version;              /**< the server's version */
    uint8_t flags;                /**< TK_CHALLENGE_AUTH_REQUIRED */
    uint32_t detail;              /**< field or limit code */
    uint8_t nonce[TK_NONCE_SIZE]; /**< server nonce */
    const uint8_t *data;          /**< leader address or message */
    size_t data_len;              /**< at most TK_MAX_CHALLENGE_DATA */
} tk_challenge;

/** AUTH (client -> server). */
typedef struct tk_auth {
    uint8_t proof[TK_PROOF_SIZE]; /**< client proof, zero without auth */
} tk_auth;

/** WELCOME (server -> client). */
typedef struct tk_welcome {
    uint8_t status;                     /**< tk_status */
    uint8_t flags;                      /**< TK_WELCOME_RESUMED */
    uint32_t detail;                    /**< limit code for BUSY */
    uint32_t session_grace_ms;          /**< how long the session outlives a drop */
    uint8_t state_id[TK_STATE_ID_SIZE]; /**< the lock state this server serves */
    uint8_t proof[TK_PROOF_SIZE];       /**< server proof, zero without auth */
} tk_welcome;

/**
 * Encodes a request into buf. Returns the frame's size (TK_HEADER_SIZE + key_len); the frame is
 * written only when cap is at least that. Returns 0 when key_len exceeds TK_MAX_KEY_LEN.
 */
TK_API size_t tk_encode_request(const tk_request *r, uint8_t *buf, size_t cap);

/**
 * Encodes a response into buf, like tk_encode_request (for test servers and proxies).
 * Returns 0 when data_len exceeds TK_MAX_DATA_LEN.
 */
TK_API size_t tk_encode_response(const tk_response *r, uint8_t *buf, size_t cap);

/**
 * Decodes the request frame at the start of buf (len bytes available). max_key bounds the
 * frame: a length field above TK_HEADER_SIZE - 4 + max_key is TK_WIRE_TOO_LARGE as soon as the 4
 * length bytes are there. On TK_WIRE_OK, *frame_len is the frame's size and r->key points into buf.
 */
TK_API tk_wire_result tk_decode_request(const uint8_t *buf, size_t len, size_t max_key, tk_request *r,
                                 size_t *frame_len);

/** Decodes the response frame at the start of buf; see tk_decode_request. */
TK_API tk_wire_result tk_decode_response(const uint8_t *buf, size_t len, size_t max_data, tk_response *r,
                                  size_t *frame_len);

/** Encodes HELLO into out (TK_HELLO_SIZE bytes). */
TK_API void tk_encode_hello(const tk_hello *h, uint8_t out[TK_HELLO_SIZE]);
/** Decodes a HELLO of exactly len bytes. */
TK_API tk_wire_result tk_decode_hello(const uint8_t *buf, size_t len, tk_hello *h);

/**
 * Encodes CHALLENGE into buf; returns its size (TK_CHALLENGE_SIZE + data_len), written when cap
 * allows. Returns 0 when data_len exceeds TK_MAX_CHALLENGE_DATA.
 */
TK_API size_t tk_encode_challenge(const tk_challenge *c, uint8_t *buf, size_t cap);
/**
 * Decodes the CHALLENGE at the start of buf. TK_WIRE_SHORT until the whole frame is there;
 * *frame_len is its size. c->data points into buf.
 */
TK_API tk_wire_result tk_decode_challenge(const uint8_t *buf, size_t len, tk_challenge *c, size_t *frame_len);

/** Encodes AUTH into out (TK_AUTH_SIZE bytes). */
TK_API void tk_encode_auth(const tk_auth *a, uint8_t out[TK_AUTH_SIZE]);
/** Decodes an AUTH of exactly len bytes. */
TK_API tk_wire_result tk_decode_auth(const uint8_t *buf, size_t len, tk_auth *a);

/** Encodes WELCOME into out (TK_WELCOME_SIZE bytes). */
TK_API void tk_encode_welcome(const tk_welcome *w, uint8_t out[TK_WELCOME_SIZE]);
/** Decodes a WELCOME of exactly len bytes. */
TK_API tk_wire_result tk_decode_welcome(const uint8_t *buf, size_t len, tk_welcome *w);

/**
 * client_proof = HMAC-SHA256(token, "ticketing/1 client" || session_id || client_nonce ||
 * server_nonce). Returns 0 on success, -1 if the HMAC could not be computed.
 */
TK_API int tk_client_proof(const void *token, size_t token_len, const uint8_t session_id[TK_SESSION_ID_SIZE],
                    const uint8_t client_nonce[TK_NONCE_SIZE], const uint8_t server_nonce[TK_NONCE_SIZE],
                    uint8_t out[TK_PROOF_SIZE]);

/**
 * server_proof = HMAC-SHA256(token, "ticketing/1 server" || session_id || client_nonce ||
 * server_nonce || WELCOME[5..31]), where WELCOME[5..31] are the 27 bytes of the encoded w from
 * offset 5 to 31 (w->proof is ignored). Returns 0 on success, -1 on failure.
 */
TK_API int tk_server_proof(const void *token, size_t token_len, const uint8_t session_id[TK_SESSION_ID_SIZE],
                    const uint8_t client_nonce[TK_NONCE_SIZE], const uint8_t server_nonce[TK_NONCE_SIZE],
                    const tk_welcome *w, uint8_t out[TK_PROOF_SIZE]);

/** Compares two proofs in constant time; 1 when equal. */
TK_API int tk_proof_equal(const uint8_t a[TK_PROOF_SIZE], const uint8_t b[TK_PROOF_SIZE]);

/* Names as in protocol/constants.json ("ACQUIRE", "NOT_HELD", ...); NULL for unknown values. */
TK_API const char *tk_op_name(unsigned op);                       /**< op name */
TK_API const char *tk_status_name(unsigned status);               /**< status name */
TK_API const char *tk_invalid_field_name(unsigned field);         /**< INVALID field code name */
TK_API const char *tk_busy_limit_name(unsigned limit);            /**< BUSY limit code name */
TK_API const char *tk_expired_reason_name(unsigned reason);       /**< EXPIRED reason name */
TK_API const char *tk_goaway_reason_name(unsigned reason);        /**< GOAWAY reason name */
TK_API const char *tk_inspect_flag_name(unsigned flag);           /**< INSPECT flag name (one bit) */

#ifdef __cplusplus
}
#endif

#endif /* TICKETING_WIRE_H */
