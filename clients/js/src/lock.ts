/**
 * A held lock: its key and fencing token, release, extend and verify, the lost signal, and the
 * opt-in keep-alive.
 *
 * @module
 */
import { EventEmitter } from 'node:events';
import { performance } from 'node:perf_hooks';
import { clock } from './clock.js';
import { LockLostError, NotHeldError, ProtocolError, errorForStatus, type LostReason } from './errors.js';
import { ClientRules, InspectFlag, Op, Status, decodeInspectData } from './protocol.js';
import type { Answer, Call, What } from './session.js';
import { describeKey, leaseArg, type Key } from './validate.js';

// Node 20 may lack Symbol.asyncDispose; Node itself uses this registered symbol.
(Symbol as { asyncDispose?: symbol }).asyncDispose ??= Symbol.for('nodejs.asyncDispose');

/** Per-call options: cancellation and a timeout. */
export interface CallOptions {
  /**
   * Aborting it rejects the call with a {@link CancelledError} (whose `cause` is the signal's
   * reason). The request may still reach the server: a release or extend may still happen.
   * @default undefined
   */
  signal?: AbortSignal;
  /**
   * ms to wait for the answer (including the time to get a connection).
   * @default the client's `requestTimeoutMs` (10000)
   */
  timeoutMs?: number;
}

/** @internal How a lock's request ends: with its answer, or with the error when none came (the call is not always given). */
export type LockDone = (call: Call | undefined, a: Answer | undefined, err?: unknown) => void;

/** @internal What a {@link Lock} needs from its client. */
export interface LockOwner {
  /** Sends a request about this lock; rejects only when no answer came (timeout, closed, connection lost). */
  lockRequest(lock: Lock, op: number, leaseMs: number, what: What, options: CallOptions | undefined): Promise<Answer>;
  /**
   * The same for a request without a lease (a RELEASE), ending in `done` instead of a promise:
   * called once, possibly before lockCall returns (a closed client), and never throwing into it.
   */
  lockCall(lock: Lock, op: number, what: What, options: CallOptions | undefined, done: LockDone): void;
  /** The lock is released or lost: it no longer needs EXPIRED notices. */
  forget(lock: Lock): void;
  /** Tells the server, in the background and best effort, to release a lock known lost (nobody waits for the answer). */
  releaseInBackground(lock: Lock, what: string): void;
}

/** @internal How a {@link Lock} was granted. */
export interface LockGrant {
  key: Key;
  keyBytes: Buffer;
  token: bigint;
  /** The lease asked for (what extend and keep-alive use). */
  leaseMs: number;
  /** The answer's lease_ms: the lease now running (ms left, for a retried acquire). */
  grantedMs: number;
  /** The answer's detail: ms from the ACQUIRE's first arrival to the instant `grantedMs` counts from. */
  detailMs: number;
  /** What {@link Lock.queuedMs} shows: `detailMs`, or 0 for a retried acquire. */
  queuedMs: number;
  /** When the ACQUIRE was first written, on the deadline clock (clock.ts). */
  tFirst: number;
  keepAlive: boolean;
  /** Keep-alive stops this long after the grant; 0: never. */
  maxHoldMs: number;
  throwOnLost: boolean;
  /** The lost timer keeps the Node process alive while the lock is held (the client option `unrefWhileHeld` is false). */
  keepProcessAlive: boolean;
}

/** `1 − 2ρ`: the share of a server-side duration the client can count on (PROTOCOL.md, "The lost signal"). */
export const CLOCK_RATE_FACTOR = 1 - (2 * ClientRules.CLOCK_RATE_BOUND_PPM) / 1_000_000;

/**
 * The local deadline, in the clock of `tFirst`: `tFirst + (detailMs + leaseMs)·(1 − 2ρ)`, where
 * `tFirst` is when the request was first sent (a re-send after a reconnect keeps it), and
 * `detailMs` and `leaseMs` the `detail` and `lease_ms` of its `ACQUIRE OK`, whichever
 * transmission it answers. For an EXTEND, `detailMs` is 0.
 */
export function localDeadline(tFirst: number, detailMs: number, leaseMs: number): number {
  return tFirst + (detailMs + leaseMs) * CLOCK_RATE_FACTOR;
}

/** How long before the local deadline the lost signal fires: `min(5 ms, lease / 10)`, for timer latency. */
export function lostMargin(leaseMs: number): number {
  return Math.min(ClientRules.LOST_MARGIN_MS, leaseMs / 10);
}

