/**
 * Argument checks, made before anything is sent, and the way keys appear in messages.
 *
 * @module
 * @internal
 */
import { InvalidArgumentError } from './errors.js';
import { Sizes } from './protocol.js';

/** A lock key: a string (sent as UTF-8) or raw bytes. */
export type Key = string | Uint8Array;

/** The largest lease the wire can carry, ms (`2^32 - 1`). */
export const MAX_LEASE_MS = 0xffffffff;
/** The largest finite wait timeout, ms (`2^32 - 2`; `2^32 - 1` means "without limit" on the wire). */
export const MAX_WAIT_MS = Sizes.WAIT_FOREVER - 1;

function show(v: unknown): string {
  if (typeof v === 'string') return JSON.stringify(v.length > 40 ? `${v.slice(0, 40)}...` : v);
  if (typeof v === 'bigint') return `${v}n`;
  if (v === null) return 'null';
  if (Array.isArray(v)) return 'an array';
  if (typeof v === 'object') return `an object (${Object.prototype.toString.call(v).slice(8, -1)})`;
  return String(v);
}

/** The key's bytes (a copy), after checking it is a non-empty string or Uint8Array of at most 65,535 bytes. */
export function keyToBytes(key: unknown): Buffer {
  let b: Buffer;
  if (typeof key === 'string') b = Buffer.from(key, 'utf8');
  else if (key instanceof Uint8Array) b = Buffer.from(key); // a copy: the caller may reuse its buffer
  else throw new InvalidArgumentError(`key must be a string or a Uint8Array, got ${show(key)}`);
  if (b.length === 0) throw new InvalidArgumentError('key must not be empty');
  if (b.length > Sizes.MAX_KEY_LEN) throw new InvalidArgumentError(`key is ${b.length} bytes, longer than the protocol's ${Sizes.MAX_KEY_LEN}`);
  return b;
}

const utf8 = new TextDecoder('utf-8', { fatal: true });

/** How much of a key a message shows, in bytes (as the Go client). */
export const MAX_KEY_IN_MESSAGE = 64;

function decodeUtf8(b: Uint8Array): string | undefined {
  try {
    return utf8.decode(b);
  } catch {
    return undefined;
  }
}

/**
 * A key for messages: its text in quotes when it is valid UTF-8, else `0x` and its hex. A key
 * longer than {@link MAX_KEY_IN_MESSAGE} bytes is cut there (never inside a character), with
 * its length: `"kkkk"…(300 bytes)`. A message never echoes a whole long key.
 */
export function describeKey(key: Uint8Array | string): string {
  const bytes = typeof key === 'string' ? Buffer.from(key, 'utf8') : Buffer.from(key.buffer, key.byteOffset, key.byteLength);
  const text = typeof key === 'string' ? key : decodeUtf8(bytes);
  let cut = bytes.subarray(0, MAX_KEY_IN_MESSAGE);
  let shown: string;
  if (text !== undefined) {
    let t = decodeUtf8(cut);
    while (t === undefined && cut.length > MAX_KEY_IN_MESSAGE - 3) {
      cut = cut.subarray(0, cut.length - 1); // do not split a character
      t = decodeUtf8(cut);
    }
    shown = JSON.stringify(t ?? cut.toString('utf8'));
  } else {
    shown = `0x${cut.toString('hex')}`;
  }
  return cut.length < bytes.length ? `${shown}…(${bytes.length} bytes)` : shown;
}

/** A lease: an integer number of milliseconds in 1 .. 2^32-1. */
export function leaseArg(name: string, v: unknown): number {
  if (typeof v !== 'number' || !Number.isInteger(v) || v < 1 || v > MAX_LEASE_MS) {
    const hint = typeof v === 'number' && v > 0 && v < 1 ? ' (the unit is milliseconds)' : '';
    throw new InvalidArgumentError(`${name} must be an integer number of milliseconds from 1 to ${MAX_LEASE_MS}, got ${show(v)}${hint}`);
  }
  return v;
}

