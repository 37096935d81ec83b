/**
 * The Ticketing protocol, version 1: frame layouts, codes, the handshake and its proofs.
 *
 * PROTOCOL.md at the repository root is the specification; `protocol/constants.json` and
 * `protocol/vectors.json` are what this module is tested against. All integers are big-endian;
 * 64-bit fields (request ids, tokens) are `bigint`. Nothing here does I/O.
 *
 * @module
 */
import { createHmac, timingSafeEqual } from 'node:crypto';

/** The protocol version this client speaks (sent in HELLO). */
export const VERSION = 1;

/** Operation codes (offset 4 of every frame). */
export const Op = {
  HELLO: 0x01,
  CHALLENGE: 0x02,
  AUTH: 0x03,
  WELCOME: 0x04,
  ACQUIRE: 0x10,
  RELEASE: 0x11,
  EXTEND: 0x12,
  CANCEL: 0x13,
  PING: 0x14,
  INSPECT: 0x15,
  ACK: 0x16,
  EXPIRED: 0x20,
  GOAWAY: 0x21,
} as const;
/** An operation code. */
export type Op = (typeof Op)[keyof typeof Op];

/** Status codes (offset 5 of every server frame). */
export const Status = {
  OK: 0,
  TIMED_OUT: 1,
  NOT_HELD: 2,
  INVALID: 3,
  NOT_LEADER: 4,
  BUSY: 5,
  SHUTTING_DOWN: 6,
  AUTH_FAILED: 7,
  UNSUPPORTED_VERSION: 8,
  CANCELLED: 9,
} as const;
/** A status code. */
export type Status = (typeof Status)[keyof typeof Status];

/** `INVALID` field codes: the `detail` of an INVALID answer names the offending field. */
export const Field = {
  LENGTH: 1,
  OP: 2,
  FLAGS: 3,
  KEY: 4,
  LEASE: 5,
  WAIT: 6,
  TOKEN: 7,
  REQUEST_ID: 8,
  HANDSHAKE: 9,
  SESSION: 10,
} as const;
/** An `INVALID` field code. */
export type Field = (typeof Field)[keyof typeof Field];

/** `BUSY` limit codes: the `detail` of a BUSY answer names the limit reached. */
export const Limit = {
  CONNECTIONS: 1,
  WAITERS_PER_KEY: 2,
  WAITERS_TOTAL: 3,
  LOCKS: 4,
  INFLIGHT: 5,
  STORAGE: 6,
  SESSIONS: 7,
} as const;
/** A `BUSY` limit code. */
export type Limit = (typeof Limit)[keyof typeof Limit];

/** Reasons of an `EXPIRED` push (its `detail`). */
export const ExpiredReason = {
  /** The lease ran out and the server reclaimed the lock. */
  LEASE: 1,
  /** The server is stopping; the lease still runs on its books, but the lock will not survive the stop. */
  STOPPING: 2,
} as const;
/** An `EXPIRED` reason code. */
export type ExpiredReason = (typeof ExpiredReason)[keyof typeof ExpiredReason];

/** Reasons of a `GOAWAY` push (its `detail`). */
export const GoawayReason = {
  /** This node is no longer the leader. */
  LEADERSHIP: 1,
  /** This cluster node is stopping for maintenance. */
  STOPPING: 2,
} as const;
/** A `GOAWAY` reason code. */
export type GoawayReason = (typeof GoawayReason)[keyof typeof GoawayReason];

/** Flag bits of the INSPECT answer's data (its third u32). */
export const InspectFlag = {
  /** Somebody holds the key. */
  HELD: 0x1,
  /** The request's token is the holder's token. */
  TOKEN_MATCH: 0x2,
  /** The asking session holds the key. */
  SESSION: 0x4,
  /** The key waits for storage before its next grant. */
  STALLED: 0x8,
  /** The server is in its start-up wait: no grant before it ends (the lock-delay left says when). */
  STARTUP: 0x10,
} as const;
/** An INSPECT flag bit. */
export type InspectFlag = (typeof InspectFlag)[keyof typeof InspectFlag];

