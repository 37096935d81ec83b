/**
 * The Ticketing client: one multiplexed connection, endpoint failover, acquire with FIFO
 * waiting and AbortSignal cancellation, and the {@link Lock} handle.
 *
 * @module
 */
import { randomBytes } from 'node:crypto';
import { EventEmitter } from 'node:events';
import { performance } from 'node:perf_hooks';
import type * as tls from 'node:tls';
import { Connection, formatEndpoint, parseEndpoint, type Endpoint } from './connection.js';
import {
  CancelledError,
  ClientClosedError,
  ConnectionLostError,
  NotAcquiredError,
  ProtocolError,
  TicketingError,
  errorForStatus,
} from './errors.js';
import { Lock, type Key, type LockOwner } from './lock.js';
import { FrameError, Op, Sizes, Status, decodeInspectData, type Request, type Response } from './protocol.js';

/** Options of {@link createClient}. */
export interface ClientOptions {
  /**
   * Server addresses, `host:port` (`[::1]:7070` for IPv6). The client connects to the first that
   * answers, follows NOT_LEADER hints, and moves to the next one on SHUTTING_DOWN or when a
   * connection fails.
   * @default ['127.0.0.1:7070']
   */
  endpoints?: string[];
  /**
   * The shared token. When set, the client proves it holds the token and requires the server to
   * prove the same (mutual HMAC-SHA256); it refuses a server that does not ask for it.
   * @default undefined (no authentication)
   */
  token?: string | Uint8Array;
  /**
   * TLS: `true` for TLS with the system's CAs, or `tls.connect` options (for example
   * `{ ca: fs.readFileSync('ca.pem') }`). The server name defaults to the endpoint's host.
   * @default false
   */
  tls?: boolean | tls.ConnectionOptions;
  /**
   * ms allowed for one connection attempt: TCP, TLS and the handshake.
   * @default 5000
   */
  connectTimeout?: number;
  /**
   * How many times a request is retried on another endpoint after NOT_LEADER or SHUTTING_DOWN
   * (with a short backoff while no leader is known).
   * @default 10
   */
  maxRedirects?: number;
}

/** Options of {@link Client.acquire}. */
export interface AcquireOptions {
  /**
   * The lease in ms: the server reclaims the lock this long after granting it unless it is
   * released or extended. Starts at the grant (for a waiter: at hand-off).
   * @default 30000
   */
  lease?: number;
  /**
   * ms to wait in the key's FIFO queue; `0` tries once. `undefined` (or `Infinity`) waits
   * without limit. When it passes, acquire rejects with {@link NotAcquiredError}.
   * @default undefined (wait forever)
   */
  waitTimeout?: number;
  /**
   * Aborting it withdraws the waiting acquire (CANCEL) and rejects with the signal's reason. If
   * the server granted the lock anyway, the client releases that token: an aborted acquire never
   * leaves a lock held.
   * @default undefined
   */
  signal?: AbortSignal;
  /**
   * Keep the lock alive in the background: `true` extends it by `lease` every `lease / 3` ms; a
   * number sets that interval in ms. Stops the moment the lock is released or lost.
   * @default false
   */
  keepAlive?: boolean | number;
}

/** Options of {@link Client.inspect}. */
export interface InspectOptions {
  /**
   * Aborting it rejects the call with the signal's reason; the server's answer, when it comes,
   * is dropped (INSPECT changes nothing, so nothing needs undoing).
   * @default undefined
   */
  signal?: AbortSignal;
}

/** What the server reports about a key ({@link Client.inspect}), as of the moment it answered. */
export interface KeyInfo {
  /** The holder's fencing token, or `null` when nobody holds the key. */
  token: bigint | null;
  /** ms left on the holder's lease; 0 when not held. */
  leaseRemainingMs: number;
  /** Acquires queued on the key. */
  waiters: number;
  /** ms since the holder was granted the lock; 0 when not held. */
  heldForMs: number;
  /** ms of lock-delay left (a server may keep a key unavailable for a while after a lease expiry); 0 when none. */
  lockDelayRemainingMs: number;
}

/** The default lease of {@link Client.acquire}, ms. */
export const DEFAULT_LEASE_MS = 30_000;
/** The default connect timeout, ms. */
export const DEFAULT_CONNECT_TIMEOUT_MS = 5_000;
/** The default endpoint. */
export const DEFAULT_ENDPOINT = '127.0.0.1:7070';