const LOST_TEXT: Record<LostReason, string> = {
  expired: 'its lease expired',
  'not held': 'the server no longer holds this token',
  'server restarted': 'the server restarted and forgot it',
  'server stopping': 'the server is stopping',
};

/**
 * A lock held on a key. Release it with {@link Lock.release}, or let `await using` do it:
 *
 * ```ts
 * await using lock = await client.acquire('order-1234', { leaseMs: 10_000 });
 * await db.update(order, { fencingToken: lock.token });
 * ```
 *
 * The lock is *lost* at the first of: its local deadline (`deadline − min(5 ms, lease/10)`, see
 * {@link Lock.deadline}), the server's EXPIRED notice, a NOT_HELD answer to {@link Lock.extend}
 * or {@link Lock.release}, or a reconnect that finds the server restarted. Then
 * {@link Lock.lost} resolves, the `'lost'` event fires, {@link Lock.signal} aborts, and every
 * {@link Lock.onLost} callback runs, once. A lock released successfully is never reported lost.
 *
 * `token` is a `bigint`: `JSON.stringify` throws on it, so send it as a decimal string
 * (`lock.token.toString()`) and read it back with `BigInt(s)`.
 */
export class Lock extends EventEmitter {
  /** The key, as given to acquire. */
  readonly key: Key;
  /** The fencing token: strictly increasing across every grant of the server (or cluster). A `bigint`; in JSON, send `token.toString()`. */
  readonly token: bigint;
  /** ms the acquire spent waiting in the queue (0 when the grant came in answer to a retry after a reconnect). */
  readonly queuedMs: number;
  /**
   * Resolves (never rejects) with a {@link LockLostError} when the lock is lost. Stays pending
   * forever if the lock is released first. While the lock is held its client keeps the Node
   * process alive (the lost timer is ref'd, as an open socket would be), so a process that
   * awaits it runs until the lock is lost or released, never exits silently while the server
   * still holds the lock; the client option `unrefWhileHeld: true` opts out, and a closed
   * client's locks no longer keep the process alive.
   */
  get lost(): Promise<LockLostError> {
    // Made on first use: most locks are released without anyone awaiting their loss.
    this.#lost ??= this.#lostError ? Promise.resolve(this.#lostError) : new Promise((resolve) => (this.#resolveLost = resolve));
    return this.#lost;
  }

  /** @internal */
  readonly keyBytes: Buffer;
  readonly #owner: LockOwner;
  #leaseMs: number;
  /** The local deadline, and when the lost signal fires (min(5 ms, lease/10) before it), on the deadline clock. */
  #deadline = 0;
  #lostAt = 0;
  /** The request id of the EXTEND whose answer set the deadline (0: the grant's). */
  #extendId = 0;
  /** The lock's place in {@link Lock.#heap} (-1: not there: released, lost, or not yet armed). */
  #heapIndex = -1;
  /** The lock counts in {@link Lock.#refs}. */
  #refCounted = false;
  #lost: Promise<LockLostError> | undefined;
  #keepAlive: boolean;
  #keepAliveTimer: NodeJS.Timeout | undefined;
  readonly #keepAliveUntil: number;
  readonly #throwOnLost: boolean;
  #released = false;
  #lostError: LockLostError | undefined;
  #resolveLost: ((e: LockLostError) => void) | undefined;
  #abort: AbortController | undefined;
  #releasing: Promise<void> | undefined;
  /** The lost timer keeps the process alive (the lock is held and the client is open). */
  #keepProcessAlive: boolean;
  /** A RELEASE of the lock known lost went out in the background already. */
  #releaseSent = false;