/** Frame sizes and special values, named as in constants.json. */
export const Sizes = {
  /** The AUTH frame, length field included. */
  AUTH: 40,
  /** The CHALLENGE frame without its data. */
  CHALLENGE: 48,
  /** CHALLENGE flag bit: the server holds a token and requires the proof. */
  CHALLENGE_AUTH_REQUIRED: 0x01,
  /** The header of every request and response. */
  HEADER: 32,
  /** The HELLO frame. */
  HELLO: 56,
  /** INSPECT answer data: u32 ms since the grant, u32 ms of lock-delay left, u32 flags. */
  INSPECT_DATA: 12,
  /** The most data a CHALLENGE carries. */
  MAX_CHALLENGE_DATA: 1024,
  /** The format's ceiling for response data. */
  MAX_DATA_LEN: 0xffff,
  /** The format's ceiling for a key; servers set a lower key limit (default 256). */
  MAX_KEY_LEN: 0xffff,
  /** Nonce size. */
  NONCE: 32,
  /** Proof size (HMAC-SHA256). */
  PROOF: 32,
  /** Session id size. */
  SESSION_ID: 16,
  /** State id size. */
  STATE_ID: 16,
  /** `wait_ms` meaning "wait without limit". */
  WAIT_FOREVER: 0xffffffff,
  /** The WELCOME frame. */
  WELCOME: 64,
  /** WELCOME flag bit: the session named in HELLO was live and is resumed. */
  WELCOME_RESUMED: 0x01,
} as const;

/** Rules every client follows, named as in constants.json (`client_rules`). */
export const ClientRules = {
  /** Send ACK at least once per this many answers received. */
  ACK_EVERY: 1024,
  /** ρ in parts per million: the bound on the rate error of each of the client's and the server's clocks. */
  CLOCK_RATE_BOUND_PPM: 1000,
  /** While a lock is held, its deadline is compared with the suspend-counting clock at least this often (ms): runtime timers stop during a suspend. */
  LOST_CHECK_MS: 250,
  /** The lost signal fires `min(LOST_MARGIN_MS, lease / 10)` before the local deadline. */
  LOST_MARGIN_MS: 5,
} as const;

/** The header size of every request and response. */
export const HEADER_SIZE = Sizes.HEADER;
/** `wait_ms` meaning "wait without limit". */
export const WAIT_FOREVER = Sizes.WAIT_FOREVER;
/** The largest frame the format allows, length field included. */
export const MAX_FRAME_SIZE = Sizes.HEADER + Sizes.MAX_KEY_LEN;

function nameOf(table: Record<string, number>, value: number): string | undefined {
  for (const [k, v] of Object.entries(table)) if (v === value) return k;
  return undefined;
}

/** The name of an op code (`ACQUIRE`), or `0x7f` for one this client does not know. */
export function opName(op: number): string {
  return nameOf(Op, op) ?? `0x${op.toString(16)}`;
}
/** The name of a status code, or `STATUS_<n>` for one this client does not know. */
export function statusName(status: number): string {
  return nameOf(Status, status) ?? `STATUS_${status}`;
}
/** The name of an INVALID field code, or `FIELD_<n>`. */
export function fieldName(field: number): string {
  return nameOf(Field, field) ?? `FIELD_${field}`;
}
/** The name of a BUSY limit code, or `LIMIT_<n>`. */
export function limitName(limit: number): string {
  return nameOf(Limit, limit) ?? `LIMIT_${limit}`;
}

/** Why a frame could not be decoded. `short` on a stream only means "read more bytes". */
export type DecodeFailure = 'short' | 'length' | 'too_large' | 'wrong_op';

/** A frame that does not follow PROTOCOL.md. */
export class FrameError extends Error {
  override name = 'FrameError';
  /**
   * @param reason - what is wrong: `short` (incomplete), `length` (a length disagrees with the
   *   layout), `too_large` (above the reader's limit), `wrong_op` (another frame was expected).
   * @param message - for humans.
   */
  constructor(
    readonly reason: DecodeFailure,
    message: string,
  ) {
    super(message);
  }
}

/** A request frame (client -> server). */
export interface Request {
  /** The operation ({@link Op}). */
  op: number;
  /** Reserved; 0. */
  flags?: number;
  /** Non-zero, in send order per session, echoed in the answer. */
  id: bigint;
  /** RELEASE, EXTEND: the lock's token. CANCEL: the request id to withdraw. INSPECT: 0 or a token to check. ACK: the lowest id still awaited. Else 0n. */
  token?: bigint;
  /** ACQUIRE, EXTEND: lease in ms. */
  leaseMs?: number;
  /** ACQUIRE: ms to wait in the queue; 0 = try once; {@link WAIT_FOREVER} = no limit. */
  waitMs?: number;
  /** ACQUIRE, RELEASE, EXTEND, INSPECT: the key. Empty otherwise. */
  key?: Uint8Array;
}