/** A wait timeout: `undefined`, `null` or `Infinity` for "without limit", else an integer number of ms `>= 0`. Returns the wire value. */
export function waitArg(name: string, v: unknown): number {
  if (v === undefined || v === null || v === Infinity) return Sizes.WAIT_FOREVER;
  if (typeof v !== 'number' || !Number.isInteger(v) || v < 0 || v > MAX_WAIT_MS) {
    throw new InvalidArgumentError(`${name} must be an integer number of milliseconds from 0 to ${MAX_WAIT_MS}, or undefined to wait without limit, got ${show(v)}`);
  }
  return v;
}

/** A duration option in ms: an integer `>= min` (and `<= 2^31-1`, the timer limit). */
export function msOption(name: string, v: unknown, min: number): number {
  if (typeof v !== 'number' || !Number.isInteger(v) || v < min || v > 0x7fffffff) {
    throw new InvalidArgumentError(`${name} must be an integer number of milliseconds from ${min} to ${0x7fffffff}, got ${show(v)}`);
  }
  return v;
}

/** A fencing token: a bigint in 1 .. 2^64-1. */
export function tokenArg(v: unknown): bigint {
  if (typeof v !== 'bigint') {
    throw new InvalidArgumentError(`token must be a bigint (convert a decimal string with BigInt(s)), got ${show(v)}`);
  }
  if (v < 1n || v > 0xffffffffffffffffn) throw new InvalidArgumentError(`token must be in 1 .. 2^64-1, got ${v}`);
  return v;
}

/** A boolean option (`undefined` is `dflt`). */
export function boolOption(name: string, v: unknown, dflt: boolean): boolean {
  if (v === undefined) return dflt;
  if (typeof v !== 'boolean') throw new InvalidArgumentError(`${name} must be a boolean, got ${show(v)}`);
  return v;
}

/** An `AbortSignal` option, or undefined. */
export function signalOption(v: unknown): AbortSignal | undefined {
  if (v === undefined) return undefined;
  if (typeof v !== 'object' || v === null || typeof (v as AbortSignal).aborted !== 'boolean' || typeof (v as AbortSignal).addEventListener !== 'function') {
    throw new InvalidArgumentError(`signal must be an AbortSignal, got ${show(v)}`);
  }
  return v as AbortSignal;
}

/** Option names of earlier versions, and what they are called now. */
const RENAMED: Record<string, string> = {
  lease: 'leaseMs',
  waitTimeout: 'waitTimeoutMs',
  timeout: 'timeoutMs',
  connectTimeout: 'connectTimeoutMs',
  requestTimeout: 'requestTimeoutMs',
  heartbeatInterval: 'heartbeatIntervalMs',
  cleanupTimeout: 'cleanupTimeoutMs',
  maxHold: 'maxHoldMs',
  endpoint: 'endpoints',
};

/**
 * The options object itself: undefined or a plain object whose keys are all in `known` (an
 * unknown key is refused, so that a misspelt or renamed option, such as `lease` for `leaseMs`,
 * never silently falls back to a default).
 */
export function optionsArg<T extends object>(name: string, v: unknown, known: readonly string[]): Partial<T> {
  if (v === undefined) return {};
  if (typeof v !== 'object' || v === null || Array.isArray(v)) throw new InvalidArgumentError(`${name} must be an object, got ${show(v)}`);
  // for-in, not Object.keys: no array per call (an own-property check keeps Object.keys' meaning).
  for (const k in v) {
    if (known.includes(k) || !Object.hasOwn(v, k)) continue;
    const hint = RENAMED[k] && known.includes(RENAMED[k]) ? ` (did you mean ${RENAMED[k]}? durations are integer milliseconds)` : '';
    throw new InvalidArgumentError(`unknown option ${JSON.stringify(k)} in ${name}${hint}; known: ${known.join(', ')}`);
  }
  return v as Partial<T>;
}