  /** @internal Created by the client. */
  constructor(owner: LockOwner, g: LockGrant) {
    super();
    this.#owner = owner;
    this.key = g.key;
    this.keyBytes = g.keyBytes;
    this.token = g.token;
    this.queuedMs = g.queuedMs;
    this.#leaseMs = g.leaseMs;
    this.#keepAlive = g.keepAlive;
    this.#keepAliveUntil = g.maxHoldMs > 0 ? performance.now() + g.maxHoldMs : Infinity;
    this.#throwOnLost = g.throwOnLost;
    this.#keepProcessAlive = g.keepProcessAlive;
    this.#setDeadline(localDeadline(g.tFirst, g.detailMs, g.grantedMs), g.grantedMs);
    if (this.#keepAlive) this.#scheduleKeepAlive();
  }

  /** The lease in ms that extend and keep-alive ask for (the lease given to acquire, or the last extend). */
  get leaseMs(): number {
    return this.#leaseMs;
  }

  /**
   * The local deadline as epoch milliseconds (comparable with `Date.now()`): the server's lease
   * cannot end before it, allowing for clock-rate differences of up to 0.1% on either side. The
   * lost signal fires `min(5 ms, lease/10)` before it, unless the lock is extended first. Like the
   * server's lease, it counts the time the host spends suspended.
   */
  get deadline(): number {
    return performance.timeOrigin + this.#deadline;
  }

  /** ms left until {@link Lock.deadline} (0 once passed). */
  get remainingMs(): number {
    return Math.max(0, this.#deadline - clock.exactNow());
  }

  /** True once the lock is lost (and was not released first). */
  get isLost(): boolean {
    this.#check();
    return this.#lostError !== undefined;
  }

  /** Why the lock was lost, or `undefined` while it is not. */
  get lostReason(): LostReason | undefined {
    this.#check();
    return this.#lostError?.reason;
  }

  /** True once a release succeeded. */
  get isReleased(): boolean {
    return this.#released;
  }

  /** True while the lock is held as far as this client knows: neither released nor lost. */
  get isHeld(): boolean {
    this.#check();
    return !this.#released && !this.#lostError;
  }

  /** An AbortSignal that aborts, with the {@link LockLostError} as reason, when the lock is lost. Pass it to the work the lock protects. */
  get signal(): AbortSignal {
    this.#check();
    if (!this.#abort) {
      this.#abort = new AbortController();
      if (this.#lostError) this.#abort.abort(this.#lostError);
    }
    return this.#abort.signal;
  }

  /**
   * Calls `cb` once when the lock is lost (at once, asynchronously, if it already is). Returns a
   * function that unsubscribes.
   */
  onLost(cb: (err: LockLostError) => void): () => void {
    this.#check();
    if (this.#lostError) {
      const e = this.#lostError;
      let on = true;
      queueMicrotask(() => on && cb(e));
      return () => (on = false);
    }
    this.once('lost', cb);
    return () => this.off('lost', cb);
  }

  /** Listens for `'lost'` (fired once, with the {@link LockLostError}). */
  override on(event: 'lost', listener: (err: LockLostError) => void): this;
  override on(event: string | symbol, listener: (...args: any[]) => void): this;
  override on(event: string | symbol, listener: (...args: any[]) => void): this {
    return super.on(event, listener);
  }

  /** Listens once for `'lost'`. */
  override once(event: 'lost', listener: (err: LockLostError) => void): this;
  override once(event: string | symbol, listener: (...args: any[]) => void): this;
  override once(event: string | symbol, listener: (...args: any[]) => void): this {
    return super.once(event, listener);
  }

  /**
   * Releases the lock: the next waiter gets it at once. Stops the keep-alive first. Calling it
   * again while it runs returns the same promise; after it succeeded, it resolves at once.
   *
   * Rejects with {@link LockLostError} if the lock was lost before: at once, without waiting
   * for the server (reachable or not), for the work done under the lock may not have been
   * protected. The RELEASE still goes to the server in the background (it may not have
   * reclaimed the lock yet, and the next waiter need not wait for the lease), unless the lock
   * was lost to a restarted server or a NOT_HELD answer: nothing is left to release then. Also
   * rejects with {@link LockLostError} when the server answers NOT_HELD (the lock is then lost,
   * reason `not held`: you never release somebody else's lock). Rejects with
   * {@link TimeoutError}, {@link ConnectionLostError} or {@link ClientClosedError} when the
   * outcome is unknown: the lock may still be held until its lease ends, and release may be
   * called again.
   */
  release(options?: CallOptions): Promise<void> {
    if (this.#released) return Promise.resolve();
    if (this.#releasing) return this.#releasing;
    this.#check();
    this.#stopKeepAlive();
    const what = (): string => `release ${describe(this)}`;
    if (this.#lostError) {
      const reason = this.#lostError.reason;
      if (!this.#releaseSent && reason !== 'server restarted' && reason !== 'not held') {
        this.#releaseSent = true;
        this.#owner.releaseInBackground(this, what());
      }
      return Promise.reject(this.#lostFor(what()));
    }
    // Not an async function: the answer settles the promise from the session's callback (one
    // promise per release, no hop). The callback may run before lockCall returns (a closed client).
    let settled = false;
    const p = new Promise<void>((resolve, reject) => {
      this.#owner.lockCall(this, Op.RELEASE, what, options, (_call, a, err) => {
        settled = true;
        this.#releasing = undefined;
        try {
          if (a === undefined) {
            if (this.#lostError) return reject(this.#lostFor(what(), err));
            if (this.#keepAlive) this.#scheduleKeepAlive();
            return reject(err);
          }
          const { res } = a;
          if (res.status === Status.OK && !this.#lostError) {
            this.markReleased();
            return resolve();
          }
          if (res.status === Status.OK || res.status === Status.NOT_HELD) {
            this.markLost('not held');
            return reject(this.#lostFor(what(), res.status === Status.NOT_HELD ? errorForStatus(res.status, res.detail, res.data, what()) : undefined));
          }
          if (this.#keepAlive && this.isHeld) this.#scheduleKeepAlive();
          reject(errorForStatus(res.status, res.detail, res.data, what()));
        } catch (e) {
          reject(e);
        }
      });
    });
    if (!settled) this.#releasing = p;
    return p;
  }

  /**
   * Sets the lease to `leaseMs` from now (it may shorten it); defaults to the lease now asked
   * for. Moves the local deadline and resolves with the lease granted. Rejects with
   * {@link LockLostError} if the lock is lost (nothing is sent) or the server answers NOT_HELD
   * (the lock is then lost, reason `not held`), and with {@link NotHeldError} once released.
   */
  async extend(leaseMs: number = this.#leaseMs, options?: CallOptions): Promise<number> {
    const what = `extend ${describe(this)}`;
    const lease = leaseArg('leaseMs', leaseMs);
    this.#check();
    if (this.#lostError) throw this.#lostFor(what);
    if (this.#released) throw new NotHeldError(`${what}: the lock was released`);
    let a: Answer;
    try {
      a = await this.#owner.lockRequest(this, Op.EXTEND, lease, what, options);
    } catch (err) {
      if (this.#lostError) throw this.#lostFor(what, err);
      throw err;
    }
    const { res } = a;
    if (res.status === Status.OK) {
      if (this.#lostError) throw this.#lostFor(what);
      if (this.#released) throw new NotHeldError(`${what}: the lock was released`);
      const granted = res.leaseMs || lease;
      this.markExtended(a.id, a.tFirst, granted, lease);
      return granted;
    }
    if (res.status === Status.NOT_HELD) {
      this.markLost('not held');
      throw this.#lostFor(what, errorForStatus(res.status, res.detail, res.data, what));
    }
    throw errorForStatus(res.status, res.detail, res.data, what);
  }

  /**
   * Asks the server whether this token still holds the key (INSPECT with the token): true when
   * it does. Changes nothing, and does not fire the lost signal by itself.
   */
  async verify(options?: CallOptions): Promise<boolean> {
    const what = `verify ${describe(this)}`;
    const { res } = await this.#owner.lockRequest(this, Op.INSPECT, 0, what, options);
    if (res.status !== Status.OK) throw errorForStatus(res.status, res.detail, res.data, what);
    try {
      return (decodeInspectData(res.data).flags & InspectFlag.TOKEN_MATCH) !== 0;
    } catch (err) {
      throw new ProtocolError(`${what}: ${(err as Error).message}`, { cause: err });
    }
  }

  /**
   * `await using lock = ...` releases it at the end of the block. If the lock was lost meanwhile
   * this throws the {@link LockLostError} (after telling the server), unless the acquire option
   * `throwOnLost` was `false`.
   */
  async [Symbol.asyncDispose](): Promise<void> {
    if (this.#released) return;
    try {
      await this.release();
    } catch (err) {
      if (err instanceof LockLostError && !this.#throwOnLost) return;
      throw err;
    }
  }

  /** @internal Whether scoped helpers report a loss. */
  get throwOnLost(): boolean {
    return this.#throwOnLost;
  }

  /** @internal The lock was released (through this handle, or by key and token through its client). */
  markReleased(): void {
    if (this.#released || this.#lostError) return;
    this.#released = true;
    this.#stopTimers();
    this.#owner.forget(this);
  }

  /**
   * @internal The EXTEND of this lock with request id `id`, first sent at `tFirst` (deadline
   * clock), was granted `grantedMs`; later extends ask for `leaseMs`. The server applies extends
   * in request-id order, so the answer to an older one, read after a newer one's, changes nothing.
   */
  markExtended(id: number, tFirst: number, grantedMs: number, leaseMs: number): void {
    if (this.#released || this.#lostError || id < this.#extendId) return;
    this.#extendId = id;
    this.#leaseMs = leaseMs;
    this.#setDeadline(localDeadline(tFirst, 0, grantedMs), grantedMs);
  }

  /**
   * @internal The client is closing: the keep-alive stops, and the lock no longer keeps the
   * process alive (it runs out its lease on the server; its lost signal still fires).
   */
  clientClosing(): void {
    this.#keepAlive = false;
    this.#stopKeepAlive();
    this.#keepProcessAlive = false;
    if (this.#refCounted) {
      this.#refCounted = false;
      Lock.#unref();
    }
  }

  /** @internal Marks the lock lost (once) and fires the lost signal. Does nothing once released or lost. */
  markLost(reason: LostReason): void {
    if (this.#released || this.#lostError) return;
    this.#stopTimers();
    this.#owner.forget(this);
    const e = new LockLostError(`lock ${describe(this)} lost: ${LOST_TEXT[reason]}`, reason);
    this.#lostError = e;
    this.#resolveLost?.(e);
    this.#abort?.abort(e);
    try {
      this.emit('lost', e);
    } catch (err) {
      // A throwing 'lost' listener is the application's bug: report it as Node reports any
      // throwing listener, without breaking the client.
      queueMicrotask(() => {
        throw err;
      });
    }
  }

  #lostFor(what: string, cause?: unknown): LockLostError {
    const e = this.#lostError!;
    return new LockLostError(`${what}: lock lost: ${LOST_TEXT[e.reason]}`, e.reason, cause === undefined ? { cause: e } : { cause });
  }

  #setDeadline(deadline: number, leaseMs: number): void {
    this.#deadline = deadline;
    this.#lostAt = deadline - lostMargin(leaseMs);
    if (this.#heapIndex < 0) {
      this.#heapIndex = Lock.#heap.length;
      Lock.#heap.push(this);
      if (this.#keepProcessAlive && !this.#refCounted) {
        this.#refCounted = true;
        if (Lock.#refs++ === 0) Lock.#lostTimer?.ref();
      }
    }
    Lock.#siftUp(Lock.#siftDown(this.#heapIndex));
    // One runtime timer serves every lock: set for the earliest lost time (a later one needs no change).
    if (Lock.#lostTimer === undefined || this.#lostAt < Lock.#lostTimerAt) Lock.#schedule(clock.now());
    Lock.#watch ??= setInterval(() => Lock.#checkSuspend(), ClientRules.LOST_CHECK_MS).unref();
  }

  /** Fires the lost signal if its time has come on the deadline clock (runtime timers stop while the host is suspended). */
  #check(): void {
    if (this.#released || this.#lostError) return;
    if (clock.exactNow() >= this.#lostAt) this.markLost('expired');
  }

  /**
   * Held locks by lost time (a binary min-heap): one runtime timer, set for the first of them,
   * stands for a timer per lock. While there are any, #watch looks at the deadline clock every
   * LOST_CHECK_MS.
   */
  static readonly #heap: Lock[] = [];
  static #lostTimer: NodeJS.Timeout | undefined;
  /** When #lostTimer fires, on the deadline clock. */
  static #lostTimerAt = 0;
  /**
   * Locks in the heap that keep the process alive (held, of an open client without
   * `unrefWhileHeld`): while there are any, the lost timer is ref'd, as each lock's timer was.
   */
  static #refs = 0;
  static #watch: NodeJS.Timeout | undefined;
  /** The clock's suspend time when #checkSuspend last looked. */
  static #suspendSeen = 0;

  static #unref(): void {
    if (--Lock.#refs === 0) Lock.#lostTimer?.unref();
  }

  /** Sets the lost timer for the first lost time, from `now` on the deadline clock (none when no lock is held). */
  static #schedule(now: number): void {
    if (Lock.#lostTimer) clearTimeout(Lock.#lostTimer);
    Lock.#lostTimer = undefined;
    const first = Lock.#heap[0];
    if (!first) return;
    Lock.#lostTimerAt = first.#lostAt;
    // (At most the runtime's limit, 2^31-1 ms, which a lease of up to 2^32-1 ms may pass: it fires, finds nothing due, and is set again.)
    Lock.#lostTimer = setTimeout(() => Lock.#onLostTimer(), Math.min(0x7fffffff, Math.max(0, Math.floor(first.#lostAt - now))));
    // While held, the lost timer keeps the process alive (unless the application opted out):
    // a process awaiting `lost` must not exit while the server still holds the lock.
    if (Lock.#refs === 0) Lock.#lostTimer.unref();
  }

  /** The lost timer fired: every lock whose lost time has come on the deadline clock is lost; the timer is set for the next. */
  static #onLostTimer(): void {
    // (#schedule clears the timer: called from #checkSuspend, it may still be set.)
    const now = clock.exactNow();
    for (let first = Lock.#heap[0]; first && now >= first.#lostAt; first = Lock.#heap[0]) {
      if (first.#released || first.#lostError) Lock.#remove(first);
      else first.markLost('expired');
    }
    Lock.#schedule(now);
  }

  /** Takes `l` out of the heap (released or lost). */
  static #remove(l: Lock): void {
    const i = l.#heapIndex;
    if (i < 0) return;
    l.#heapIndex = -1;
    if (l.#refCounted) {
      l.#refCounted = false;
      Lock.#unref();
    }
    const heap = Lock.#heap;
    const last = heap.pop()!;
    if (last !== l) {
      heap[i] = last;
      last.#heapIndex = i;
      Lock.#siftUp(Lock.#siftDown(i));
    }
    // The timer stays set: when it fires it finds nothing due and sets itself for the next lock.
  }

  static #siftUp(i: number): void {
    const heap = Lock.#heap;
    const l = heap[i]!;
    while (i > 0) {
      const p = (i - 1) >> 1;
      const q = heap[p]!;
      if (q.#lostAt <= l.#lostAt) break;
      heap[i] = q;
      q.#heapIndex = i;
      i = p;
    }
    heap[i] = l;
    l.#heapIndex = i;
  }

  /** Returns where the lock at `i` ended up. */
  static #siftDown(i: number): number {
    const heap = Lock.#heap;
    const n = heap.length;
    const l = heap[i]!;
    for (;;) {
      let c = 2 * i + 1;
      if (c >= n) break;
      if (c + 1 < n && heap[c + 1]!.#lostAt < heap[c]!.#lostAt) c++;
      const q = heap[c]!;
      if (q.#lostAt >= l.#lostAt) break;
      heap[i] = q;
      q.#heapIndex = i;
      i = c;
    }
    heap[i] = l;
    l.#heapIndex = i;
    return i;
  }

  /**
   * The lost timer runs on the monotonic clock, which stops while the host is suspended, and it
   * is exact while the deadline clock advances with it. When it has seen suspend time (or a wall
   * clock stepped ahead) since the last look, every lock's deadline is checked against it and
   * the timer set again: after a resume, lost fires within LOST_CHECK_MS.
   */
  static #checkSuspend(): void {
    if (Lock.#heap.length === 0) {
      if (Lock.#watch) clearInterval(Lock.#watch);
      Lock.#watch = undefined;
      return;
    }
    clock.exactNow();
    if (clock.suspendedMs === Lock.#suspendSeen) return;
    Lock.#suspendSeen = clock.suspendedMs;
    Lock.#onLostTimer();
  }

  #scheduleKeepAlive(): void {
    this.#stopKeepAlive();
    // Not isHeld, which may fire the lost signal: the constructor calls this before the client registered the lock.
    if (!this.#keepAlive || this.#released || this.#lostError) return;
    const every = Math.max(1, Math.floor(this.#leaseMs / 3));
    if (performance.now() + every > this.#keepAliveUntil) return; // max hold reached: run out the lease
    this.#keepAliveTimer = setTimeout(() => {
      this.#keepAliveTimer = undefined;
      if (!this.isHeld || this.#releasing) return;
      this.extend(this.#leaseMs).then(
        () => this.#scheduleKeepAlive(),
        // NOT_HELD made the lock lost; anything else (timeout, reconnecting) is retried at the
        // next tick until the local deadline says otherwise.
        () => this.#scheduleKeepAlive(),
      );
    }, every);
    this.#keepAliveTimer.unref();
  }

  #stopKeepAlive(): void {
    if (this.#keepAliveTimer) clearTimeout(this.#keepAliveTimer);
    this.#keepAliveTimer = undefined;
  }

  #stopTimers(): void {
    // The watch stops at its next tick once no lock is left (#checkSuspend): stopping and starting
    // it with every lock would cost a timer per acquire for a client that holds one lock at a time.
    Lock.#remove(this);
    this.#stopKeepAlive();
  }

  /** `Lock("key", token 42)`. */
  override toString(): string {
    return `Lock(${describe(this)})`;
  }
}

function describe(l: Lock): string {
  return `${describeKey(l.key)} token ${l.token}`;
}