/** A response frame (server -> client), or a push (`id` 0n: EXPIRED, GOAWAY). */
export interface Response {
  /** The request's op, or EXPIRED / GOAWAY for pushes, or 0 for INVALID/LENGTH. */
  op: number;
  /** The {@link Status}. */
  status: number;
  /** The request's id; 0n for pushes and INVALID/LENGTH. */
  id: bigint;
  /** ACQUIRE/EXTEND OK: the token. EXPIRED: the token of the lost lock. INSPECT: the holder's token when shown (else 0n). */
  token: bigint;
  /** ACQUIRE/EXTEND OK: the lease now running, ms. INSPECT: ms left on the holder's lease. */
  leaseMs: number;
  /** ACQUIRE OK: ms queued. INSPECT: acquires queued. CANCEL OK: 1 if withdrawn. ACK OK: outcomes stored. INVALID: field. BUSY: limit. EXPIRED/GOAWAY: reason. */
  detail: number;
  /** EXPIRED: the key. INSPECT: {@link decodeInspectData}. NOT_LEADER, GOAWAY: the leader's address. Errors: a UTF-8 message. */
  data: Buffer;
}

function u8(name: string, v: number): number {
  if (!Number.isInteger(v) || v < 0 || v > 0xff) throw new RangeError(`${name} must be an integer in 0..255, got ${v}`);
  return v;
}
function u16(name: string, v: number): number {
  if (!Number.isInteger(v) || v < 0 || v > 0xffff) throw new RangeError(`${name} must be an integer in 0..65535, got ${v}`);
  return v;
}
function u32(name: string, v: number): number {
  if (!Number.isInteger(v) || v < 0 || v > 0xffffffff) throw new RangeError(`${name} must be an integer in 0..2^32-1, got ${v}`);
  return v;
}
function u64(name: string, v: bigint): bigint {
  if (typeof v !== 'bigint' || v < 0n || v > 0xffffffffffffffffn) throw new RangeError(`${name} must be a bigint in 0..2^64-1`);
  return v;
}

function writeHeader(b: Buffer, op: number, second: number, n: number, id: bigint, token: bigint, lease: number, last: number): void {
  b.writeUInt32BE(HEADER_SIZE - 4 + n, 0);
  b[4] = u8('op', op);
  b[5] = u8('flags/status', second);
  b.writeUInt16BE(n, 6);
  b.writeBigUInt64BE(u64('id', id), 8);
  b.writeBigUInt64BE(u64('token', token), 16);
  b.writeUInt32BE(u32('lease', lease), 24);
  b.writeUInt32BE(u32('wait/detail', last), 28);
}

const EMPTY = Buffer.alloc(0);

/** Encodes a request frame. Throws `RangeError` for a field outside its width. */
export function encodeRequest(r: Request): Buffer {
  const key = r.key ?? EMPTY;
  if (key.length > Sizes.MAX_KEY_LEN) throw new RangeError(`key longer than ${Sizes.MAX_KEY_LEN} bytes`);
  const b = Buffer.allocUnsafe(HEADER_SIZE + key.length);
  writeHeader(b, r.op, r.flags ?? 0, key.length, r.id, r.token ?? 0n, r.leaseMs ?? 0, r.waitMs ?? 0);
  b.set(key, HEADER_SIZE);
  return b;
}

/** Encodes a response frame (what a server sends; used by tests and tools). Data beyond the ceiling is cut. */
export function encodeResponse(r: Omit<Response, 'data'> & { data?: Uint8Array }): Buffer {
  let data = r.data ?? EMPTY;
  if (data.length > Sizes.MAX_DATA_LEN) data = data.subarray(0, Sizes.MAX_DATA_LEN);
  const b = Buffer.allocUnsafe(HEADER_SIZE + data.length);
  writeHeader(b, r.op, r.status, data.length, r.id, r.token, r.leaseMs, r.detail);
  b.set(data, HEADER_SIZE);
  return b;
}

function lengthField(b: Uint8Array): number {
  return ((b[0]! << 24) >>> 0) + (b[1]! << 16) + (b[2]! << 8) + b[3]!;
}

