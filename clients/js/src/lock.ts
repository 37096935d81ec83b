/**
 * A held lock: its key and fencing token, release and extend, the lost signal, and the opt-in
 * keep-alive.
 *
 * @module
 */
import { EventEmitter } from 'node:events';
import { performance } from 'node:perf_hooks';
import { LockLostError, NotHeldError, type LostReason } from './errors.js';

// Node 20 may lack Symbol.asyncDispose; Node itself uses this registered symbol.
(Symbol as { asyncDispose?: symbol }).asyncDispose ??= Symbol.for('nodejs.asyncDispose');

/** A lock key: a string (sent as UTF-8) or raw bytes. */
export type Key = string | Uint8Array;

/** What a {@link Lock} needs from its client. Internal. */
export interface LockOwner {
  /** Sends RELEASE. */
  releaseLock(lock: Lock): Promise<void>;
  /** Sends EXTEND; resolves with the monotonic time it was sent and the lease granted. */
  extendLock(lock: Lock, leaseMs: number): Promise<{ tSend: number; leaseMs: number }>;
  /** The lock no longer needs EXPIRED notices. */
  forget(lock: Lock): void;
}

/** How a {@link Lock} was granted. Internal. */
export interface LockGrant {
  key: Key;
  keyBytes: Buffer;
  token: bigint;
  leaseMs: number;
  /** ms the ACQUIRE spent queued (the answer's `detail`). */
  queuedMs: number;
  /** Monotonic ms (performance.now()) when the ACQUIRE was sent. */
  tSend: number;
  /** Keep-alive interval in ms, or 0 for none. */
  keepAliveMs: number;
}

/**
 * A lock held on a key. Release it with {@link Lock.release}, or let `await using` do it:
 *
 * ```ts
 * await using lock = await client.acquire('order-1234', { lease: 10_000 });
 * await db.update(order, { fencingToken: lock.token });
 * ```
 *
 * The lock is *lost* at the first of: the server's EXPIRED notice for its token, its local
 * deadline (`t_send + queued + lease`, never later than the server's), or a NOT_HELD answer to
 * {@link Lock.extend}. Then {@link Lock.lost} resolves, the `'lost'` event fires,
 * {@link Lock.signal} aborts, and every {@link Lock.onLost} callback runs, once. A released lock
 * is never reported lost.
 */
export class Lock extends EventEmitter {
  /** The key, as given to acquire. */
  readonly key: Key;
  /** The fencing token: strictly increasing across every grant of the server (or cluster). */
  readonly token: bigint;
  /** ms the acquire spent waiting in the queue. */
  readonly queuedMs: number;
  /**
   * Resolves (never rejects) with a {@link LockLostError} when the lock is lost. Stays pending
   * forever if the lock is released first.
   */
  readonly lost: Promise<LockLostError>;

  /** @internal */
  readonly keyBytes: Buffer;
  readonly #owner: LockOwner;
  #leaseMs: number;
  #deadlineMono: number;
  #timer: NodeJS.Timeout | undefined;
  #keepAliveMs: number;
  #keepAliveTimer: NodeJS.Timeout | undefined;
  #state: 'held' | 'releasing' | 'released' | 'lost' = 'held';
  #lostError: LockLostError | undefined;
  #resolveLost!: (e: LockLostError) => void;
  #abort: AbortController | undefined;
  #releasing: Promise<void> | undefined;

