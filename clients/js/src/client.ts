/**
 * The Ticketing client: one session over one multiplexed connection (reconnected and resumed
 * when it drops), acquire with FIFO waiting and AbortSignal cancellation, and the {@link Lock}
 * handle.
 *
 * @module
 */
import { EventEmitter } from 'node:events';
import { performance } from 'node:perf_hooks';
import type * as tls from 'node:tls';
import { tryParseEndpoint, type Endpoint } from './connection.js';
import {
  AlreadyHeldError,
  CancelledError,
  ClientClosedError,
  InvalidArgumentError,
  NotAcquiredError,
  ProtocolError,
  TicketingError,
  dataText,
  errorForStatus,
} from './errors.js';
import { Lock, type CallOptions, type LockDone, type LockOwner } from './lock.js';
import type { Reply } from './connection.js';
import { ExpiredReason, FrameError, InspectFlag, Op, Status, decodeInspectData } from './protocol.js';
import { Session, whatText, type Answer, type CallSpec, type OnDone, type What } from './session.js';
import { IntTable } from './table.js';
import {
  boolOption,
  describeKey,
  keyToBytes,
  leaseArg,
  msOption,
  optionsArg,
  signalOption,
  tokenArg,
  waitArg,
  type Key,
} from './validate.js';

/** The endpoint used when none is given. */
export const DEFAULT_ENDPOINT = '127.0.0.1:7070';
/** Default of {@link ClientOptions.connectTimeoutMs}. */
export const DEFAULT_CONNECT_TIMEOUT_MS = 5_000;
/** Default of {@link ClientOptions.requestTimeoutMs}. */
export const DEFAULT_REQUEST_TIMEOUT_MS = 10_000;
/** Default of {@link ClientOptions.heartbeatIntervalMs}. */
export const DEFAULT_HEARTBEAT_INTERVAL_MS = 2_000;
/** Default of {@link ClientOptions.cleanupTimeoutMs}. */
export const DEFAULT_CLEANUP_TIMEOUT_MS = 5_000;
/** Default of {@link ClientOptions.minReconnectDelayMs}. */
export const DEFAULT_MIN_RECONNECT_DELAY_MS = 50;
/** Default of {@link ClientOptions.maxReconnectDelayMs}. */
export const DEFAULT_MAX_RECONNECT_DELAY_MS = 2_000;
/** Default of {@link ClientOptions.maxRedirects}. */
export const DEFAULT_MAX_REDIRECTS = 10;
/** Default of {@link AcquireOptions.leaseMs}. */
export const DEFAULT_LEASE_MS = 30_000;

const CLIENT_OPTIONS = [
  'endpoints',
  'token',
  'tls',
  'connectTimeoutMs',
  'requestTimeoutMs',
  'heartbeatIntervalMs',
  'cleanupTimeoutMs',
  'releaseOnClose',
  'minReconnectDelayMs',
  'maxReconnectDelayMs',
  'maxRedirects',
  'unrefWhileHeld',
] as const;
const ACQUIRE_OPTIONS = ['leaseMs', 'waitTimeoutMs', 'signal', 'timeoutMs', 'keepAlive', 'maxHoldMs', 'refuseHeld', 'throwOnLost'] as const;
const CALL_OPTIONS = ['signal', 'timeoutMs'] as const;
const CONNECT_OPTIONS = ['signal'] as const;
const INSPECT_OPTIONS = ['signal', 'timeoutMs', 'token'] as const;