/**
 * Reports the size (length field included) of the 32-byte-header frame at the start of `b`,
 * or 0 when `b` does not hold all of it yet. Throws {@link FrameError} `length` for a length
 * below the header and `too_large` above `HEADER + maxVar`, from the first 4 bytes alone.
 */
export function headerFrameSize(b: Uint8Array, maxVar: number = Sizes.MAX_KEY_LEN): number {
  if (b.length < 4) return 0;
  const l = lengthField(b);
  if (l < HEADER_SIZE - 4) throw new FrameError('length', `frame length ${l} is below the header`);
  if (l > HEADER_SIZE - 4 + Math.min(maxVar, Sizes.MAX_KEY_LEN)) throw new FrameError('too_large', `frame length ${l} is above the limit`);
  return b.length < 4 + l ? 0 : 4 + l;
}

function asBuffer(b: Uint8Array): Buffer {
  return Buffer.isBuffer(b) ? b : Buffer.from(b.buffer, b.byteOffset, b.byteLength);
}

function decodeHeaderFrame(src: Uint8Array, maxVar: number): { b: Buffer; size: number } {
  const b = asBuffer(src);
  const size = headerFrameSize(b, maxVar);
  if (size === 0) throw new FrameError('short', 'incomplete frame');
  if (b.readUInt16BE(6) !== size - HEADER_SIZE) throw new FrameError('length', 'key/data length disagrees with the frame length');
  return { b, size };
}

/** Decodes the request frame at the start of `src`. `key` is a view into `src`. */
export function decodeRequest(src: Uint8Array, maxKey: number = Sizes.MAX_KEY_LEN): Request & { key: Buffer; size: number } {
  const { b, size } = decodeHeaderFrame(src, maxKey);
  return {
    op: b[4]!,
    flags: b[5]!,
    id: b.readBigUInt64BE(8),
    token: b.readBigUInt64BE(16),
    leaseMs: b.readUInt32BE(24),
    waitMs: b.readUInt32BE(28),
    key: b.subarray(HEADER_SIZE, size),
    size,
  };
}

/** Decodes the response frame at the start of `src`. `data` is a view into `src`. */
export function decodeResponse(src: Uint8Array, maxData: number = Sizes.MAX_DATA_LEN): Response & { size: number } {
  const { b, size } = decodeHeaderFrame(src, maxData);
  return {
    op: b[4]!,
    status: b[5]!,
    id: b.readBigUInt64BE(8),
    token: b.readBigUInt64BE(16),
    leaseMs: b.readUInt32BE(24),
    detail: b.readUInt32BE(28),
    data: b.subarray(HEADER_SIZE, size),
    size,
  };
}

/** The 12 bytes of an INSPECT answer's data. */
export interface InspectData {
  /** ms since the holder was granted the lock (0 when not held). */
  heldForMs: number;
  /** ms of lock-delay left (the key is unavailable after an expiry). */
  lockDelayMs: number;
  /** {@link InspectFlag} bits. */
  flags: number;
}

/**
 * Decodes the data of an INSPECT answer. Throws {@link FrameError} `length` when it is shorter
 * than {@link Sizes.INSPECT_DATA} bytes (longer data is allowed, for later additions).
 */
export function decodeInspectData(data: Uint8Array): InspectData {
  if (data.length < Sizes.INSPECT_DATA) throw new FrameError('length', `INSPECT data is ${data.length} bytes, want ${Sizes.INSPECT_DATA}`);
  const b = asBuffer(data);
  return { heldForMs: b.readUInt32BE(0), lockDelayMs: b.readUInt32BE(4), flags: b.readUInt32BE(8) };
}

/** Encodes the data of an INSPECT answer (what a server sends; for tests and tools). */
export function encodeInspectData(d: InspectData): Buffer {
  const b = Buffer.alloc(Sizes.INSPECT_DATA);
  b.writeUInt32BE(u32('heldForMs', d.heldForMs), 0);
  b.writeUInt32BE(u32('lockDelayMs', d.lockDelayMs), 4);
  b.writeUInt32BE(u32('flags', d.flags), 8);
  return b;
}

// ---- Handshake ----

