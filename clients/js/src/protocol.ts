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

/** The protocol version this client speaks. */
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
  EXPIRED: 0x20,
} as const;
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
} as const;
export type Field = (typeof Field)[keyof typeof Field];

/** `BUSY` limit codes: the `detail` of a BUSY answer names the limit reached. */
export const Limit = {
  CONNECTIONS: 1,
  WAITERS_PER_KEY: 2,
  WAITERS_TOTAL: 3,
  LOCKS: 4,
  INFLIGHT: 5,
} as const;
export type Limit = (typeof Limit)[keyof typeof Limit];

/** Frame sizes and special values, named as in constants.json. */
export const Sizes = {
  HEADER: 32,
  HELLO: 56,
  CHALLENGE: 40,
  AUTH: 40,
  WELCOME: 40,
  /** The format's ceiling for a key (and for response data); servers set a lower key limit. */
  MAX_KEY_LEN: 0xffff,
  SESSION_ID: 16,
  /** INSPECT answer data: u32 ms since the grant, u32 ms of lock-delay left. */
  INSPECT_DATA: 8,
  NONCE: 32,
  PROOF: 32,
  /** `wait_ms` meaning "wait without limit". */
  WAIT_FOREVER: 0xffffffff,
  /** CHALLENGE flag bit: the server holds a token and requires the proof. */
  CHALLENGE_AUTH_REQUIRED: 0x01,
} as const;

export const HEADER_SIZE = Sizes.HEADER;
export const WAIT_FOREVER = Sizes.WAIT_FOREVER;
/** The largest frame the format allows, length field included. */
export const MAX_FRAME_SIZE = Sizes.HEADER + Sizes.MAX_KEY_LEN;

function nameOf(table: Record<string, number>, value: number): string | undefined {
  for (const [k, v] of Object.entries(table)) if (v === value) return k;
  return undefined;
}

/** The name of an op code (`ACQUIRE`), or `0x7f` for one this client does not know. */
export function opName(op: number): string {
  return nameOf(Op, op) ?? `0x${op.toString(16).padStart(2, '0')}`;
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
  constructor(
    readonly reason: DecodeFailure,
    message: string,
  ) {
    super(message);
  }
}

/** A request frame (client -> server). */
export interface Request {
  op: number;
  /** Reserved; 0. */
  flags?: number;
  /** Non-zero, chosen by the client, echoed in the answer. */
  id: bigint;
  /** RELEASE, EXTEND: the lock's token. CANCEL: the request id to withdraw. Else 0n. */
  token?: bigint;
  /** ACQUIRE, EXTEND: lease in ms. */
  leaseMs?: number;
  /** ACQUIRE: ms to wait in the queue; 0 = try once; {@link WAIT_FOREVER} = no limit. */
  waitMs?: number;
  /** ACQUIRE, RELEASE, EXTEND, INSPECT: the key. Empty otherwise. */
  key?: Uint8Array;
}

/** A response frame (server -> client), or an EXPIRED notice (`id` 0n). */
export interface Response {
  op: number;
  status: number;
  id: bigint;
  /** ACQUIRE/EXTEND OK: the token. EXPIRED: the token that expired. INSPECT: the holder's token (0n if none). */
  token: bigint;
  /** ACQUIRE/EXTEND OK: the lease now running, ms. INSPECT: ms left on the holder's lease. */
  leaseMs: number;
  /** ACQUIRE OK: ms queued. INSPECT: acquires queued. INVALID: field code. BUSY: limit code. CANCEL OK: 1 if withdrawn. */
  detail: number;
  /** EXPIRED: the key. INSPECT: {@link decodeInspectData}. NOT_LEADER: the leader's address. Errors: a UTF-8 message. */
  data: Buffer;
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
  b[4] = op;
  b[5] = second;
  b.writeUInt16BE(n, 6);
  b.writeBigUInt64BE(u64('id', id), 8);
  b.writeBigUInt64BE(u64('token', token), 16);
  b.writeUInt32BE(u32('lease', lease), 24);
  b.writeUInt32BE(u32('wait/detail', last), 28);
}

/** Encodes a request frame. */
export function encodeRequest(r: Request): Buffer {
  const key = r.key ?? EMPTY;
  if (key.length > Sizes.MAX_KEY_LEN) throw new RangeError(`key longer than ${Sizes.MAX_KEY_LEN} bytes`);
  const b = Buffer.allocUnsafe(HEADER_SIZE + key.length);
  writeHeader(b, r.op, r.flags ?? 0, key.length, r.id, r.token ?? 0n, r.leaseMs ?? 0, r.waitMs ?? 0);
  b.set(key, HEADER_SIZE);
  return b;
}