const MAX_LEASE = 0xffffffff;

/** Creates a client. Call {@link Client.connect} (or just make a call: it connects on demand). */
export function createClient(options: ClientOptions = {}): Client {
  return new Client(options);
}

interface Waiting {
  conn: Connection;
  id: bigint;
  /** Settles the acquire with `reason` and withdraws it. */
  abort(reason: unknown): void;
}

/**
 * A Ticketing client. One connection carries every request, pipelined; answers are matched by
 * request id. If the connection drops, requests in flight reject with
 * {@link ConnectionLostError} and the next call reconnects (trying the endpoints in order).
 * Locks held survive a reconnect: they stay held until released or their lease ends.
 *
 * Events: `'connect'` (endpoint `host:port`), `'disconnect'` (the error).
 */
export class Client extends EventEmitter implements LockOwner {
  /** The 16-byte session id sent in every HELLO; kept across reconnects. */
  readonly sessionId: Buffer = randomBytes(Sizes.SESSION_ID);

  readonly #endpoints: Endpoint[];
  readonly #token: Buffer | undefined;
  readonly #tls: tls.ConnectionOptions | undefined;
  readonly #connectTimeout: number;
  readonly #maxRedirects: number;

  #nextId = 1n;
  #conn: Connection | undefined;
  #connecting: Promise<Connection> | undefined;
  #preferred = 0; // index of the endpoint to try first
  #leaderHint: Endpoint | undefined;
  #state: 'open' | 'closing' | 'closed' = 'open';
  #closing: Promise<void> | undefined;
  readonly #locks = new Map<bigint, Lock>(); // by token, for EXPIRED notices
  readonly #waiting = new Set<Waiting>(); // acquires in flight
  readonly #inflight = new Set<Promise<unknown>>(); // every exchange, for a graceful close