/** HELLO (client -> server). */
export interface Hello {
  /** The protocol version ({@link VERSION}). */
  version: number;
  /** Reserved; 0. */
  flags?: number;
  /** 16 bytes, random per client (never all zero), the same on every connection of the session. */
  sessionId: Uint8Array;
  /** 32 fresh random bytes per connection. */
  nonce: Uint8Array;
}

/** CHALLENGE (server -> client). */
export interface Challenge {
  /** OK; or UNSUPPORTED_VERSION, INVALID, BUSY, SHUTTING_DOWN, NOT_LEADER (the server then closes). */
  status: number;
  /** The server's protocol version. */
  version: number;
  /** Bit 0: {@link Sizes.CHALLENGE_AUTH_REQUIRED}. */
  flags: number;
  /** INVALID: the field code; BUSY: the limit code; else 0. */
  detail: number;
  /** The server nonce (zero unless OK with auth). */
  nonce: Uint8Array;
  /** NOT_LEADER: the leader's client address (empty when unknown); other errors: a message; OK: empty. */
  data: Uint8Array;
}

/** AUTH (client -> server). */
export interface Auth {
  /** The client proof, all zero when the server does not require auth. */
  proof: Uint8Array;
}

/** The part of WELCOME that the server proof covers (bytes 5..31; the reserved byte is 0). */
export interface WelcomeSigned {
  /** OK; or AUTH_FAILED, BUSY, SHUTTING_DOWN, NOT_LEADER (the server then closes). */
  status: number;
  /** Bit 0: {@link Sizes.WELCOME_RESUMED}. */
  flags: number;
  /** BUSY: the limit code; else 0. */
  detail: number;
  /** How long the server keeps this session after its connection drops (0: no resume). */
  sessionGraceMs: number;
  /** The lock state this server serves (16 bytes). */
  stateId: Uint8Array;
}

/** WELCOME (server -> client). */
export interface Welcome extends WelcomeSigned {
  /** The server proof, all zero without auth or unless OK. */
  proof: Uint8Array;
}

function fixedLen(name: string, b: Uint8Array, n: number): Uint8Array {
  if (!(b instanceof Uint8Array) || b.length !== n) throw new RangeError(`${name} must be ${n} bytes`);
  return b;
}

/** Encodes a HELLO frame. */
export function encodeHello(h: Hello): Buffer {
  const b = Buffer.alloc(Sizes.HELLO);
  b.writeUInt32BE(Sizes.HELLO - 4, 0);
  b[4] = Op.HELLO;
  b[5] = u8('version', h.version);
  b.writeUInt16BE(u16('flags', h.flags ?? 0), 6);
  b.set(fixedLen('session id', h.sessionId, Sizes.SESSION_ID), 8);
  b.set(fixedLen('nonce', h.nonce, Sizes.NONCE), 24);
  return b;
}

/** Encodes a CHALLENGE frame (for tests and tools). Data beyond {@link Sizes.MAX_CHALLENGE_DATA} is cut. */
export function encodeChallenge(c: Omit<Challenge, 'detail' | 'data'> & { detail?: number; data?: Uint8Array }): Buffer {
  let data = c.data ?? EMPTY;
  if (data.length > Sizes.MAX_CHALLENGE_DATA) data = data.subarray(0, Sizes.MAX_CHALLENGE_DATA);
  const b = Buffer.alloc(Sizes.CHALLENGE + data.length);
  b.writeUInt32BE(Sizes.CHALLENGE - 4 + data.length, 0);
  b[4] = Op.CHALLENGE;
  b[5] = u8('status', c.status);
  b[6] = u8('version', c.version);
  b[7] = u8('flags', c.flags);
  b.writeUInt32BE(u32('detail', c.detail ?? 0), 8);
  b.writeUInt16BE(data.length, 12);
  b.set(fixedLen('nonce', c.nonce, Sizes.NONCE), 16);
  b.set(data, Sizes.CHALLENGE);
  return b;
}

/** Encodes an AUTH frame. */
export function encodeAuth(a: Auth): Buffer {
  const b = Buffer.alloc(Sizes.AUTH);
  b.writeUInt32BE(Sizes.AUTH - 4, 0);
  b[4] = Op.AUTH;
  b.set(fixedLen('proof', a.proof, Sizes.PROOF), 8);
  return b;
}