/** Options of {@link createClient}. Every duration is an integer number of milliseconds; an unknown option is refused. */
export interface ClientOptions {
  /**
   * Server addresses, `host:port` (`[::1]:7070` for IPv6): one string or a list. The client
   * connects to the first that answers, follows leader hints (NOT_LEADER, GOAWAY), and moves to
   * the next one when a connection fails. A cluster's endpoints all serve one lock state.
   * @default '127.0.0.1:7070'
   */
  endpoints?: string | readonly string[];
  /**
   * The shared token. When set, the client proves it holds the token and requires the server to
   * prove the same (mutual HMAC-SHA256); it refuses a server that does not ask for it.
   * @default undefined (no authentication)
   */
  token?: string | Uint8Array;
  /**
   * TLS: `true` for TLS with the system's CAs, or `tls.connect` options: `{ ca }` to trust a
   * private CA, plus `{ cert, key }` for mutual TLS, `servername` to check another name. The
   * server name defaults to the endpoint's host.
   * @default false
   */
  tls?: boolean | tls.ConnectionOptions;
  /**
   * ms allowed for one connection attempt to one endpoint: TCP, TLS and the handshake. Once
   * TCP is connected, TLS and the handshake must also finish within 2000 ms (a frozen node's
   * kernel still accepts connections: the next endpoint is tried instead).
   * @default 5000
   */
  connectTimeoutMs?: number;
  /**
   * ms to wait for any answer (including the time to get a connection), except the time an
   * acquire spends queued: that is bounded by its wait timeout (plus this) and the heartbeat.
   * Overridable per call with `timeoutMs`.
   * @default 10000
   */
  requestTimeoutMs?: number;
  /**
   * After this many ms without receiving anything, send a PING (after at most 250 ms while a
   * request waits for its answer, a queued acquire included). A PING unanswered within
   * min(this, 750) ms gives the connection up (a frozen node, a cut network): the client
   * reconnects and resumes the session; the calls in flight keep waiting, each bounded by its
   * own timeout. For 2 s the node it left is neither dialled nor followed as a leader hint
   * (unless it is the only endpoint), then it is tried last. 0 disables.
   * @default 2000
   */
  heartbeatIntervalMs?: number;
  /**
   * How long an aborted acquire waits for the server's answer to its CANCEL (and the release of
   * a grant that raced it) before it rejects; the clean-up then finishes in the background. Also
   * the most {@link Client.close} waits (with the request timeout, whichever is lower).
   * @default 5000
   */
  cleanupTimeoutMs?: number;
  /**
   * When true, {@link Client.close} releases every lock this client still holds. By default a
   * closed client's locks stay held until their lease ends.
   * @default false
   */
  releaseOnClose?: boolean;
  /**
   * First delay between reconnect rounds (each round tries every endpoint once); it doubles,
   * with jitter, up to {@link ClientOptions.maxReconnectDelayMs}, and is the delay again after a
   * round in which a node answered NOT_LEADER (an election).
   * @default 50
   */
  minReconnectDelayMs?: number;
  /**
   * Longest delay between reconnect rounds.
   * @default 2000
   */
  maxReconnectDelayMs?: number;
  /**
   * How many leader hints (NOT_LEADER) or SHUTTING_DOWN answers one request follows before it
   * reports the error.
   * @default 10
   */
  maxRedirects?: number;
  /**
   * By default a client that holds a lock (or waits for an answer) keeps the Node process
   * alive, as an open socket would: a process that awaits `lock.lost` runs until the lock is
   * released or lost, and never exits silently while the server still holds its lock. `true`
   * lets the process exit while locks are held (they then run out their lease on the server);
   * a call waiting for its answer still keeps it alive. An idle client never keeps it alive.
   * @default false
   */
  unrefWhileHeld?: boolean;
}

/** Options of {@link Client.acquire}. */
export interface AcquireOptions {
  /**
   * The lease in ms: the server reclaims the lock this long after granting it unless it is
   * released or extended. Starts at the grant (for a waiter: at hand-off). 1 .. 2^32-1.
   * @default 30000
   */
  leaseMs?: number;
  /**
   * ms to wait in the key's FIFO queue; `0` tries once. `undefined` (or `Infinity`) waits
   * without limit. When it passes, acquire rejects with {@link NotAcquiredError}.
   * @default undefined (wait without limit)
   */
  waitTimeoutMs?: number;
  /**
   * Aborting it withdraws the acquire (CANCEL) and rejects with {@link CancelledError} (its
   * `cause` is the signal's reason) once the server confirmed, or the cleanup timeout passed.
   * A grant that raced the abort is released: an aborted acquire never leaves a lock held.
   * @default undefined
   */
  signal?: AbortSignal;
  /**
   * ms to wait for the answer, not counting the time spent queued on the server (that is
   * bounded by `waitTimeoutMs`).
   * @default the client's `requestTimeoutMs` (10000)
   */
  timeoutMs?: number;
  /**
   * Keep the lock alive in the background: EXTEND with the lock's lease every lease/3, until it
   * is released or lost (or `maxHoldMs` passes). Continues after a reconnect.
   * @default false
   */
  keepAlive?: boolean;
  /**
   * With `keepAlive`: stop extending this many ms after the grant; the lock then runs out its
   * lease (and the lost signal fires, reason `expired`, unless it is released first).
   * @default undefined (no cap)
   */
  maxHoldMs?: number;
  /**
   * Refuse at once, with {@link AlreadyHeldError}, to acquire a key this client already holds,
   * instead of queueing behind itself (which waits until the first lock is released or expires).
   * @default false
   */
  refuseHeld?: boolean;
  /**
   * Whether the scoped helpers ({@link Client.withLock}, `await using`) throw
   * {@link LockLostError} when the lock was lost while the body ran. `false` lets them return
   * normally (check `lock.isLost` yourself).
   * @default true
   */
  throwOnLost?: boolean;
}

/** Options of {@link Client.tryAcquire}: those of acquire, without a wait. */
export type TryAcquireOptions = Omit<AcquireOptions, 'waitTimeoutMs'>;