  /** @internal Created by the client. */
  constructor(owner: LockOwner, g: LockGrant) {
    super();
    this.#owner = owner;
    this.key = g.key;
    this.keyBytes = g.keyBytes;
    this.token = g.token;
    this.queuedMs = g.queuedMs;
    this.#leaseMs = g.leaseMs;
    this.#deadlineMono = g.tSend + g.queuedMs + g.leaseMs;
    this.#keepAliveMs = g.keepAliveMs;
    this.lost = new Promise((resolve) => (this.#resolveLost = resolve));
    this.#armDeadline();
    if (this.#keepAliveMs > 0) this.#scheduleKeepAlive();
  }

  /** The lease now running, in ms (as granted by the last acquire or extend). */
  get leaseMs(): number {
    return this.#leaseMs;
  }

  /**
   * The local deadline as epoch milliseconds (comparable with `Date.now()`): the lock is
   * certainly lost after it, and the lost signal fires then unless it is extended first.
   */
  get deadline(): number {
    return performance.timeOrigin + this.#deadlineMono;
  }

  /** ms left until {@link Lock.deadline} (0 once passed). */
  get remainingMs(): number {
    return Math.max(0, this.#deadlineMono - performance.now());
  }

  /** True once the lock is lost (and not released first). */
  get isLost(): boolean {
    return this.#state === 'lost';
  }

  /** True once release() has been called. */
  get isReleased(): boolean {
    return this.#state === 'releasing' || this.#state === 'released';
  }

  /** True while the lock is held as far as this client knows: neither released nor lost. */
  get isHeld(): boolean {
    return this.#state === 'held';
  }

  /** An AbortSignal that aborts, with the {@link LockLostError} as reason, when the lock is lost. Pass it to the work the lock protects. */
  get signal(): AbortSignal {
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
    if (this.#lostError) {
      const e = this.#lostError;
      let on = true;
      queueMicrotask(() => on && cb(e));
      return () => (on = false);
    }
    this.once('lost', cb);
    return () => this.off('lost', cb);
  }

  override on(event: 'lost', listener: (err: LockLostError) => void): this;
  override on(event: string | symbol, listener: (...args: any[]) => void): this;
  override on(event: string | symbol, listener: (...args: any[]) => void): this {
    return super.on(event, listener);
  }

  override once(event: 'lost', listener: (err: LockLostError) => void): this;
  override once(event: string | symbol, listener: (...args: any[]) => void): this;
  override once(event: string | symbol, listener: (...args: any[]) => void): this {
    return super.once(event, listener);
  }

  /**
   * Releases the lock: the next waiter gets it at once. Stops the keep-alive first. Calling it
   * again returns the first call's promise. Rejects with {@link NotHeldError} if the server no
   * longer knows this token as the holder (it expired, or the server restarted): nothing changed,
   * and you never release somebody else's lock.
   */
  release(): Promise<void> {
    if (this.#releasing) return this.#releasing;
    const wasLost = this.#state === 'lost';
    this.#state = 'releasing';
    this.#stopTimers();
    this.#releasing = this.#owner.releaseLock(this).then(
      () => {
        this.#state = 'released';
        this.#owner.forget(this);
      },
      (err: unknown) => {
        if (err instanceof NotHeldError) {
          this.#state = wasLost ? 'lost' : 'released';
          this.#owner.forget(this);
        } else {
          // Unknown outcome (connection lost): the lock may still be held; release() may be retried.
          this.#state = wasLost ? 'lost' : 'held';
          this.#releasing = undefined;
          if (!wasLost) {
            this.#armDeadline();
            if (this.#keepAliveMs > 0) this.#scheduleKeepAlive();
          }
        }
        throw err;
      },
    );
    return this.#releasing;
  }

  /**
   * Sets the lease to `leaseMs` from now (it may shorten it); defaults to the lease now running.
   * Moves the local deadline. Rejects with {@link LockLostError} if the lock is already lost or
   * released, and with {@link NotHeldError} (and the lock is lost) if the server no longer knows
   * the token.
   */
  async extend(leaseMs: number = this.#leaseMs): Promise<void> {
    if (this.#state !== 'held') {
      throw this.#lostError ?? new LockLostError(`lock ${describe(this)} was released`, 'not-held');
    }
    try {
      const r = await this.#owner.extendLock(this, leaseMs);
      if (this.#state !== 'held') return;
      this.#leaseMs = r.leaseMs;
      this.#deadlineMono = r.tSend + r.leaseMs;
      this.#armDeadline();
    } catch (err) {
      if (err instanceof NotHeldError) this.markLost('not-held', err);
      throw err;
    }
  }

  /** Releases the lock unless it is already released; ignores NOT_HELD once the lock was reported lost. */
  async [Symbol.asyncDispose](): Promise<void> {
    if (this.#state === 'released') return;
    const lost = this.#state === 'lost';
    try {
      await this.release();
    } catch (err) {
      if (lost && err instanceof NotHeldError) return;
      throw err;
    }
  }

  /** @internal Stops the keep-alive (the client is closing). */
  stopKeepAlive(): void {
    this.#keepAliveMs = 0;
    if (this.#keepAliveTimer) clearTimeout(this.#keepAliveTimer);
    this.#keepAliveTimer = undefined;
  }

  /** @internal Marks the lock lost (once) and fires the lost signal. Does nothing once released. */
  markLost(reason: LostReason, cause?: unknown): void {
    if (this.#state !== 'held') return;
    this.#state = 'lost';
    this.#stopTimers();
    this.#owner.forget(this);
    const msg =
      reason === 'expired'
        ? `lock ${describe(this)} lost: the server reclaimed it when its lease expired`
        : reason === 'deadline'
          ? `lock ${describe(this)} lost: its lease ran out (local deadline)`
          : `lock ${describe(this)} lost: the server no longer holds this token`;
    const e = new LockLostError(msg, reason, cause === undefined ? {} : { cause });
    this.#lostError = e;
    this.#resolveLost(e);
    this.#abort?.abort(e);
    this.emit('lost', e);
  }

  #armDeadline(): void {
    if (this.#timer) clearTimeout(this.#timer);
    const left = this.#deadlineMono - performance.now();
    this.#timer = setTimeout(() => this.markLost('deadline'), Math.max(0, Math.ceil(left)));
    this.#timer.unref();
  }

  #scheduleKeepAlive(): void {
    if (this.#keepAliveTimer) clearTimeout(this.#keepAliveTimer);
    this.#keepAliveTimer = setTimeout(() => {
      this.#keepAliveTimer = undefined;
      if (this.#state !== 'held') return;
      this.extend().then(
        () => this.#state === 'held' && this.#scheduleKeepAlive(),
        () => this.#state === 'held' && this.#scheduleKeepAlive(), // retried until the deadline says otherwise
      );
    }, this.#keepAliveMs);
    this.#keepAliveTimer.unref();
  }

  #stopTimers(): void {
    if (this.#timer) clearTimeout(this.#timer);
    if (this.#keepAliveTimer) clearTimeout(this.#keepAliveTimer);
    this.#timer = this.#keepAliveTimer = undefined;
  }

  /** `Lock(key, token)`. */
  override toString(): string {
    return `Lock(${describe(this)})`;
  }
}

function describe(l: Lock): string {
  const k = typeof l.key === 'string' ? JSON.stringify(l.key) : `0x${Buffer.from(l.key).toString('hex')}`;
  return `${k} token ${l.token}`;
}