/** Encodes bytes 0..31 of a WELCOME frame: everything but the proof. */
function encodeWelcomeSigned(w: WelcomeSigned): Buffer {
  const b = Buffer.alloc(Sizes.WELCOME);
  b.writeUInt32BE(Sizes.WELCOME - 4, 0);
  b[4] = Op.WELCOME;
  b[5] = u8('status', w.status);
  b[6] = u8('flags', w.flags);
  b.writeUInt32BE(u32('detail', w.detail), 8);
  b.writeUInt32BE(u32('sessionGraceMs', w.sessionGraceMs), 12);
  b.set(fixedLen('state id', w.stateId, Sizes.STATE_ID), 16);
  return b;
}

/** Encodes a WELCOME frame (for tests and tools). */
export function encodeWelcome(w: Welcome): Buffer {
  const b = encodeWelcomeSigned(w);
  b.set(fixedLen('proof', w.proof, Sizes.PROOF), 32);
  return b;
}

function fixedFrame(src: Uint8Array, size: number, op: number): Buffer {
  const b = asBuffer(src);
  if (b.length < 5) throw new FrameError('short', 'incomplete frame');
  if (b.readUInt32BE(0) + 4 !== size || b.length !== size) throw new FrameError('length', `a ${opName(op)} frame is ${size} bytes`);
  if (b[4] !== op) throw new FrameError('wrong_op', `expected ${opName(op)}, got ${opName(b[4]!)}`);
  return b;
}

/** Decodes a HELLO frame occupying exactly `src`. Byte fields are views into `src`. */
export function decodeHello(src: Uint8Array): Required<Hello> {
  const b = fixedFrame(src, Sizes.HELLO, Op.HELLO);
  return { version: b[5]!, flags: b.readUInt16BE(6), sessionId: b.subarray(8, 24), nonce: b.subarray(24, 56) };
}

/**
 * The size of the CHALLENGE frame at the start of `b` from its length field, or 0 when fewer
 * than 4 bytes are there. Throws {@link FrameError} `length` when the length is outside
 * `CHALLENGE .. CHALLENGE + MAX_CHALLENGE_DATA`.
 */
export function challengeFrameSize(b: Uint8Array): number {
  if (b.length < 4) return 0;
  const n = lengthField(b) + 4;
  if (n < Sizes.CHALLENGE || n > Sizes.CHALLENGE + Sizes.MAX_CHALLENGE_DATA) throw new FrameError('length', `CHALLENGE length ${n - 4} is outside its layout`);
  return n;
}

/** Decodes a CHALLENGE frame occupying exactly `src`. Byte fields are views into `src`. */
export function decodeChallenge(src: Uint8Array): Challenge {
  const b = asBuffer(src);
  if (b.length < 5) throw new FrameError('short', 'incomplete frame');
  const n = challengeFrameSize(b);
  if (b.length < n) throw new FrameError('short', 'incomplete frame');
  if (b.length !== n || b.readUInt16BE(12) !== n - Sizes.CHALLENGE) throw new FrameError('length', 'CHALLENGE data length disagrees with the frame length');
  if (b[4] !== Op.CHALLENGE) throw new FrameError('wrong_op', `expected CHALLENGE, got ${opName(b[4]!)}`);
  return {
    status: b[5]!,
    version: b[6]!,
    flags: b[7]!,
    detail: b.readUInt32BE(8),
    nonce: b.subarray(16, 48),
    data: b.subarray(Sizes.CHALLENGE, n),
  };
}

/** Decodes an AUTH frame occupying exactly `src`. */
export function decodeAuth(src: Uint8Array): Auth {
  const b = fixedFrame(src, Sizes.AUTH, Op.AUTH);
  return { proof: b.subarray(8, 40) };
}

/** Decodes a WELCOME frame occupying exactly `src`. Byte fields are views into `src`. */
export function decodeWelcome(src: Uint8Array): Welcome {
  const b = fixedFrame(src, Sizes.WELCOME, Op.WELCOME);
  return {
    status: b[5]!,
    flags: b[6]!,
    detail: b.readUInt32BE(8),
    sessionGraceMs: b.readUInt32BE(12),
    stateId: b.subarray(16, 32),
    proof: b.subarray(32, 64),
  };
}

const CLIENT_LABEL = Buffer.from('ticketing/1 client', 'latin1');
const SERVER_LABEL = Buffer.from('ticketing/1 server', 'latin1');