/** Options of {@link Client.connect}. */
export interface ConnectOptions {
  /**
   * Aborting it rejects the connect with a {@link CancelledError} (whose `cause` is the signal's
   * reason) at once. A dial already under way finishes in the background, bounded by
   * `connectTimeoutMs`; a connection it makes is kept for later calls.
   * @default undefined
   */
  signal?: AbortSignal;
}

/** Options of {@link Client.inspect}. */
export interface InspectOptions extends CallOptions {
  /**
   * A token to check: the answer then says whether it is the holder's ({@link KeyInfo.tokenMatches}),
   * and shows the holder's token if so.
   * @default undefined
   */
  token?: bigint;
}

/** What the server reports about a key ({@link Client.inspect}), as of the moment it answered. */
export interface KeyInfo {
  /** Somebody holds the key. */
  held: boolean;
  /** The holder's token, shown only to the session that holds it or to a request carrying it; else `null`. */
  token: bigint | null;
  /** ms left on the holder's lease; 0 when not held. */
  leaseRemainingMs: number;
  /** Acquires queued on the key. */
  waiters: number;
  /** ms since the holder was granted the lock; 0 when not held. */
  heldForMs: number;
  /**
   * ms of lock-delay left (the key stays unavailable for a while after an expiry, if the server
   * is set so), or of the server's start-up wait (see {@link KeyInfo.startup}).
   */
  lockDelayRemainingMs: number;
  /** The token given in the options is the holder's. */
  tokenMatches: boolean;
  /** This client's session holds the key. */
  heldByThisClient: boolean;
  /** The key waits for the server's storage before its next grant. */
  stalled: boolean;
  /**
   * The server is in its start-up wait (after a restart, leases granted before it may still
   * run): no key is granted before it ends, in {@link KeyInfo.lockDelayRemainingMs} ms.
   */
  startup: boolean;
}

/** Events of a {@link Client}. */
export interface ClientEvents {
  /** A connection is up (first connect or reconnect), to `endpoint`. */
  connect: [endpoint: string];
  /** The connection dropped; the client reconnects when it has work in flight or locks held. */
  disconnect: [error: TicketingError];
}

/**
 * Creates a client. Nothing is sent until the first call (or {@link Client.connect}).
 * Throws {@link InvalidArgumentError} for a bad option.
 *
 * ```ts
 * const client = await createClient({ endpoints: ['127.0.0.1:7070'] }).connect();
 * ```
 */
export function createClient(options: ClientOptions = {}): Client {
  return new Client(options);
}

function parseEndpoints(v: unknown): Endpoint[] {
  const list = v === undefined ? [DEFAULT_ENDPOINT] : typeof v === 'string' ? [v] : v;
  if (!Array.isArray(list)) throw new InvalidArgumentError(`endpoints must be a "host:port" string or a list of them, got ${typeof v}`);
  if (list.length === 0) throw new InvalidArgumentError('endpoints must not be empty');
  return list.map((s: unknown) => {
    if (typeof s !== 'string') throw new InvalidArgumentError(`each endpoint must be a "host:port" string, got ${typeof s}`);
    const e = tryParseEndpoint(s);
    if (!e) throw new InvalidArgumentError(`invalid endpoint ${JSON.stringify(s)}: want host:port`);
    return e;
  });
}

/** 2^53: the tokens that the {@link IntTable} of {@link LockTable} keys exactly (every token, in practice). */
const SAFE_TOKEN = 0x20000000000000n;

/**
 * The locks held, by token: an {@link IntTable} (a lock added and removed per acquire and
 * release allocates nothing there, unlike a `Map`), and a `Map` for tokens of 2^53 and above,
 * which a number cannot tell apart (never reached in practice: 2^53 grants).
 */
class LockTable {
  readonly #small = new IntTable<Lock>();
  #big: Map<bigint, Lock> | undefined;

  get size(): number {
    return this.#small.size + (this.#big?.size ?? 0);
  }

  get(token: bigint): Lock | undefined {
    return token < SAFE_TOKEN ? this.#small.get(Number(token)) : this.#big?.get(token);
  }