  constructor(options: ClientOptions = {}) {
    super();
    const eps = options.endpoints ?? [DEFAULT_ENDPOINT];
    if (eps.length === 0) throw new TypeError('endpoints must not be empty');
    this.#endpoints = eps.map(parseEndpoint);
    this.#token = options.token === undefined ? undefined : Buffer.from(typeof options.token === 'string' ? Buffer.from(options.token, 'utf8') : options.token);
    if (this.#token?.length === 0) throw new TypeError('token must not be empty');
    this.#tls = options.tls === true ? {} : options.tls ? options.tls : undefined;
    this.#connectTimeout = positive('connectTimeout', options.connectTimeout ?? DEFAULT_CONNECT_TIMEOUT_MS);
    this.#maxRedirects = options.maxRedirects ?? 10;
  }

  /** The endpoint of the live connection (`host:port`), or undefined. */
  get endpoint(): string | undefined {
    return this.#conn?.ready ? this.#conn.name : undefined;
  }

  /** True while a connection is up. */
  get isConnected(): boolean {
    return this.#conn?.ready === true;
  }

  /**
   * Connects (if not connected): tries the endpoints in order until one completes the handshake.
   * Rejects with the error of a fatal answer ({@link AuthFailedError},
   * {@link UnsupportedVersionError}) or, when no endpoint could be reached, a
   * {@link ConnectionLostError} whose `cause` is the last failure.
   */
  async connect(): Promise<this> {
    await this.#connection();
    return this;
  }

  /**
   * Acquires `key`: granted at once if it is free, else waits its turn in the key's FIFO queue.
   * Resolves with the {@link Lock}; rejects with {@link NotAcquiredError} when `waitTimeout`
   * passes, with the signal's reason when `signal` aborts, and with other
   * {@link TicketingError}s for the server's other answers.
   */
  acquire(key: Key, options: AcquireOptions = {}): Promise<Lock> {
    try {
      return this.#acquire(key, options);
    } catch (err) {
      return Promise.reject(err); // bad arguments reject too, never throw synchronously
    }
  }

  #acquire(key: Key, options: AcquireOptions): Promise<Lock> {
    const keyBytes = keyToBytes(key);
    const lease = leaseMs(options.lease ?? DEFAULT_LEASE_MS);
    const wait = options.waitTimeout;
    if (wait !== undefined && (typeof wait !== 'number' || Number.isNaN(wait) || wait < 0)) throw new RangeError(`waitTimeout must be >= 0 ms, got ${wait}`);
    const ka = options.keepAlive;
    const keepAliveMs = ka === true ? Math.max(1, Math.floor(lease / 3)) : typeof ka === 'number' && ka > 0 ? Math.max(1, Math.floor(ka)) : 0;
    const signal = options.signal;
    if (signal?.aborted) return Promise.reject(signal.reason);
    if (this.#state !== 'open') return Promise.reject(new ClientClosedError());
    const what = `acquire ${describeKey(key)}`;
    const id = this.#newId();
    const start = performance.now();

    return new Promise<Lock>((resolve, reject) => {
      let settled = false;
      let waiting: Waiting | undefined;
      const abort = (reason: unknown): void => {
        if (settled) return;
        settled = true;
        reject(reason);
        if (waiting) this.#cancel(waiting);
      };
      const onAbort = (): void => abort(signal!.reason);
      signal?.addEventListener('abort', onAbort, { once: true });

      const make = (): Request => {
        let waitMs: number = Sizes.WAIT_FOREVER;
        if (wait !== undefined && wait !== Infinity) {
          const left = wait === 0 ? 0 : Math.max(0, Math.ceil(wait - (performance.now() - start)));
          waitMs = Math.min(left, Sizes.WAIT_FOREVER - 1);
        }
        return { op: Op.ACQUIRE, id, leaseMs: lease, waitMs, key: keyBytes };
      };
      const exchange = this.#exchange(what, make, {
        stop: () => settled || this.#state !== 'open',
        sent: (conn) => {
          waiting = { conn, id, abort };
          this.#waiting.add(waiting);
        },
        answered: () => {
          if (waiting) this.#waiting.delete(waiting);
          waiting = undefined;
        },
      });
      exchange.then(
        ({ res, tSend }) => {
          signal?.removeEventListener('abort', onAbort);
          if (res.status !== Status.OK) {
            if (!settled) {
              settled = true;
              const timedOut = wait === 0 ? `${what}: not acquired (the key is held)` : `${what}: not acquired within ${wait} ms`;
              reject(res.status === Status.TIMED_OUT ? new NotAcquiredError(timedOut) : errorForStatus(res.status, res.detail, res.data, what));
            }
            return;
          }
          if (settled) {
            // Aborted (or closed) while the grant was on its way: give the lock back at once.
            this.#releaseToken(keyBytes, res.token);
            return;
          }
          settled = true;
          const lock = new Lock(this, { key, keyBytes, token: res.token, leaseMs: res.leaseMs || lease, queuedMs: res.detail, tSend, keepAliveMs });
          this.#locks.set(lock.token, lock);
          resolve(lock);
        },
        (err: unknown) => {
          signal?.removeEventListener('abort', onAbort);
          if (!settled) {
            settled = true;
            reject(err);
          }
        },
      );
    });
  }

  /** Acquires `key` only if it is free now (`waitTimeout: 0`); rejects with {@link NotAcquiredError} otherwise. */
  tryAcquire(key: Key, options: Omit<AcquireOptions, 'waitTimeout'> = {}): Promise<Lock> {
    return this.acquire(key, { ...options, waitTimeout: 0 });
  }

  /**
   * Runs `fn` while holding `key`, then releases it (even if `fn` throws). `lock.signal` aborts if
   * the lock is lost while `fn` runs.
   */
  async withLock<T>(key: Key, options: AcquireOptions, fn: (lock: Lock) => Promise<T> | T): Promise<T> {
    const lock = await this.acquire(key, options);
    let ok = false;
    let result: T;
    try {
      result = await fn(lock);
      ok = true;
    } finally {
      if (ok) await lock[Symbol.asyncDispose]();
      else await lock[Symbol.asyncDispose]().catch(() => {});
    }
    return result!;
  }

  /**
   * Releases `key` held with `token` (any client may release a token it was given). Rejects
   * with {@link NotHeldError} if `token` is not the current holder; nothing changes then.
   */
  async release(key: Key, token: bigint): Promise<void> {
    this.#ensureNotClosed();
    const keyBytes = keyToBytes(key);
    const { res } = await this.#exchange(`release ${describeKey(key)}`, () => ({ op: Op.RELEASE, id: this.#newId(), token, key: keyBytes }));
    this.#check(res, `release ${describeKey(key)}`);
  }

  /**
   * Sets the lease of `key` held with `token` to `leaseMs` from now. Resolves with the lease
   * granted; rejects with {@link NotHeldError} if `token` is not the current holder.
   */
  async extend(key: Key, token: bigint, leaseMs: number): Promise<number> {
    this.#ensureNotClosed();
    const r = await this.#extend(keyToBytes(key), describeKey(key), token, leaseMs);
    return r.leaseMs;
  }

  /**
   * What the server knows about `key` now: the holder's token (`null` when nobody holds it), the
   * lease left, the acquires queued, how long it has been held, and the lock-delay left. Changes
   * nothing; for operators and tests, not for deciding whether to acquire (the answer is stale
   * the moment it arrives). Aborting `signal` rejects with the signal's reason.
   */
  async inspect(key: Key, options: InspectOptions = {}): Promise<KeyInfo> {
    this.#ensureNotClosed();
    const keyBytes = keyToBytes(key);
    const signal = options.signal;
    if (signal?.aborted) throw signal.reason;
    const what = `inspect ${describeKey(key)}`;
    const exchange = this.#exchange(what, () => ({ op: Op.INSPECT, id: this.#newId(), key: keyBytes }), { stop: () => signal?.aborted === true });
    const { res } = await (signal ? abortable(exchange, signal) : exchange);
    this.#check(res, what);
    let data: { heldForMs: number; lockDelayMs: number };
    try {
      data = decodeInspectData(res.data);
    } catch (err) {
      if (err instanceof FrameError) throw new ProtocolError(`${what}: ${err.message}`, { cause: err });
      throw err;
    }
    return {
      token: res.token === 0n ? null : res.token,
      leaseRemainingMs: res.leaseMs,
      waiters: res.detail,
      heldForMs: data.heldForMs,
      lockDelayRemainingMs: data.lockDelayMs,
    };
  }

  /** Round trip to the server; resolves with the time it took, ms. */
  async ping(): Promise<number> {
    this.#ensureNotClosed();
    const t = performance.now();
    const { res } = await this.#exchange('ping', () => ({ op: Op.PING, id: this.#newId() }));
    this.#check(res, 'ping');
    return performance.now() - t;
  }

  /**
   * Closes gracefully: new acquires reject with {@link ClientClosedError}, acquires still waiting
   * are withdrawn (they reject with {@link CancelledError}; one granted meanwhile is released),
   * keep-alives stop, answers in flight are awaited (releases sent meanwhile still go through),
   * then the connection closes. Locks still held are not released: they stay held until their
   * lease ends (release them first).
   */
  close(): Promise<void> {
    if (this.#closing) return this.#closing;
    if (this.#state === 'closed') return Promise.resolve();
    this.#state = 'closing';
    this.#closing = (async () => {
      for (const lock of this.#locks.values()) lock.stopKeepAlive();
      for (const w of [...this.#waiting]) w.abort(new CancelledError('acquire withdrawn: the client is closing'));
      while (this.#inflight.size > 0) await Promise.allSettled([...this.#inflight]);
      await this.#connecting?.catch(() => {});
      const conn = this.#conn;
      this.#state = 'closed';
      this.#conn = undefined;
      if (conn) await conn.drain();
    })();
    return this.#closing;
  }

  /** Closes at once: every request in flight rejects with {@link ClientClosedError}. Locks stay held until their lease ends. */
  destroy(): void {
    this.#state = 'closed';
    for (const lock of this.#locks.values()) lock.stopKeepAlive();
    const conn = this.#conn;
    this.#conn = undefined;
    conn?.destroy(new ClientClosedError('the client was destroyed'));
  }

  /** `await using client = await createClient(...).connect()` closes it gracefully. */
  async [Symbol.asyncDispose](): Promise<void> {
    await this.close();
  }

  // ---- LockOwner ----

  /** @internal */
  async releaseLock(lock: Lock): Promise<void> {
    await this.release(lock.keyBytes, lock.token);
  }

  /** @internal */
  extendLock(lock: Lock, leaseMs: number): Promise<{ tSend: number; leaseMs: number }> {
    return this.#extend(lock.keyBytes, describeKey(lock.key), lock.token, leaseMs);
  }

  /** @internal */
  forget(lock: Lock): void {
    if (this.#locks.get(lock.token) === lock) this.#locks.delete(lock.token);
  }

  // ---- internals ----

  async #extend(keyBytes: Buffer, k: string, token: bigint, leaseMs_: number): Promise<{ tSend: number; leaseMs: number }> {
    const lease = leaseMs(leaseMs_);
    const what = `extend ${k}`;
    const { res, tSend } = await this.#exchange(what, () => ({ op: Op.EXTEND, id: this.#newId(), token, leaseMs: lease, key: keyBytes }));
    this.#check(res, what);
    return { tSend, leaseMs: res.leaseMs || lease };
  }

  get #closed(): boolean {
    return this.#state === 'closed';
  }

  #ensureNotClosed(): void {
    if (this.#state === 'closed') throw new ClientClosedError();
  }

  #check(res: Response, what: string): void {
    if (res.status !== Status.OK) throw errorForStatus(res.status, res.detail, res.data, what);
  }

  #newId(): bigint {
    const id = this.#nextId;
    this.#nextId = id === 0xffffffffffffffffn ? 1n : id + 1n;
    return id;
  }

  /**
   * Sends a request (built by `make` for each attempt) and resolves with its answer and the
   * monotonic time it was sent. Retries on another endpoint after NOT_LEADER or SHUTTING_DOWN;
   * every other answer is returned as is.
   */
  #exchange(
    what: string,
    make: () => Request,
    hooks: { stop?: () => boolean; sent?: (conn: Connection) => void; answered?: () => void } = {},
  ): Promise<{ res: Response; tSend: number }> {
    const p = (async () => {
      let redirected: Response | undefined; // the NOT_LEADER / SHUTTING_DOWN answer that moved us
      for (let attempt = 0; ; attempt++) {
        let conn: Connection;
        try {
          conn = await this.#connection();
        } catch (err) {
          // No endpoint to move to: the server's answer says more than the connect failure.
          if (redirected && err instanceof ConnectionLostError && !(err instanceof ClientClosedError)) {
            throw errorForStatus(redirected.status, redirected.detail, redirected.data, what, err);
          }
          throw err;
        }
        if (hooks.stop?.()) throw new ClientClosedError(`${what}: stopped`);
        const req = make();
        const tSend = performance.now();
        const pending = conn.request(req);
        hooks.sent?.(conn);
        let res: Response;
        try {
          res = await pending;
        } finally {
          hooks.answered?.();
        }
        if (res.status !== Status.NOT_LEADER && res.status !== Status.SHUTTING_DOWN) return { res, tSend };
        if (attempt >= this.#maxRedirects || hooks.stop?.() || this.#state === 'closed') return { res, tSend };
        redirected = res;
        const hint = res.status === Status.NOT_LEADER ? res.data.toString('utf8') : '';
        this.#moveOff(conn, hint);
        if (!hint) await sleep(Math.min(1000, 25 * 2 ** attempt));
      }
    })();
    this.#inflight.add(p);
    const done = (): void => void this.#inflight.delete(p);
    p.then(done, done);
    return p;
  }

  /** Leaves `conn` (after NOT_LEADER / SHUTTING_DOWN): to `hint` if given, else the next endpoint. */
  #moveOff(conn: Connection, hint: string): void {
    if (this.#conn === conn) {
      this.#conn = undefined;
      void conn.drain();
    }
    if (hint) {
      try {
        this.#leaderHint = parseEndpoint(hint);
        return;
      } catch {
        // fall through to the next endpoint
      }
    }
    const i = this.#endpoints.findIndex((e) => e.host === conn.endpoint.host && e.port === conn.endpoint.port);
    this.#preferred = ((i >= 0 ? i : this.#preferred) + 1) % this.#endpoints.length;
  }

  /** The live connection, connecting first if needed. */
  #connection(): Promise<Connection> {
    if (this.#state === 'closed') return Promise.reject(new ClientClosedError());
    if (this.#conn?.ready) return Promise.resolve(this.#conn);
    if (!this.#connecting) {
      this.#connecting = this.#dial().finally(() => (this.#connecting = undefined));
    }
    return this.#connecting;
  }

  async #dial(): Promise<Connection> {
    const order: Endpoint[] = [];
    if (this.#leaderHint) order.push(this.#leaderHint);
    this.#leaderHint = undefined;
    const n = this.#endpoints.length;
    for (let k = 0; k < n; k++) order.push(this.#endpoints[(this.#preferred + k) % n]!);
    let last: unknown;
    for (const ep of order) {
      if (this.#closed) throw new ClientClosedError();
      try {
        const conn = await Connection.open({
          endpoint: ep,
          sessionId: this.sessionId,
          token: this.#token,
          tls: this.#tls,
          connectTimeout: this.#connectTimeout,
        });
        if (this.#closed) {
          conn.destroy(new ClientClosedError());
          throw new ClientClosedError();
        }
        const i = this.#endpoints.findIndex((e) => e.host === ep.host && e.port === ep.port);
        if (i >= 0) this.#preferred = i;
        conn.onExpired = (token, key) => this.#onExpired(token, key);
        conn.onClose = (err) => {
          if (this.#conn === conn) this.#conn = undefined;
          this.emit('disconnect', err);
        };
        this.#conn = conn;
        this.emit('connect', conn.name);
        return conn;
      } catch (err) {
        last = err;
        if (err instanceof TicketingError && (err.status === Status.AUTH_FAILED || err.status === Status.UNSUPPORTED_VERSION)) throw err;
        if (err instanceof ClientClosedError) throw err;
      }
    }
    // A server's answer (BUSY, SHUTTING_DOWN) says more than a wrapper would.
    if (last instanceof TicketingError && !(last instanceof ConnectionLostError)) throw last;
    const names = order.map(formatEndpoint).join(', ');
    const why = last instanceof Error ? `: ${last.message}` : '';
    throw new ConnectionLostError(`could not connect to ${names}${why}`, { cause: last });
  }

  #onExpired(token: bigint, key: Buffer): void {
    const lock = this.#locks.get(token);
    if (lock && lock.keyBytes.equals(key)) lock.markLost('expired');
  }

  /** Withdraws a waiting acquire. Its answer (CANCELLED, or OK to be released) still arrives. */
  #cancel(w: Waiting): void {
    if (!w.conn.ready) return; // the connection is gone: the server dropped the waiter with it
    w.conn.request({ op: Op.CANCEL, id: this.#newId(), token: w.id }).catch(() => {});
  }

  /** Releases a token nobody will ever see (an aborted acquire that was granted anyway). */
  #releaseToken(keyBytes: Buffer, token: bigint): void {
    const conn = this.#conn;
    const p = conn?.ready
      ? conn.request({ op: Op.RELEASE, id: this.#newId(), token, key: keyBytes })
      : this.#state === 'open'
        ? this.#exchange('release', () => ({ op: Op.RELEASE, id: this.#newId(), token, key: keyBytes }))
        : Promise.resolve();
    const tracked = p.then(
      () => {},
      () => {}, // the lease will reclaim it
    );
    this.#inflight.add(tracked);
    void tracked.then(() => this.#inflight.delete(tracked));
  }
}

/** Converts a key to its bytes, checking the protocol's bounds. */
function keyToBytes(key: Key): Buffer {
  let b: Buffer;
  if (typeof key === 'string') b = Buffer.from(key, 'utf8');
  else if (key instanceof Uint8Array) b = Buffer.from(key); // a copy: the caller may reuse its buffer
  else throw new TypeError('key must be a string or a Uint8Array');
  if (b.length === 0) throw new RangeError('key must not be empty');
  if (b.length > Sizes.MAX_KEY_LEN) throw new RangeError(`key longer than ${Sizes.MAX_KEY_LEN} bytes`);
  return b;
}

function leaseMs(v: number): number {
  if (typeof v !== 'number' || !Number.isFinite(v) || v < 1 || v > MAX_LEASE) throw new RangeError(`lease must be 1..${MAX_LEASE} ms, got ${v}`);
  return Math.ceil(v);
}

function positive(name: string, v: number): number {
  if (typeof v !== 'number' || !(v > 0)) throw new RangeError(`${name} must be > 0, got ${v}`);
  return v;
}

function describeKey(key: Key): string {
  return typeof key === 'string' ? JSON.stringify(key) : `0x${Buffer.from(key).toString('hex')}`;
}

/** Settles as `p` does, or rejects with the signal's reason once `signal` aborts (`p`'s outcome is then dropped). */
function abortable<T>(p: Promise<T>, signal: AbortSignal): Promise<T> {
  return new Promise<T>((resolve, reject) => {
    const onAbort = (): void => reject(signal.reason);
    signal.addEventListener('abort', onAbort, { once: true });
    p.then(
      (v) => {
        signal.removeEventListener('abort', onAbort);
        resolve(v);
      },
      (err: unknown) => {
        signal.removeEventListener('abort', onAbort);
        reject(err);
      },
    );
  });
}

function sleep(ms: number): Promise<void> {
  return new Promise((r) => setTimeout(r, ms));
}