function hmac(label: Buffer, token: Uint8Array | string, parts: Uint8Array[]): Buffer {
  const key = typeof token === 'string' ? Buffer.from(token, 'utf8') : token;
  const m = createHmac('sha256', key).update(label);
  for (const p of parts) m.update(p);
  return m.digest();
}

/** `HMAC-SHA256(token, "ticketing/1 client" || session id || client nonce || server nonce)`. */
export function clientProof(token: Uint8Array | string, sessionId: Uint8Array, clientNonce: Uint8Array, serverNonce: Uint8Array): Buffer {
  return hmac(CLIENT_LABEL, token, [sessionId, clientNonce, serverNonce]);
}

/**
 * `HMAC-SHA256(token, "ticketing/1 server" || session id || client nonce || server nonce ||
 * WELCOME[5..31])`. `welcome` is either the WELCOME frame itself (its bytes 5..31 are used exactly
 * as sent) or the signed fields, encoded as a server encodes them.
 */
export function serverProof(
  token: Uint8Array | string,
  sessionId: Uint8Array,
  clientNonce: Uint8Array,
  serverNonce: Uint8Array,
  welcome: Uint8Array | WelcomeSigned,
): Buffer {
  const frame = welcome instanceof Uint8Array ? welcome : encodeWelcomeSigned(welcome);
  if (frame.length < 32) throw new RangeError('the WELCOME frame must be at least 32 bytes');
  return hmac(SERVER_LABEL, token, [sessionId, clientNonce, serverNonce, frame.subarray(5, 32)]);
}

/** Compares two proofs in constant time. */
export function proofEqual(a: Uint8Array, b: Uint8Array): boolean {
  return a.length === b.length && timingSafeEqual(a, b);
}

// ---- Streaming frame reader ----

/**
 * Splits a byte stream into whole frames: feed it every `'data'` chunk; it calls `onFrame` with
 * each complete frame (length field included), whether a frame straddles chunks or a chunk holds
 * many frames. Frames inside one chunk are views into it; bytes are copied only for a frame that
 * straddles chunks. A frame's bytes are valid only during the callback. Any frame of at least the
 * 32-byte header's length is accepted (every handshake frame is), up to `HEADER + maxVar`.
 */
export class FrameReader {
  #parts: Buffer[] = [];
  #have = 0;
  #need = 0; // size of the frame being gathered in #parts, once its length is known

  /**
   * @param onFrame - called with each whole frame.
   * @param maxVar - the largest key or data length accepted.
   * @defaultValue maxVar - {@link Sizes.MAX_DATA_LEN}
   */
  constructor(
    private readonly onFrame: (frame: Buffer) => void,
    private readonly maxVar: number = Sizes.MAX_DATA_LEN,
  ) {}

  /** Bytes held back waiting for the rest of a frame. */
  get buffered(): number {
    return this.#have;
  }

  /** Feeds one chunk. Throws {@link FrameError} when the stream breaks the framing rules. */
  push(chunk: Buffer): void {
    if (this.#have > 0) {
      this.#parts.push(chunk);
      this.#have += chunk.length;
      if (this.#need === 0) {
        if (this.#have < 4) return;
        const head = this.#parts.length === 1 ? this.#parts[0]! : Buffer.concat(this.#parts, this.#have);
        this.#parts = [head];
        this.#need = this.#sizeAt(head, 0);
      }
      if (this.#have < this.#need) return;
      chunk = Buffer.concat(this.#parts, this.#have);
      this.#parts = [];
      this.#have = 0;
      this.#need = 0;
    }
    let off = 0;
    while (chunk.length - off >= 4) {
      const size = this.#sizeAt(chunk, off);
      if (chunk.length - off < size) break;
      this.onFrame(chunk.subarray(off, off + size));
      off += size;
    }
    if (off < chunk.length) {
      // Copy the tail so the (possibly large) chunk is not retained.
      const rest = Buffer.from(chunk.subarray(off));
      this.#parts = [rest];
      this.#have = rest.length;
      this.#need = rest.length >= 4 ? this.#sizeAt(rest, 0) : 0;
    }
  }

  #sizeAt(b: Buffer, off: number): number {
    const l = b.readUInt32BE(off);
    if (l < HEADER_SIZE - 4) throw new FrameError('length', `frame length ${l} is below the header`);
    if (l > HEADER_SIZE - 4 + this.maxVar) throw new FrameError('too_large', `frame length ${l} is above the limit`);
    return 4 + l;
  }
}