/** Encodes a response frame (what a server sends; used by tests and tools). */
export function encodeResponse(r: Omit<Response, 'data'> & { data?: Uint8Array }): Buffer {
  let data = r.data ?? EMPTY;
  if (data.length > Sizes.MAX_KEY_LEN) data = data.subarray(0, Sizes.MAX_KEY_LEN);
  const b = Buffer.allocUnsafe(HEADER_SIZE + data.length);
  writeHeader(b, r.op, r.status, data.length, r.id, r.token, r.leaseMs, r.detail);
  b.set(data, HEADER_SIZE);
  return b;
}

const EMPTY = Buffer.alloc(0);

/**
 * Reports the size (length field included) of the 32-byte-header frame at the start of `b`,
 * or 0 when `b` does not hold all of it yet. Throws {@link FrameError} `length` for a length
 * below the header and `too_large` above `HEADER + maxVar`, before the body is needed.
 */
export function headerFrameSize(b: Uint8Array, maxVar: number = Sizes.MAX_KEY_LEN): number {
  if (b.length < 4) return 0;
  const l = ((b[0]! << 24) >>> 0) + (b[1]! << 16) + (b[2]! << 8) + b[3]!;
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
export function decodeRequest(src: Uint8Array, maxKey: number = Sizes.MAX_KEY_LEN): Request & { size: number } {
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
export function decodeResponse(src: Uint8Array, maxData: number = Sizes.MAX_KEY_LEN): Response & { size: number } {
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

/**
 * Decodes the data of an INSPECT answer: ms since the holder was granted the lock (0 if not held)
 * and ms of lock-delay left. Throws {@link FrameError} `length` when it is shorter than
 * {@link Sizes.INSPECT_DATA} bytes (longer data is allowed, for later additions).
 */
export function decodeInspectData(data: Uint8Array): { heldForMs: number; lockDelayMs: number } {
  if (data.length < Sizes.INSPECT_DATA) throw new FrameError('length', `INSPECT data is ${data.length} bytes, want ${Sizes.INSPECT_DATA}`);
  const b = asBuffer(data);
  return { heldForMs: b.readUInt32BE(0), lockDelayMs: b.readUInt32BE(4) };
}

// ---- Handshake ----

/** HELLO (client -> server). */
export interface Hello {
  version: number;
  /** Reserved; 0. */
  flags?: number;
  /** 16 bytes, random per client, kept across reconnects. */
  sessionId: Uint8Array;
  /** 32 fresh random bytes per connection. */
  nonce: Uint8Array;
}
/** CHALLENGE (server -> client). */
export interface Challenge {
  status: number;
  version: number;
  flags: number;
  nonce: Buffer;
}
/** AUTH (client -> server). */
export interface Auth {
  proof: Uint8Array;
}
/** WELCOME (server -> client). */
export interface Welcome {
  status: number;
  proof: Buffer;
}

function fixedLen(name: string, b: Uint8Array, n: number): Uint8Array {
  if (b.length !== n) throw new RangeError(`${name} must be ${n} bytes, got ${b.length}`);
  return b;
}

export function encodeHello(h: Hello): Buffer {
  const b = Buffer.alloc(Sizes.HELLO);
  b.writeUInt32BE(Sizes.HELLO - 4, 0);
  b[4] = Op.HELLO;
  b[5] = h.version;
  b.writeUInt16BE(h.flags ?? 0, 6);
  b.set(fixedLen('session id', h.sessionId, Sizes.SESSION_ID), 8);
  b.set(fixedLen('nonce', h.nonce, Sizes.NONCE), 24);
  return b;
}

export function encodeChallenge(c: { status: number; version: number; flags: number; nonce: Uint8Array }): Buffer {
  const b = Buffer.alloc(Sizes.CHALLENGE);
  b.writeUInt32BE(Sizes.CHALLENGE - 4, 0);
  b[4] = Op.CHALLENGE;
  b[5] = c.status;
  b[6] = c.version;
  b[7] = c.flags;
  b.set(fixedLen('nonce', c.nonce, Sizes.NONCE), 8);
  return b;
}

export function encodeAuth(a: Auth): Buffer {
  const b = Buffer.alloc(Sizes.AUTH);
  b.writeUInt32BE(Sizes.AUTH - 4, 0);
  b[4] = Op.AUTH;
  b.set(fixedLen('proof', a.proof, Sizes.PROOF), 8);
  return b;
}

export function encodeWelcome(w: { status: number; proof: Uint8Array }): Buffer {
  const b = Buffer.alloc(Sizes.WELCOME);
  b.writeUInt32BE(Sizes.WELCOME - 4, 0);
  b[4] = Op.WELCOME;
  b[5] = w.status;
  b.set(fixedLen('proof', w.proof, Sizes.PROOF), 8);
  return b;
}

function fixedFrame(src: Uint8Array, size: number, op: number): Buffer {
  const b = asBuffer(src);
  if (b.length < 5) throw new FrameError('short', 'incomplete frame');
  if (b.readUInt32BE(0) + 4 !== size || b.length !== size) throw new FrameError('length', `a ${opName(op)} frame is ${size} bytes`);
  if (b[4] !== op) throw new FrameError('wrong_op', `expected ${opName(op)}, got ${opName(b[4]!)}`);
  return b;
}

/** Decodes a HELLO frame occupying exactly `src`. */
export function decodeHello(src: Uint8Array): Required<Hello> {
  const b = fixedFrame(src, Sizes.HELLO, Op.HELLO);
  return { version: b[5]!, flags: b.readUInt16BE(6), sessionId: b.subarray(8, 24), nonce: b.subarray(24, 56) };
}
/** Decodes a CHALLENGE frame occupying exactly `src`. */
export function decodeChallenge(src: Uint8Array): Challenge {
  const b = fixedFrame(src, Sizes.CHALLENGE, Op.CHALLENGE);
  return { status: b[5]!, version: b[6]!, flags: b[7]!, nonce: b.subarray(8, 40) };
}
/** Decodes an AUTH frame occupying exactly `src`. */
export function decodeAuth(src: Uint8Array): Auth {
  const b = fixedFrame(src, Sizes.AUTH, Op.AUTH);
  return { proof: b.subarray(8, 40) };
}
/** Decodes a WELCOME frame occupying exactly `src`. */
export function decodeWelcome(src: Uint8Array): Welcome {
  const b = fixedFrame(src, Sizes.WELCOME, Op.WELCOME);
  return { status: b[5]!, proof: b.subarray(8, 40) };
}

const CLIENT_LABEL = Buffer.from('ticketing/1 client', 'latin1');
const SERVER_LABEL = Buffer.from('ticketing/1 server', 'latin1');

function proof(label: Buffer, token: Uint8Array | string, sessionId: Uint8Array, clientNonce: Uint8Array, serverNonce: Uint8Array): Buffer {
  const key = typeof token === 'string' ? Buffer.from(token, 'utf8') : token;
  return createHmac('sha256', key).update(label).update(sessionId).update(clientNonce).update(serverNonce).digest();
}

/** `HMAC-SHA256(token, "ticketing/1 client" || session id || client nonce || server nonce)`. */
export function clientProof(token: Uint8Array | string, sessionId: Uint8Array, clientNonce: Uint8Array, serverNonce: Uint8Array): Buffer {
  return proof(CLIENT_LABEL, token, sessionId, clientNonce, serverNonce);
}

/** `HMAC-SHA256(token, "ticketing/1 server" || session id || client nonce || server nonce)`. */
export function serverProof(token: Uint8Array | string, sessionId: Uint8Array, clientNonce: Uint8Array, serverNonce: Uint8Array): Buffer {
  return proof(SERVER_LABEL, token, sessionId, clientNonce, serverNonce);
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
 * straddles chunks. A frame's bytes are valid only during the callback.
 */
export class FrameReader {
  #parts: Buffer[] = [];
  #have = 0;
  #need = 0; // size of the frame being gathered in #parts, once its length is known

  constructor(
    private readonly onFrame: (frame: Buffer) => void,
    private readonly maxVar: number = Sizes.MAX_KEY_LEN,
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
    // Every frame is at least a 32-byte header (the handshake frames are 40 bytes).
    if (l < HEADER_SIZE - 4) throw new FrameError('length', `frame length ${l} is below the header`);
    if (l > HEADER_SIZE - 4 + this.maxVar) throw new FrameError('too_large', `frame length ${l} is above the limit`);
    return 4 + l;
  }
}