  set(token: bigint, lock: Lock): void {
    if (token < SAFE_TOKEN) this.#small.set(Number(token), lock);
    else (this.#big ??= new Map()).set(token, lock);
  }

  delete(token: bigint): void {
    if (token < SAFE_TOKEN) this.#small.delete(Number(token));
    else this.#big?.delete(token);
  }

  /** The locks, by token (a new array). */
  values(): Lock[] {
    const out = this.#small.values();
    if (this.#big) out.push(...this.#big.values());
    return out;
  }
}

/**
 * A Ticketing client: one session with the server over one multiplexed connection. Safe to
 * share across the whole process; every call may run concurrently (requests are pipelined).
 *
 * The connection is made on first use and remade when it drops: with the same session (resumed
 * within the server's session grace), so requests in flight are re-sent with their ids and
 * answered once, and waiters keep their queue places. If the server restarted meanwhile (another
 * state id), every lock of this client is lost (reason `server restarted`) and requests in flight
 * fail with {@link ServerRestartedError}; nothing is re-sent.
 *
 * An idle client does not keep the Node process alive. A call waiting for its answer, or a
 * lock held, does (as an open socket would), unless `unrefWhileHeld` is set for held locks.
 * Close it with {@link Client.close} (graceful, bounded: queued acquires are withdrawn) or
 * {@link Client.destroy} (at once), or `await using`. Closing does not release held locks
 * unless `releaseOnClose` is set.
 */
export class Client extends EventEmitter<ClientEvents> implements LockOwner {
  readonly #session: Session;
  readonly #requestTimeoutMs: number;
  readonly #cleanupTimeoutMs: number;
  readonly #releaseOnClose: boolean;
  readonly #unrefWhileHeld: boolean;
  /** Locks held (not released, not lost), by token. */
  readonly #locks = new LockTable();
  #closing: Promise<void> | undefined;
  #closed = false;

  /** Use {@link createClient}. Throws {@link InvalidArgumentError} for a bad option. */
  constructor(options: ClientOptions = {}) {
    super();
    const o = optionsArg<ClientOptions>('client options', options, CLIENT_OPTIONS);
    const endpoints = parseEndpoints(o.endpoints);
    let token: Buffer | undefined;
    if (o.token !== undefined) {
      if (typeof o.token === 'string') token = Buffer.from(o.token, 'utf8');
      else if (o.token instanceof Uint8Array) token = Buffer.from(o.token);
      else throw new InvalidArgumentError(`token must be a string or a Uint8Array, got ${typeof o.token}`);
      if (token.length === 0) throw new InvalidArgumentError('token must not be empty');
    }
    let tlsOptions: tls.ConnectionOptions | undefined;
    if (o.tls === true) tlsOptions = {};
    else if (o.tls === undefined || o.tls === false) tlsOptions = undefined;
    else if (typeof o.tls === 'object' && o.tls !== null) tlsOptions = o.tls;
    else throw new InvalidArgumentError(`tls must be a boolean or tls.connect options, got ${typeof o.tls}`);
    this.#requestTimeoutMs = msOption('requestTimeoutMs', o.requestTimeoutMs ?? DEFAULT_REQUEST_TIMEOUT_MS, 1);
    this.#cleanupTimeoutMs = msOption('cleanupTimeoutMs', o.cleanupTimeoutMs ?? DEFAULT_CLEANUP_TIMEOUT_MS, 1);
    this.#releaseOnClose = boolOption('releaseOnClose', o.releaseOnClose, false);
    this.#unrefWhileHeld = boolOption('unrefWhileHeld', o.unrefWhileHeld, false);
    const minBackoffMs = msOption('minReconnectDelayMs', o.minReconnectDelayMs ?? DEFAULT_MIN_RECONNECT_DELAY_MS, 1);
    const maxBackoffMs = msOption('maxReconnectDelayMs', o.maxReconnectDelayMs ?? DEFAULT_MAX_RECONNECT_DELAY_MS, minBackoffMs);
    const maxRedirects = o.maxRedirects ?? DEFAULT_MAX_REDIRECTS;
    if (!Number.isInteger(maxRedirects) || maxRedirects < 0 || maxRedirects > 1000) {
      throw new InvalidArgumentError(`maxRedirects must be an integer from 0 to 1000, got ${String(maxRedirects)}`);
    }
    this.#session = new Session(
      {
        endpoints,
        token,
        tls: tlsOptions,
        connectTimeoutMs: msOption('connectTimeoutMs', o.connectTimeoutMs ?? DEFAULT_CONNECT_TIMEOUT_MS, 1),
        heartbeatMs: msOption('heartbeatIntervalMs', o.heartbeatIntervalMs ?? DEFAULT_HEARTBEAT_INTERVAL_MS, 0),
        requestTimeoutMs: this.#requestTimeoutMs,
        cleanupTimeoutMs: this.#cleanupTimeoutMs,
        minBackoffMs,
        maxBackoffMs,
        maxRedirects,
      },
      {
        onPush: (r) => this.#onPush(r),
        onRestarted: () => {
          for (const lock of [...this.#locks.values()]) lock.markLost('server restarted');
        },
        holdsLocks: () => this.#locks.size > 0,
        onConnect: (ep) => this.emit('connect', ep),
        onDisconnect: (err) => this.emit('disconnect', err),
      },
    );
  }

  /** This client's 16-byte session id (a copy). It changes when the server restarted. */
  get sessionId(): Buffer {
    return Buffer.from(this.#session.sessionId);
  }

  /** True while a connection is up. */
  get isConnected(): boolean {
    return this.#session.isConnected;
  }

  /** `host:port` of the connected server, or `undefined`. */
  get endpoint(): string | undefined {
    return this.#session.endpoint;
  }

  /**
   * Connects now, if not connected yet: tries every endpoint once. Resolves with the client.
   * Rejects with {@link UnavailableError} (also a server that does not answer the handshake
   * within the connect timeout), {@link TlsError}, {@link AuthFailedError}, {@link UnsupportedVersionError},
   * {@link BusyError} or {@link ShuttingDownError}. Calls connect on demand, so this is optional.
   *
   * Before the first connection, a round in which a node answered NOT_LEADER (a cluster electing
   * a leader) is not a failure yet: connect tries again at the shortest reconnect delay until
   * `requestTimeoutMs` has passed since it began (then it rejects with the last round's
   * {@link UnavailableError}), or until {@link Client.close} / {@link Client.destroy}, or until
   * `signal` aborts ({@link CancelledError}).
   */
  async connect(options: ConnectOptions = {}): Promise<this> {
    const o = optionsArg<ConnectOptions>('connect options', options, CONNECT_OPTIONS);
    const signal = signalOption(o.signal);
    this.#checkOpen('connect');
    await this.#session.connect(signal);
    return this;
  }

  /**
   * Acquires `key`, waiting in its FIFO queue up to `waitTimeoutMs`. Resolves with the
   * {@link Lock}. Rejects with {@link NotAcquiredError} when the wait timeout passes,
   * {@link CancelledError} when `signal` aborts, {@link AlreadyHeldError} with `refuseHeld`,
   * {@link InvalidArgumentError} for a bad argument (before anything is sent),
   * {@link TimeoutError}, {@link ConnectionLostError}, {@link ServerRestartedError},
   * {@link BusyError}, {@link ShuttingDownError}, {@link ClientClosedError}. An acquire that
   * fails any way but a server answer is withdrawn and never leaves a lock held.
   *
   * Acquiring a key this client already holds queues behind itself (the owner is the token, so
   * two tasks sharing a client exclude each other); pass `refuseHeld: true` to refuse instead.
   */
  acquire(key: Key, options: AcquireOptions = {}): Promise<Lock> {
    return this.#acquire(key, options, false) as Promise<Lock>;
  }

  /**
   * Acquires `key` only if it is free now (a wait of 0). Resolves with the {@link Lock}, or
   * `null` when the key is taken; rejects as {@link Client.acquire} does otherwise.
   */
  tryAcquire(key: Key, options: TryAcquireOptions = {}): Promise<Lock | null> {
    return this.#acquire(key, options, true);
  }

  /**
   * acquire, or with `once` tryAcquire (a wait of 0; null where acquire rejects with
   * {@link NotAcquiredError}). Not an async function: the answer settles the returned promise
   * from the session's callback, without a second promise and its hop, and the lock is
   * registered (for EXPIRED notices) before the next frame of the same read is handled.
   */
  #acquire(key: Key, options: AcquireOptions, once: boolean): Promise<Lock | null> {
    let spec: CallSpec;
    let keyBytes: Buffer;
    let lease: number;
    let wait: number;
    let signal: AbortSignal | undefined;
    let keepAlive: boolean;
    let maxHoldMs: number;
    let throwOnLost: boolean;
    try {
      const o = optionsArg<AcquireOptions>(once ? 'tryAcquire options' : 'acquire options', options, ACQUIRE_OPTIONS);
      if (once && o.waitTimeoutMs !== undefined) throw new InvalidArgumentError('tryAcquire takes no waitTimeoutMs (it never waits); use acquire');
      keyBytes = keyToBytes(key);
      lease = leaseArg('leaseMs', o.leaseMs ?? DEFAULT_LEASE_MS);
      wait = once ? 0 : waitArg('waitTimeoutMs', o.waitTimeoutMs);
      signal = signalOption(o.signal);
      const timeoutMs = o.timeoutMs === undefined ? this.#requestTimeoutMs : msOption('timeoutMs', o.timeoutMs, 1);
      keepAlive = boolOption('keepAlive', o.keepAlive, false);
      maxHoldMs = o.maxHoldMs === undefined ? 0 : msOption('maxHoldMs', o.maxHoldMs, 1);
      const refuseHeld = boolOption('refuseHeld', o.refuseHeld, false);
      throwOnLost = boolOption('throwOnLost', o.throwOnLost, true);
      // The request's name in messages, made only when one is needed (from the key as it is now).
      const shown = typeof key === 'string' ? key : keyBytes;
      const what = (): string => `acquire ${describeKey(shown)}`;
      if (this.#closing) this.#checkOpen(what());
      if (refuseHeld) {
        for (const held of this.#locks.values()) {
          if (held.keyBytes.equals(keyBytes)) throw new AlreadyHeldError(`${what()}: this client already holds it (token ${held.token}) and refuseHeld is set`);
        }
      }
      if (signal?.aborted) throw new CancelledError(`${what()}: cancelled before it was sent`, { cause: signal.reason });
      spec = { op: Op.ACQUIRE, key: keyBytes, token: 0n, leaseMs: lease, waitMs: wait, what, timeoutMs };
    } catch (err) {
      return Promise.reject(err);
    }
    return new Promise<Lock | null>((resolve, reject) => {
      let onAbort: (() => void) | undefined;
      // Runs once, synchronously, where the call settles (see OnDone): it must not throw.
      const done: OnDone = (call, a, err) => {
        if (onAbort) signal!.removeEventListener('abort', onAbort);
        if (a === undefined) return reject(err);
        try {
          const res = a.res;
          if (res.status === Status.OK) {
            if (signal?.aborted) {
              // The grant arrived, but the caller had already given up: give it back.
              const cancelled = new CancelledError(`${call.what}: cancelled (the grant that raced the cancel was released)`, { cause: signal.reason });
              this.#session.releaseToken(keyBytes, res.token, call.what, () => reject(cancelled));
              return;
            }
            const lock = new Lock(this, {
              key: typeof key === 'string' ? key : Buffer.from(keyBytes),
              keyBytes,
              token: res.token,
              leaseMs: lease,
              grantedMs: res.leaseMs || lease,
              detailMs: res.detail,
              queuedMs: a.retried ? 0 : res.detail,
              tFirst: a.tFirst,
              keepAlive,
              maxHoldMs,
              throwOnLost,
              keepProcessAlive: !this.#unrefWhileHeld && !this.#closing,
            });
            this.#locks.set(lock.token, lock);
            return resolve(lock);
          }
          if (res.status === Status.TIMED_OUT) {
            if (once) return resolve(null);
            // The server says why when it has a reason beyond the wait (its start-up wait).
            const why = dataText(res.data);
            const msg = why
              ? `${call.what}: not acquired${wait === 0 ? '' : ` within the wait timeout (${wait} ms)`}: ${why}`
              : wait === 0
                ? `${call.what}: not acquired: the key is taken`
                : `${call.what}: not acquired within the wait timeout (${wait} ms)`;
            return reject(new NotAcquiredError(msg, { detail: res.detail }));
          }
          if (res.status === Status.NOT_HELD && a.retried) {
            if (once) return resolve(null);
            return reject(new NotAcquiredError(`${call.what}: not acquired: the lock was granted while the connection was down and has ended since`, { status: Status.NOT_HELD }));
          }
          const e = errorForStatus(res.status, res.detail, res.data, call.what);
          if (once && e instanceof NotAcquiredError) return resolve(null);
          reject(e);
        } catch (e) {
          reject(e);
        }
      };
      const call = this.#session.request(spec, done);
      if (signal && !call.settled) {
        onAbort = (): void => this.#session.abandon(call, new CancelledError(`${call.what}: cancelled`, { cause: signal!.reason }), true);
        signal.addEventListener('abort', onAbort, { once: true });
      }
    });
  }

  /**
   * Runs `fn` while holding `key`, then releases it, even if `fn` throws. If the lock was lost
   * while `fn` ran, rejects with {@link LockLostError} after `fn` finished (unless
   * `throwOnLost: false`); `lock.signal` aborts the moment it is lost, for work that can stop.
   * An error thrown by `fn` wins over a failed release.
   */
  withLock<T>(key: Key, fn: (lock: Lock) => Promise<T> | T): Promise<T>;
  withLock<T>(key: Key, options: AcquireOptions, fn: (lock: Lock) => Promise<T> | T): Promise<T>;
  async withLock<T>(key: Key, a: AcquireOptions | ((lock: Lock) => Promise<T> | T), b?: (lock: Lock) => Promise<T> | T): Promise<T> {
    const fn = typeof a === 'function' ? a : b;
    const options = typeof a === 'function' ? {} : a;
    if (typeof fn !== 'function') throw new InvalidArgumentError('withLock needs a function to run');
    const lock = await this.acquire(key, options);
    let result: T;
    try {
      result = await fn(lock);
    } catch (err) {
      await lock[Symbol.asyncDispose]().catch(() => {});
      throw err;
    }
    await lock[Symbol.asyncDispose]();
    return result;
  }

  /**
   * Releases `key` held with `token` (any client may release a token it was given). Rejects with
   * {@link NotHeldError} if `token` is not the current holder; nothing changes then.
   */
  async release(key: Key, token: bigint, options?: CallOptions): Promise<void> {
    const keyBytes = keyToBytes(key);
    const t = tokenArg(token);
    const what = `release ${describeKey(key)} token ${t}`;
    if (this.#closed) throw new ClientClosedError(`${what}: the client is closed`);
    const { res } = await this.#call({ op: Op.RELEASE, key: keyBytes, token: t, what }, options);
    const handle = this.#handle(keyBytes, t);
    if (res.status === Status.OK) handle?.markReleased();
    else if (res.status === Status.NOT_HELD) handle?.markLost('not held');
    if (res.status !== Status.OK) throw errorForStatus(res.status, res.detail, res.data, what);
  }

  /**
   * Sets the lease of `key` held with `token` to `leaseMs` from now. Resolves with the lease
   * granted; rejects with {@link NotHeldError} if `token` is not the current holder.
   */
  async extend(key: Key, token: bigint, leaseMs: number, options?: CallOptions): Promise<number> {
    const keyBytes = keyToBytes(key);
    const t = tokenArg(token);
    const lease = leaseArg('leaseMs', leaseMs);
    const what = `extend ${describeKey(key)} token ${t}`;
    this.#checkOpen(what);
    const { res, id, tFirst } = await this.#call({ op: Op.EXTEND, key: keyBytes, token: t, leaseMs: lease, what }, options);
    const handle = this.#handle(keyBytes, t);
    if (res.status === Status.NOT_HELD) handle?.markLost('not held');
    if (res.status !== Status.OK) throw errorForStatus(res.status, res.detail, res.data, what);
    handle?.markExtended(id, tFirst, res.leaseMs || lease, lease);
    return res.leaseMs || lease;
  }

  /**
   * What the server knows about `key` now (see {@link KeyInfo}). Changes nothing; for operators
   * and tests, not for deciding whether to acquire (the answer is stale the moment it arrives).
   */
  async inspect(key: Key, options: InspectOptions = {}): Promise<KeyInfo> {
    const o = optionsArg<InspectOptions>('inspect options', options, INSPECT_OPTIONS);
    const keyBytes = keyToBytes(key);
    const token = o.token === undefined ? 0n : tokenArg(o.token);
    const what = `inspect ${describeKey(key)}`;
    this.#checkOpen(what);
    const { res } = await this.#call({ op: Op.INSPECT, key: keyBytes, token, what }, { signal: o.signal, timeoutMs: o.timeoutMs });
    return keyInfo(res, what);
  }

  /** A round trip to the server; resolves with the time it took, in ms. */
  async ping(options?: CallOptions): Promise<number> {
    this.#checkOpen('ping');
    const t = performance.now();
    const { res } = await this.#call({ op: Op.PING, what: 'ping' }, options);
    if (res.status !== Status.OK) throw errorForStatus(res.status, res.detail, res.data, 'ping');
    return performance.now() - t;
  }

  /**
   * Closes gracefully, in bounded time: new calls reject with {@link ClientClosedError};
   * keep-alives stop; acquires still waiting (queued on the server) reject at once with
   * {@link ClientClosedError} and are withdrawn from the server (CANCEL; a grant that raced the
   * withdrawal is released), so a closed client is never granted a lock; with
   * `releaseOnClose`, every held lock is released; answers in flight and the withdrawals are
   * awaited, at most `min(cleanupTimeoutMs, requestTimeoutMs)`; then the connection closes.
   * Without `releaseOnClose`, locks still held stay held on the server until their lease ends.
   */
  close(): Promise<void> {
    if (this.#closing) return this.#closing;
    this.#closing = (async () => {
      for (const lock of this.#locks.values()) lock.clientClosing();
      for (const call of this.#session.waitingAcquires()) {
        this.#session.abandon(call, new ClientClosedError(`${call.what}: the client was closed; the queued acquire was withdrawn`), false);
      }
      if (this.#releaseOnClose) {
        for (const lock of [...this.#locks.values()]) lock.release().catch(() => {});
      }
      await this.#session.close(Math.min(this.#cleanupTimeoutMs, this.#requestTimeoutMs));
      this.#closed = true;
    })();
    return this.#closing;
  }

  /** Closes at once: every call in flight rejects with {@link ClientClosedError}. Locks stay held until their lease ends. */
  destroy(): void {
    this.#closing ??= Promise.resolve();
    this.#closed = true;
    for (const lock of this.#locks.values()) lock.clientClosing();
    this.#session.destroy();
  }

  /** `await using client = createClient(...)` closes it gracefully at the end of the block. */
  async [Symbol.asyncDispose](): Promise<void> {
    await this.close();
  }

  // ---- LockOwner ----

  /** @internal */
  lockRequest(lock: Lock, op: number, leaseMs: number, what: What, options: CallOptions | undefined): Promise<Answer> {
    if (this.#closed || (this.#closing && op !== Op.RELEASE)) return Promise.reject(new ClientClosedError(`${whatText(what)}: the client is closed`));
    if (options === undefined) {
      // The common case: no signal, the client's timeout; nothing to check, nothing to wait on here.
      return this.#session.request({ op, key: lock.keyBytes, token: lock.token, leaseMs, waitMs: 0, what, timeoutMs: this.#requestTimeoutMs }).promise;
    }
    return this.#call({ op, key: lock.keyBytes, token: lock.token, leaseMs, what }, options);
  }

  /** @internal */
  lockCall(lock: Lock, op: number, what: What, options: CallOptions | undefined, done: LockDone): void {
    if (options !== undefined || this.#closed || this.#closing) {
      // The uncommon cases (a signal or timeout of its own, a closing client): through the promise.
      this.lockRequest(lock, op, 0, what, options).then(
        (a) => done(undefined, a),
        (err: unknown) => done(undefined, undefined, err),
      );
      return;
    }
    this.#session.request({ op, key: lock.keyBytes, token: lock.token, leaseMs: 0, waitMs: 0, what, timeoutMs: this.#requestTimeoutMs }, done);
  }

  /** @internal */
  forget(lock: Lock): void {
    if (this.#locks.get(lock.token) === lock) this.#locks.delete(lock.token);
  }

  /** @internal */
  releaseInBackground(lock: Lock, what: string): void {
    if (this.#closed) return;
    this.#session.releaseToken(lock.keyBytes, lock.token, what);
  }

  // ---- internals ----

  #checkOpen(what: string): void {
    if (this.#closing) throw new ClientClosedError(`${what}: the client is ${this.#closed ? 'closed' : 'closing'}`);
  }

  /** Sends a request and resolves with its answer (any status); `signal` and `timeoutMs` as in {@link CallOptions}. */
  async #call(spec: Omit<CallSpec, 'timeoutMs'>, options: CallOptions | undefined): Promise<Answer> {
    const o = optionsArg<CallOptions>('call options', options, CALL_OPTIONS);
    const signal = signalOption(o.signal);
    const timeoutMs = o.timeoutMs === undefined ? this.#requestTimeoutMs : msOption('timeoutMs', o.timeoutMs, 1);
    if (signal?.aborted) throw new CancelledError(`${whatText(spec.what)}: cancelled before it was sent`, { cause: signal.reason });
    const call = this.#session.request({ ...spec, timeoutMs });
    if (!signal) return call.promise;
    const onAbort = (): void => this.#session.drop(call, new CancelledError(`${call.what}: cancelled`, { cause: signal.reason }));
    signal.addEventListener('abort', onAbort, { once: true });
    try {
      return await call.promise;
    } finally {
      signal.removeEventListener('abort', onAbort);
    }
  }

  /** This client's handle of the lock `key` held with `token`, if it has one. */
  #handle(key: Buffer, token: bigint): Lock | undefined {
    const lock = this.#locks.get(token);
    return lock && lock.keyBytes.equals(key) ? lock : undefined;
  }

  #onPush(r: Reply): void {
    if (r.op !== Op.EXPIRED) return; // an unknown push: ignored (PROTOCOL.md, Compatibility)
    this.#handle(r.data, r.token)?.markLost(r.detail === ExpiredReason.STOPPING ? 'server stopping' : 'expired');
  }
}

function keyInfo(res: Reply, what: string): KeyInfo {
  if (res.status !== Status.OK) throw errorForStatus(res.status, res.detail, res.data, what);
  let d: { heldForMs: number; lockDelayMs: number; flags: number };
  try {
    d = decodeInspectData(res.data);
  } catch (err) {
    if (err instanceof FrameError) throw new ProtocolError(`${what}: ${err.message}`, { cause: err });
    throw err;
  }
  return {
    held: (d.flags & InspectFlag.HELD) !== 0,
    token: res.token === 0n ? null : res.token,
    leaseRemainingMs: res.leaseMs,
    waiters: res.detail,
    heldForMs: d.heldForMs,
    lockDelayRemainingMs: d.lockDelayMs,
    tokenMatches: (d.flags & InspectFlag.TOKEN_MATCH) !== 0,
    heldByThisClient: (d.flags & InspectFlag.SESSION) !== 0,
    stalled: (d.flags & InspectFlag.STALLED) !== 0,
    startup: (d.flags & InspectFlag.STARTUP) !== 0,
  };
}
