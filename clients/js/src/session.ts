/**
 * The session: one client's identity on the server (its 16-byte id), the requests it has not
 * had an answer for, and the connection that carries them, replaced whenever it fails.
 *
 * - Request ids are taken when a frame is written (JavaScript runs one thing at a time, so the
 *   order of ids is the order on the wire), starting at 1 per session.
 * - Requests made while there is no connection wait in `#queue` (no id yet), each bounded by
 *   its own timer, while the reconnect loop retries with backoff (a failed round fails them only
 *   before the first connection, unless a node answered NOT_LEADER in it, or for an auth or
 *   protocol-version error); written requests
 *   wait in `#sent` (by id, in id order) for their answer.
 * - After a reconnect, WELCOME decides: the same state id and RESUMED → every request in `#sent`
 *   is re-sent with its id, in id order, before anything new; the same state id without RESUMED
 *   → those requests fail "connection lost"; another state id → they fail "server restarted",
 *   the client's locks are lost, nothing is re-sent, and a new session starts.
 * - A given-up ACQUIRE (timeout, abort, connection lost) stays in `#sent`, marked abandoned:
 *   a CANCEL goes out for it, and a grant that still arrives is released.
 * - A heartbeat PING after `heartbeatMs` without any bytes received (after at most 250 ms
 *   while any request waits for its answer, a queued ACQUIRE included); a PING unanswered
 *   within min(`heartbeatMs`, 750 ms) gives the connection up (a frozen node, a cut network): it
 *   is replaced like a dropped one, the session resumes, the calls in flight keep waiting. For
 *   2 s that node is neither dialled nor followed as a leader hint (unless it is the only
 *   endpoint); after that it is tried last.
 * - ACK at least every 1,024 answers (here: every 512), one at a time.
 *
 * @module
 * @internal
 */
import { randomBytes } from 'node:crypto';
import { performance } from 'node:perf_hooks';
import type * as tls from 'node:tls';
import { clock } from './clock.js';
import { Connection, formatEndpoint, tryParseEndpoint, type Endpoint, type Reply } from './connection.js';
import {
  AuthFailedError,
  CancelledError,
  ClientClosedError,
  ConnectionLostError,
  NotLeaderError,
  ServerRestartedError,
  TicketingError,
  TimeoutError,
  UnavailableError,
  UnsupportedVersionError,
} from './errors.js';
import { ClientRules, GoawayReason, HEADER_SIZE, Op, Sizes, Status, encodeRequest } from './protocol.js';
import { IntTable } from './table.js';

/** Send ACK after this many answers (half of ACK_EVERY, so that a slow ACK never breaks the rule). */
const ACK_AFTER = ClientRules.ACK_EVERY / 2;

/**
 * The heartbeat's timing (docs/clients.md, the heartbeat interval): while any request waits for
 * an answer a PING goes after this much silence at most...
 */
const BUSY_HEARTBEAT_MS = 250;
/** ...and a PING unanswered for this long at most gives the connection up: a frozen leader is left about 1 s after it froze. */
const MAX_PING_WAIT_MS = 750;
/**
 * How long a node whose connection went silent (a PING unanswered: frozen, or cut off) is left
 * out of the connect rounds, as an endpoint and as a leader hint, when there are other
 * endpoints: it still accepts TCP and would cost the handshake wait, and the other nodes keep
 * naming it as the leader until they elect another one (docs/clients.md, rule 1).
 */
const SILENT_SKIP_MS = 2_000;

const sameEndpoint = (a: Endpoint | undefined, b: Endpoint | undefined): boolean => a !== undefined && b !== undefined && a.host === b.host && a.port === b.port;

/** What the session needs to know. */
export interface SessionOptions {
  endpoints: Endpoint[];
  token: Buffer | undefined;
  tls: tls.ConnectionOptions | undefined;
  connectTimeoutMs: number;
  heartbeatMs: number;
  requestTimeoutMs: number;
  cleanupTimeoutMs: number;
  minBackoffMs: number;
  maxBackoffMs: number;
  maxRedirects: number;
}

/** What the session tells its client. */
export interface SessionHooks {
  /** An EXPIRED push (or any push other than GOAWAY). */
  onPush(r: Reply): void;
  /** The server's state id changed: every lock is lost. Called before the failed calls reject. */
  onRestarted(endpoint: string): void;
  /** True while the client holds locks (so the session reconnects after a drop). */
  holdsLocks(): boolean;
  /** A connection is up. */
  onConnect(endpoint: string): void;
  /** The connection dropped. */
  onDisconnect(err: TicketingError): void;
}

/** A request as the client asks for it. */
export interface CallSpec {
  op: number;
  key?: Buffer;
  token?: bigint;
  leaseMs?: number;
  waitMs?: number;
  /**
   * Names the request in messages: `acquire "order-1"`; or a function that makes that name, called
   * only when a message needs it (the success path builds no message).
   */
  what: What;
  /** The request timeout; for an ACQUIRE, counted until it is written and again after its wait timeout. 0: none. */
  timeoutMs: number;
}

/** An answer and how it was obtained. */
export interface Answer {
  res: Reply;
  /** The request id the answer is for (ids stay far below 2^53: a number). */
  id: number;
  /** When the request was first written, on the deadline clock (clock.ts); re-sends keep it. */
  tFirst: number;
  /** True when the answer is to a re-sent request (after a resume). */
  retried: boolean;
}

type Done = (res: Reply | undefined, err?: TicketingError) => void;

/**
 * How a caller's call ends when it has no promise: called once, synchronously, from wherever the
 * call settles (an answer being read, a timer, an abort, the close), with the answer or the
 * error. It must not throw. Saves a promise and a microtask hop per call on the hot path (and
 * runs before the next frame of the same read is handled).
 */
export type OnDone = (call: Call, a: Answer | undefined, err?: unknown) => void;

/** A request's name in messages, or a function that makes it when one is needed. */
export type What = string | (() => string);

/** The text of a {@link What}. */
export function whatText(w: What): string {
  return typeof w === 'string' ? w : w();
}

/** An explicit connect() call; `giveUpAt` (performance.now() ms) bounds one made before the first connection during an election. */
interface ConnectWaiter {
  resolve(): void;
  reject(e: unknown): void;
  giveUpAt: number;
}

/** One request's life: queued (no id), sent (an id, in `#sent`), done. */
export class Call {
  /** The request id (0: not written yet). A number: a session would need centuries to pass 2^53. */
  id = 0;
  state: 'queued' | 'sent' | 'done' = 'queued';
  /** When it was first written (0: not yet), on the deadline clock: the time a lock's deadline counts from. */
  tFirst = 0;
  retried = false;
  /** Answered NOT_LEADER (it did not run): re-sent on the next connection. */
  notRun = false;
  redirects = 0;
  /** An ACQUIRE given up by its caller: its grant, if any, is released. */
  abandoned = false;
  /** The request timer: when it fires (performance.now() ms; 0: not armed), in a list of the session's {@link Deadlines}. */
  due = 0;
  /** The deadline list the call is in, and its neighbours there. */
  dlist: DeadlineList | undefined = undefined;
  dprev: Call | undefined = undefined;
  dnext: Call | undefined = undefined;
  settled = false;
  /** The caller's promise: made only for a caller's call without {@link OnDone}. */
  readonly promise!: Promise<Answer>;
  resolve!: (a: Answer) => void;
  reject!: (e: unknown) => void;
  /** Set for an abandoned acquire whose caller waits for the clean-up. */
  cleanupError: TicketingError | undefined;
  cleanupTimer: NodeJS.Timeout | undefined;

  constructor(
    readonly spec: CallSpec,
    /** Internal calls (heartbeat, ACK, CANCEL, clean-up RELEASE) have a callback instead of a caller. */
    readonly internal: Done | undefined,
    /** A caller's call that ends in this callback instead of a promise. */
    readonly onDone?: OnDone,
  ) {
    if (internal || onDone) return;
    this.promise = new Promise<Answer>((res, rej) => {
      this.resolve = res;
      this.reject = rej;
    });
  }

  #what: string | undefined;
  /** The request's name in messages (made once, when first needed). */
  get what(): string {
    return (this.#what ??= whatText(this.spec.what));
  }
}

/** The calls whose timer has one duration, in the order they fire. */
class DeadlineList {
  head: Call | undefined = undefined;
  tail: Call | undefined = undefined;
  constructor(readonly ms: number) {}
}

/**
 * The request timers of one session: one runtime timer, set for the earliest deadline, instead
 * of one per request. Calls with the same timeout fire in the order they were armed, so each
 * duration has its own list (append and removal are O(1)), and the earliest deadline is the
 * earliest head. The runtime timer keeps the process alive while a caller's request is armed
 * (as a per-request timer did); internal requests' timers do not.
 */
class Deadlines {
  readonly #lists = new Map<number, DeadlineList>();
  #timer: NodeJS.Timeout | undefined;
  /** When #timer fires (performance.now() ms). */
  #timerAt = 0;
  /** Armed calls that keep the process alive (callers' requests). */
  #refs = 0;
  #refd = false;

  constructor(private readonly fire: (call: Call) => void) {}

  arm(call: Call, ms: number): void {
    if (call.dlist) this.disarm(call);
    const due = performance.now() + ms;
    call.due = due;
    let list = this.#lists.get(ms);
    if (!list) {
      list = new DeadlineList(ms);
      this.#lists.set(ms, list);
    }
    call.dlist = list;
    call.dprev = list.tail;
    call.dnext = undefined;
    if (list.tail) list.tail.dnext = call;
    else list.head = call;
    list.tail = call;
    if (!call.internal && this.#refs++ === 0) this.#ref(true);
    if (this.#timer === undefined || due < this.#timerAt) this.#schedule(due);
  }

  disarm(call: Call): void {
    const list = call.dlist;
    if (!list) return;
    if (call.dprev) call.dprev.dnext = call.dnext;
    else list.head = call.dnext;
    if (call.dnext) call.dnext.dprev = call.dprev;
    else list.tail = call.dprev;
    call.dlist = call.dprev = call.dnext = undefined;
    call.due = 0;
    if (!call.internal && --this.#refs === 0) this.#ref(false);
    // The runtime timer stays set: when it fires it finds nothing due and sets itself for the
    // next deadline, if any (cheaper than re-setting it with every request).
  }

  /** Stops the runtime timer (the session is closed). */
  stop(): void {
    if (this.#timer) clearTimeout(this.#timer);
    this.#timer = undefined;
  }

  #ref(on: boolean): void {
    this.#refd = on;
    if (this.#timer) {
      if (on) this.#timer.ref();
      else this.#timer.unref();
    }
  }

  #schedule(due: number): void {
    if (this.#timer) clearTimeout(this.#timer);
    this.#timerAt = due;
    // (At most the runtime's limit, 2^31-1 ms: a wait of up to 2^32-2 ms plus the timeout may be longer; the sweep then sets it again.)
    this.#timer = setTimeout(() => this.#sweep(), Math.min(MAX_TIMER_MS, Math.max(1, Math.ceil(due - performance.now()))));
    if (!this.#refd) this.#timer.unref();
  }

  #sweep(): void {
    this.#timer = undefined;
    // A runtime timer may fire up to 1 ms before the exact deadline (it counts whole ms).
    const now = performance.now() + 1;
    for (;;) {
      let first: Call | undefined;
      for (const list of this.#lists.values()) {
        const h = list.head;
        if (h && (!first || h.due < first.due)) first = h;
      }
      if (!first) break;
      if (first.due > now) {
        this.#schedule(first.due);
        break;
      }
      this.disarm(first);
      this.fire(first);
    }
    // Durations no longer used: forget their lists (the common one stays).
    if (this.#lists.size > 16) for (const [ms, list] of this.#lists) if (!list.head) this.#lists.delete(ms);
  }
}

/** The longest delay a runtime timer takes (a longer one fires after 1 ms). */
const MAX_TIMER_MS = 0x7fffffff;

/** 2^53: tokens below it are written as two 32-bit halves of a number (no bigint arithmetic). */
const SAFE = 0x20000000000000n;

/**
 * Writes the u32 `v` at `off` (big-endian). Plain byte stores: Buffer#writeUInt32BE checks its
 * value and offset on every call, and the fields here are checked already.
 */
function put32(b: Buffer, off: number, v: number): void {
  b[off] = v >>> 24;
  b[off + 1] = v >>> 16;
  b[off + 2] = v >>> 8;
  b[off + 3] = v;
}

/** Writes a u64 below 2^53 at `off`. */
function put53(b: Buffer, off: number, v: number): void {
  put32(b, off, Math.floor(v / 0x100000000));
  put32(b, off + 4, v >>> 0);
}

/**
 * A request frame, as {@link encodeRequest} makes it, from fields the client has already checked
 * (ids, tokens, leases, waits and keys within their widths): no object, no range checks.
 */
function encodeFrame(op: number, id: number, token: bigint, leaseMs: number, waitMs: number, key: Buffer | undefined): Buffer {
  if (token >= SAFE || (key !== undefined && key.length > Sizes.MAX_KEY_LEN)) {
    return encodeRequest({ op, id: BigInt(id), token, leaseMs, waitMs, key }); // (never, in practice) the checked way
  }
  const n = key === undefined ? 0 : key.length;
  const b = Buffer.allocUnsafe(HEADER_SIZE + n);
  put32(b, 0, HEADER_SIZE - 4 + n);
  b[4] = op;
  b[5] = 0;
  b[6] = n >>> 8;
  b[7] = n;
  put53(b, 8, id);
  if (token === 0n) {
    put32(b, 16, 0);
    put32(b, 20, 0);
  } else put53(b, 16, Number(token));
  put32(b, 24, leaseMs);
  put32(b, 28, waitMs);
  if (n > 0) b.set(key!, HEADER_SIZE);
  return b;
}

function jitter(ms: number): number {
  return Math.round(ms * (0.5 + Math.random() * 0.5));
}

/** One client's session. */
export class Session {
  /** The session id sent in every HELLO; a new one after the server restarted. */
  sessionId: Buffer = newSessionId();
  #nextId = 1;
  readonly #queue: Call[] = [];
  /** Written requests awaiting their answer, by id (a table that allocates nothing per request; values() in id order). */
  readonly #sent = new IntTable<Call>();
  #conn: Connection | undefined;
  #dialing: Promise<void> | undefined;
  #dialAbort: AbortController | undefined;
  #dialConn: Connection | undefined;
  #closing = false;
  #stateId: Buffer | undefined;
  #graceMs = 0;
  #graceTimer: NodeJS.Timeout | undefined;
  #withinGrace = false;
  #leaderHint: Endpoint | undefined;
  /** A node answered NOT_LEADER in the last dial round: the cluster is electing a leader. */
  #election = false;
  #preferred = 0;
  /** The node whose connection the heartbeat found silent last... */
  #silent: Endpoint | undefined;
  /** ...which is not dialled, nor followed as a hint, until then (performance.now()). */
  #silentTill = 0;
  #lastError: TicketingError | undefined;
  /** Explicit connect() calls. */
  #connectWaiters: ConnectWaiter[] = [];
  #answersSinceAck = 0;
  #ack: Call | undefined;
  #hbTimer: NodeJS.Timeout | undefined;
  #hb: Call | undefined;
  /** performance.now() when the heartbeat PING `#hb` was sent. */
  #hbSent = 0;
  #backoffTimer: NodeJS.Timeout | undefined;
  #wakeBackoff: (() => void) | undefined;
  #pendingUser = 0;
  #cleanups = 0;
  #idleWaiters: (() => void)[] = [];
  #closed = false;
  /** The request timers. */
  readonly #deadlines = new Deadlines((call) => this.#onTimeout(call));
  /** Whether the connection was last told to keep the process alive. */
  #refOn: boolean | undefined;

  constructor(
    private readonly opts: SessionOptions,
    private readonly hooks: SessionHooks,
  ) {}

  /** True while a connection is up. */
  get isConnected(): boolean {
    return this.#conn !== undefined;
  }

  /** `host:port` of the connected server, or undefined. */
  get endpoint(): string | undefined {
    return this.#conn?.name;
  }

  /** The state id of the server this session talks to (undefined before the first WELCOME). */
  get stateId(): Buffer | undefined {
    return this.#stateId;
  }

  // ---- requests ----

  /** Sends a request for a caller: `call.promise` settles with its answer (any status) or rejects. */
  request(spec: CallSpec, onDone?: OnDone): Call {
    const call = new Call(spec, undefined, onDone);
    if (this.#closed) {
      call.settled = true;
      const err = new ClientClosedError(`${whatText(spec.what)}: the client is closed`);
      if (onDone) onDone(call, undefined, err);
      else call.reject(err);
      return call;
    }
    this.#pendingUser++;
    this.#updateRef();
    // The bookkeeping goes before the write where it can: a frame written at once (see
    // Connection.write) may wake the server on this CPU, which then waits for this code to end.
    if (spec.timeoutMs > 0 && spec.op !== Op.ACQUIRE) this.#deadlines.arm(call, spec.timeoutMs);
    this.#submit(call);
    // An ACQUIRE written at once got its timer from #send (its wait timeout plus this one, or none
    // for a wait without limit): one timer per call, not two.
    if (spec.timeoutMs > 0 && spec.op === Op.ACQUIRE && call.state === 'queued' && !call.settled) {
      this.#deadlines.arm(call, spec.timeoutMs);
    }
    return call;
  }

  /** Sends a request for the client itself; `done` gets the answer, or an error when it is dropped. */
  #internal(spec: CallSpec, done: Done): Call {
    const call = new Call(spec, done);
    if (spec.op === Op.RELEASE) this.#cleanups++;
    this.#submit(call);
    return call;
  }

  #submit(call: Call): void {
    if (this.#conn && this.#queue.length === 0) this.#send(call, false);
    else {
      this.#queue.push(call);
      this.#ensureDialing();
    }
  }

  #send(call: Call, retry: boolean): void {
    const conn = this.#conn!;
    const first = call.state === 'queued';
    if (call.id === 0) call.id = this.#nextId++;
    call.state = 'sent';
    // A re-send (after a resume, to the leader, or to another endpoint as a new request) keeps
    // the first send: the server counts a grant's lease from the request's first arrival.
    if (call.tFirst === 0) call.tFirst = clock.now();
    call.retried = retry;
    this.#sent.set(call.id, call);
    const s = call.spec;
    // The timer before the write (see request).
    if (first && s.timeoutMs > 0) {
      if (call.internal) {
        this.#deadlines.arm(call, s.timeoutMs);
      } else if (s.op === Op.ACQUIRE && !call.abandoned) {
        // The time an ACQUIRE spends queued is bounded by its wait timeout and the heartbeat.
        if (s.waitMs === Sizes.WAIT_FOREVER) this.#deadlines.disarm(call);
        else this.#deadlines.arm(call, s.waitMs! + s.timeoutMs);
      }
    }
    conn.write(encodeFrame(s.op, call.id, s.token ?? 0n, s.leaseMs ?? 0, s.waitMs ?? 0, s.key));
  }

  #onTimeout(call: Call): void {
    const ms = call.spec.timeoutMs;
    if (call.state === 'queued') {
      this.#unqueue(call);
      // The last connect error names the endpoint: the message does not list it twice.
      const msg = this.#lastError
        ? `${call.what}: no connection within ${ms} ms (last error: ${this.#lastError.message})`
        : `${call.what}: no connection to ${this.opts.endpoints.map(formatEndpoint).join(', ')} within ${ms} ms`;
      this.#fail(call, new TimeoutError(msg, { cause: this.#lastError }));
    } else if (call.state === 'sent') {
      const acquire = call.spec.op === Op.ACQUIRE;
      // Sent before the connection dropped: while the client reconnects, name the last connect error (the cause).
      const down = this.#conn ? '' : `; the connection was lost and not re-established${this.#lastError ? ` (last error: ${this.#lastError.message})` : ''}`;
      const err = new TimeoutError(
        (acquire
          ? `${call.what}: no answer within ${ms} ms after the wait timeout (${call.spec.waitMs} ms); the request is withdrawn`
          : `${call.what}: no answer from ${this.#conn?.name ?? 'the server'} within ${ms} ms`) + down,
        this.#conn ? {} : { cause: this.#lastError },
      );
      if (acquire && !call.internal) this.abandon(call, err, false);
      else {
        this.#sent.delete(call.id);
        this.#fail(call, err);
      }
    }
  }

  #unqueue(call: Call): void {
    const i = this.#queue.indexOf(call);
    if (i >= 0) this.#queue.splice(i, 1);
  }

  /** Settles a call with an error: its caller's promise rejects, or its callback runs. */
  #fail(call: Call, err: TicketingError): void {
    this.#deadlines.disarm(call);
    if (call.state !== 'done') call.state = 'done';
    if (call.internal) {
      if (call.spec.op === Op.RELEASE) this.#cleanupDone();
      call.internal(undefined, err);
      return;
    }
    this.#reject(call, err);
  }

  /** Settles a caller's call: it resolves with `answer`, or rejects with `err` (once). */
  #settle(call: Call, answer: Answer | undefined, err?: unknown): void {
    if (call.settled) return;
    call.settled = true;
    this.#deadlines.disarm(call);
    if (call.cleanupTimer) clearTimeout(call.cleanupTimer);
    call.cleanupTimer = undefined;
    if (call.onDone) call.onDone(call, answer, err);
    else if (answer) call.resolve(answer);
    else call.reject(err);
    this.#pendingUser--;
    this.#updateRef();
    this.#checkIdle();
  }

  #reject(call: Call, err: unknown): void {
    this.#settle(call, undefined, err);
  }

  /** The callers' acquires still waiting for their answer (neither settled nor given up). */
  waitingAcquires(): Call[] {
    const out: Call[] = [];
    for (const c of this.#queue) if (!c.internal && !c.settled && c.spec.op === Op.ACQUIRE) out.push(c);
    for (const c of this.#sent.values()) if (!c.internal && !c.settled && !c.abandoned && c.spec.op === Op.ACQUIRE) out.push(c);
    return out;
  }

  /** Gives up a call that is not an ACQUIRE: it rejects with `err`; its answer, if it comes, is ignored. */
  drop(call: Call, err: TicketingError): void {
    if (call.settled) return;
    if (call.spec.op === Op.ACQUIRE) return this.abandon(call, err, true);
    if (call.state === 'queued') this.#unqueue(call);
    else if (call.state === 'sent' && this.#sent.get(call.id) === call) this.#sent.delete(call.id);
    call.state = 'done';
    this.#reject(call, err);
  }

  /**
   * Gives up an ACQUIRE: a queued one is dropped; a written one is withdrawn with CANCEL (now,
   * or on the session's next connection) and any grant that still arrives is released. The
   * caller's promise rejects with `err` at once, or, with `waitCleanup`, once the answer (and
   * the release of a raced grant) came, or the cleanup timeout passed.
   */
  abandon(call: Call, err: TicketingError, waitCleanup: boolean): void {
    if (call.settled || call.abandoned) return;
    if (call.state === 'queued') {
      this.#unqueue(call);
      call.state = 'done';
      this.#reject(call, err);
      return;
    }
    if (call.state !== 'sent') return;
    call.abandoned = true;
    this.#cleanups++;
    this.#deadlines.disarm(call);
    if (waitCleanup) {
      call.cleanupError = err;
      call.cleanupTimer = setTimeout(() => this.#reject(call, err), this.opts.cleanupTimeoutMs);
    } else {
      this.#reject(call, err);
    }
    this.#internal({ op: Op.CANCEL, token: BigInt(call.id), what: `cancel ${call.what}`, timeoutMs: this.opts.requestTimeoutMs }, () => {
      // The ACQUIRE's answer (CANCELLED, or OK to release) comes first; if it is still missing,
      // give it the cleanup timeout and then forget it (a grant then runs out its lease).
      if (this.#sent.get(call.id) === call) {
        setTimeout(() => this.#dropAbandoned(call), this.opts.cleanupTimeoutMs).unref();
      }
    });
  }

  #dropAbandoned(call: Call): void {
    if (call.state === 'done') return;
    if (this.#sent.get(call.id) === call) this.#sent.delete(call.id);
    call.state = 'done';
    this.#cleanupDone();
    if (call.cleanupError) this.#reject(call, call.cleanupError);
  }

  /** The answer to an abandoned ACQUIRE: release a grant, then let the caller go. */
  #abandonedAnswer(call: Call, r: Reply): void {
    const finish = (): void => {
      this.#cleanupDone();
      if (call.cleanupError) this.#reject(call, call.cleanupError);
    };
    if (r.status !== Status.OK) return finish();
    this.releaseToken(call.spec.key!, r.token, call.what, finish);
  }

  /** Releases a token nobody will use (a grant that raced a cancel); `done` runs when that is settled. */
  releaseToken(key: Buffer, token: bigint, what: string, done: () => void = () => {}): void {
    this.#internal({ op: Op.RELEASE, key, token, what: `release (clean-up of ${what}) token ${token}`, timeoutMs: this.opts.requestTimeoutMs }, () => done());
  }

  #cleanupDone(): void {
    this.#cleanups--;
    this.#checkIdle();
  }

  // ---- answers ----

  #onFrame(conn: Connection, r: Reply): void {
    if (conn !== this.#conn) return;
    if (r.id === 0) {
      if (r.op === Op.GOAWAY) return this.#goaway(conn, r);
      return this.hooks.onPush(r);
    }
    const call = this.#sent.get(r.id);
    if (!call) return; // not ours any more (timed out): ignore
    if (r.status === Status.NOT_LEADER && call.redirects < this.opts.maxRedirects) {
      // It did not run: re-send it, with its id, on a connection to the leader.
      call.notRun = true;
      call.redirects++;
      this.#leaderHint = tryParseEndpoint(r.data.toString('utf8'));
      if (!this.#leaderHint) this.#moveOn(conn);
      conn.destroy(new ConnectionLostError(`${conn.name} is not the leader; reconnecting`));
      return;
    }
    if (
      r.status === Status.SHUTTING_DOWN &&
      this.opts.endpoints.length > 1 &&
      (call.spec.op === Op.ACQUIRE || call.spec.op === Op.EXTEND) &&
      !call.abandoned &&
      call.redirects < this.opts.maxRedirects
    ) {
      // Refused (nothing ran): ask another endpoint, as a new request.
      this.#sent.delete(r.id);
      call.redirects++;
      call.id = 0;
      call.state = 'queued';
      this.#queue.unshift(call);
      this.#moveOn(conn);
      conn.destroy(new ConnectionLostError(`${conn.name} is shutting down; moving to another endpoint`));
      return;
    }
    this.#sent.delete(r.id);
    call.state = 'done';
    this.#deadlines.disarm(call);
    this.#answersSinceAck++;
    if (call.abandoned) this.#abandonedAnswer(call, r);
    else if (call.internal) {
      if (call.spec.op === Op.RELEASE) this.#cleanupDone();
      call.internal(r);
    } else this.#settle(call, { res: r, id: r.id, tFirst: call.tFirst, retried: call.retried });
    this.#maybeAck();
  }

  #goaway(conn: Connection, r: Reply): void {
    const hint = r.data.toString('utf8');
    this.#leaderHint = hint ? tryParseEndpoint(hint) : undefined;
    if (!this.#leaderHint) this.#moveOn(conn);
    const why = r.detail === GoawayReason.LEADERSHIP ? 'no longer the leader' : r.detail === GoawayReason.STOPPING ? 'stopping' : `going away (reason ${r.detail})`;
    conn.destroy(new ConnectionLostError(`${conn.name} is ${why}${hint ? `; leader is ${hint}` : ''}; reconnecting`));
  }

  /** Prefers the endpoint after `conn`'s for the next dial. */
  #moveOn(conn: Connection): void {
    const n = this.opts.endpoints.length;
    const i = this.opts.endpoints.findIndex((e) => e.host === conn.endpoint.host && e.port === conn.endpoint.port);
    this.#preferred = ((i >= 0 ? i : this.#preferred) + 1) % n;
  }

  #maybeAck(): void {
    if (this.#answersSinceAck < ACK_AFTER || this.#ack || !this.#conn) return;
    let x = 0;
    for (const c of this.#sent.values()) {
      if (c.spec.op !== Op.ACQUIRE && (x === 0 || c.id < x)) x = c.id;
    }
    if (x === 0) x = this.#nextId; // nothing awaited: the id the ACK itself takes
    this.#answersSinceAck = 0;
    this.#ack = this.#internal({ op: Op.ACK, token: BigInt(x), what: 'ack', timeoutMs: this.opts.requestTimeoutMs }, () => (this.#ack = undefined));
  }

  // ---- connections ----

  /**
   * Connects now (if not connected): resolves once a connection is up, rejects with the first
   * failed round's error, except before the first connection when a node answered NOT_LEADER in
   * the round (an election): then it keeps trying at the shortest backoff until the request
   * timeout has passed since it began, and rejects with the last round's error.
   */
  connect(signal?: AbortSignal): Promise<void> {
    if (this.#closed) return Promise.reject(new ClientClosedError());
    if (signal?.aborted) return Promise.reject(new CancelledError('connect: cancelled before it began', { cause: signal.reason }));
    if (this.#conn) return Promise.resolve();
    const giveUpAt = performance.now() + this.opts.requestTimeoutMs;
    let waiter!: ConnectWaiter;
    const p = new Promise<void>((resolve, reject) => {
      waiter = { resolve, reject, giveUpAt };
      this.#connectWaiters.push(waiter);
    });
    // Aborted: this connect stops waiting at once; the dial loop goes on only if something else
    // needs the connection.
    const onAbort = (): void => {
      const i = this.#connectWaiters.indexOf(waiter);
      if (i < 0) return;
      this.#connectWaiters.splice(i, 1);
      waiter.reject(new CancelledError('connect: cancelled', { cause: signal!.reason }));
    };
    signal?.addEventListener('abort', onAbort, { once: true });
    this.#updateRef();
    this.#ensureDialing(true);
    return p.finally(() => {
      signal?.removeEventListener('abort', onAbort);
      this.#updateRef();
    });
  }

  #needsConnection(): boolean {
    if (this.#closed) return false;
    if (this.#connectWaiters.length > 0) return true;
    if (this.#queue.some((c) => !c.internal)) return true;
    for (const c of this.#sent.values()) if (!c.internal && !c.abandoned) return true;
    if (this.hooks.holdsLocks()) return true;
    return this.#withinGrace && (this.#queue.length > 0 || this.#sent.size > 0);
  }

  #ensureDialing(force = false): void {
    if (this.#conn || this.#closed) return;
    if (this.#dialing) {
      if (force) this.#wakeBackoff?.(); // an explicit connect(): try now, not after the backoff
      return;
    }
    if (!force && !this.#needsConnection()) return;
    this.#dialing = this.#dialLoop().finally(() => (this.#dialing = undefined));
  }

  async #dialLoop(): Promise<void> {
    let delay = this.opts.minBackoffMs;
    let restarts = 0;
    for (let round = 0; !this.#closed; round++) {
      let conn: Connection;
      try {
        conn = await this.#dialRound();
      } catch (err) {
        if (this.#closed) return;
        const e = err instanceof TicketingError ? err : new UnavailableError(String(err), { cause: err });
        this.#lastError = e;
        // An election takes well under a second: after a round in which a node answered
        // NOT_LEADER, the shortest pause rather than a backoff grown as from a dead server.
        if (this.#election) delay = this.opts.minBackoffMs;
        const pause = jitter(delay);
        this.#connectFailed(e, pause);
        if (!this.#needsConnection()) return;
        await this.#backoff(pause);
        delay = Math.min(delay * 2, this.opts.maxBackoffMs);
        continue;
      }
      if (this.#closed) {
        conn.destroy(new ClientClosedError());
        return;
      }
      if (this.#install(conn)) return;
      // The server restarted: dial again at once with the new session (a few times, then back off).
      if (++restarts > 3) {
        await this.#backoff(jitter(delay));
        delay = Math.min(delay * 2, this.opts.maxBackoffMs);
      }
    }
  }

  #backoff(ms: number): Promise<void> {
    return new Promise<void>((resolve) => {
      const wake = (): void => {
        if (this.#backoffTimer) clearTimeout(this.#backoffTimer);
        this.#backoffTimer = undefined;
        this.#wakeBackoff = undefined;
        resolve();
      };
      this.#backoffTimer = setTimeout(wake, ms);
      if (!this.#wantRef()) this.#backoffTimer.unref();
      this.#wakeBackoff = wake;
    });
  }

  /**
   * A dial round failed: explicit connect() calls fail. Once the session has been connected,
   * calls keep waiting for the reconnect (the loop retries with backoff), each bounded by its
   * own timeout (docs/clients.md, rule 1); only an error that no retry fixes (auth, protocol
   * version) fails them, and those in flight too. Before the first connection, a failed round
   * fails the calls waiting for it at once (the endpoints are wrong or down: nothing to resume),
   * unless a node answered NOT_LEADER in it (a cluster electing a leader, as when the application
   * and the cluster start together): then the next round follows after `pauseMs` (the shortest
   * backoff); an explicit connect() fails only once another pause would pass the request timeout
   * since it began, and calls wait, each bounded by its own timeout.
   */
  #connectFailed(err: TicketingError, pauseMs: number): void {
    const fatal = err instanceof AuthFailedError || err instanceof UnsupportedVersionError;
    if (!fatal && this.#election && this.#stateId === undefined) {
      const next = performance.now() + pauseMs;
      const waiters = this.#connectWaiters;
      this.#connectWaiters = waiters.filter((w) => w.giveUpAt >= next);
      for (const w of waiters) if (w.giveUpAt < next) w.reject(err);
      return;
    }
    const waiters = this.#connectWaiters.splice(0);
    for (const w of waiters) w.reject(err);
    if (!fatal && this.#stateId !== undefined) return;
    for (const c of [...this.#queue]) {
      if (c.internal) continue;
      this.#unqueue(c);
      this.#fail(c, err);
    }
    if (fatal) {
      for (const c of [...this.#sent.values()]) {
        if (c.internal || c.abandoned) continue;
        this.#sent.delete(c.id);
        this.#fail(c, err);
      }
    }
  }

  /** Tries every endpoint once (the leader hint first), following CHALLENGE NOT_LEADER hints. */
  async #dialRound(): Promise<Connection> {
    const eps = this.opts.endpoints;
    const skip = eps.length > 1 && performance.now() < this.#silentTill ? this.#silent : undefined;
    const order: Endpoint[] = [];
    if (this.#leaderHint && !sameEndpoint(this.#leaderHint, skip)) order.push(this.#leaderHint);
    this.#leaderHint = undefined;
    for (let k = 0; k < eps.length; k++) {
      const ep = eps[(this.#preferred + k) % eps.length]!;
      if (!sameEndpoint(ep, skip)) order.push(ep);
    }
    const errors: TicketingError[] = [];
    let hops = 0;
    this.#election = false;
    for (let i = 0; i < order.length; i++) {
      if (this.#closed) throw new ClientClosedError();
      const ep = order[i]!;
      this.#dialAbort = new AbortController();
      try {
        const conn = await Connection.open({
          endpoint: ep,
          sessionId: this.sessionId,
          token: this.opts.token,
          tls: this.opts.tls,
          connectTimeoutMs: this.opts.connectTimeoutMs,
          ref: this.#wantRef(),
          signal: this.#dialAbort.signal,
          onOpening: (c) => (this.#dialConn = c),
        });
        const j = eps.findIndex((e) => e.host === ep.host && e.port === ep.port);
        if (j >= 0) this.#preferred = j;
        return conn;
      } catch (err) {
        const e = err instanceof TicketingError ? err : new UnavailableError(String(err), { cause: err });
        if (this.#closed) throw new ClientClosedError();
        errors.push(e);
        if (e instanceof AuthFailedError || e instanceof UnsupportedVersionError) throw e;
        // A node that is not the leader: an UnavailableError whose cause has the hint.
        const nl = e instanceof NotLeaderError ? e : e.cause instanceof NotLeaderError ? e.cause : undefined;
        if (nl) this.#election = true;
        if (nl?.leader && hops < this.opts.maxRedirects) {
          const hint = tryParseEndpoint(nl.leader);
          if (hint && !sameEndpoint(hint, skip)) {
            order.splice(i + 1, 0, hint);
            hops++;
          }
        }
      } finally {
        this.#dialAbort = undefined;
        this.#dialConn = undefined;
      }
    }
    const last = errors[errors.length - 1]!;
    if (errors.every((e) => e.constructor === last.constructor)) {
      if (errors.length === 1 || !(last instanceof UnavailableError)) throw last;
    }
    const names = order.map(formatEndpoint).join(', ');
    throw new UnavailableError(`could not connect to ${names}: ${last.message}`, { cause: last });
  }

  /**
   * Takes a fresh connection into service. Returns false when the server turned out to have
   * restarted (the connection is then closed, and the caller dials again with the new session).
   */
  #install(conn: Connection): boolean {
    const w = conn.welcome;
    if (this.#stateId && !w.stateId.equals(this.#stateId)) {
      this.#stateId = Buffer.from(w.stateId);
      conn.destroy(new ConnectionLostError(`${conn.name} restarted; starting a new session`));
      this.#restarted(conn.name);
      return false;
    }
    this.#stateId = Buffer.from(w.stateId);
    this.#graceMs = w.sessionGraceMs;
    this.#clearGrace();
    this.#conn = conn;
    this.#refOn = this.#wantRef();
    conn.setRef(this.#refOn);
    conn.attach(
      (r) => this.#onFrame(conn, r),
      (err) => this.#onClose(conn, err),
    );
    if (this.#conn !== conn) return true; // it closed at once; #onClose has taken over
    if (w.resumed) {
      // Every unanswered request, with its id, in id order, before anything new.
      for (const call of [...this.#sent.values()]) this.#send(call, !call.notRun);
    } else {
      this.#answersSinceAck = 0;
      this.#ack = undefined;
      for (const call of [...this.#sent.values()]) {
        if (call.notRun || (call.internal && call.spec.op === Op.RELEASE)) {
          this.#send(call, false); // never ran, or safe to run again: send as new
        } else if (call.abandoned) {
          this.#sent.delete(call.id);
          this.#dropAbandoned(call);
        } else {
          this.#sent.delete(call.id);
          this.#fail(
            call,
            new ConnectionLostError(`${call.what}: the connection was lost and ${conn.name} could not resume the session; the request may or may not have run`),
          );
        }
      }
      // CANCELs and ACKs of the ended session mean nothing now.
      for (const c of [...this.#queue]) {
        if (c.internal && c.spec.op !== Op.RELEASE) {
          this.#unqueue(c);
          this.#fail(c, new ConnectionLostError('session ended'));
        }
      }
    }
    const queued = this.#queue.splice(0);
    for (const call of queued) this.#send(call, false);
    this.#startHeartbeat(conn);
    const waiters = this.#connectWaiters.splice(0);
    for (const wt of waiters) wt.resolve();
    this.hooks.onConnect(conn.name);
    return true;
  }

  /** The server's state id changed: every request in flight fails, every lock is lost, a new session starts. */
  #restarted(endpoint: string): void {
    const msg = `${endpoint} restarted (its state id changed): every lock of this client is lost`;
    this.#clearGrace();
    this.#answersSinceAck = 0;
    this.#ack = undefined;
    this.sessionId = newSessionId();
    this.#nextId = 1;
    const sent = [...this.#sent.values()];
    this.#sent.clear();
    const internals = this.#queue.filter((c) => c.internal);
    for (const c of internals) this.#unqueue(c);
    this.hooks.onRestarted(endpoint);
    for (const c of sent) {
      if (c.abandoned) this.#dropAbandoned(c);
      else this.#fail(c, new ServerRestartedError(`${c.what}: ${msg}; the request is not re-sent`));
    }
    for (const c of internals) this.#fail(c, new ServerRestartedError(msg));
  }

  #onClose(conn: Connection, err: TicketingError): void {
    if (conn !== this.#conn) return;
    this.#conn = undefined;
    this.#stopHeartbeat();
    this.#lastError = err;
    // Heartbeats are never re-sent.
    for (const c of [...this.#sent.values()]) {
      if (c.internal && c.spec.op === Op.PING) {
        this.#sent.delete(c.id);
        this.#fail(c, err);
      }
    }
    this.hooks.onDisconnect(err);
    if (this.#closed) return;
    this.#withinGrace = true;
    if (this.#graceMs > 0) {
      this.#graceTimer = setTimeout(() => this.#graceExpired(err), this.#graceMs);
      this.#graceTimer.unref();
    } else {
      this.#graceExpired(err);
    }
    this.#ensureDialing();
  }

  #clearGrace(): void {
    if (this.#graceTimer) clearTimeout(this.#graceTimer);
    this.#graceTimer = undefined;
    this.#withinGrace = false;
  }

  /** The session grace passed since the drop without a reconnect: unanswered requests fail. */
  #graceExpired(cause: TicketingError): void {
    this.#graceTimer = undefined;
    this.#withinGrace = false;
    const grace = this.#graceMs > 0 ? `within the session grace (${this.#graceMs} ms)` : '(the server keeps no session after a drop)';
    for (const call of [...this.#sent.values()]) {
      if (call.internal || call.abandoned) continue;
      // The cause names the endpoint (and the message says it once).
      const err = new ConnectionLostError(`${call.what}: the session was not resumed ${grace} after the connection was lost (${cause.message})`, { cause });
      if (call.spec.op === Op.ACQUIRE) this.abandon(call, err, false);
      else {
        this.#sent.delete(call.id);
        this.#fail(call, err);
      }
    }
  }

  // ---- heartbeat ----

  #startHeartbeat(conn: Connection): void {
    this.#stopHeartbeat();
    const every = this.opts.heartbeatMs;
    if (every <= 0) return;
    const pingWait = Math.min(every, MAX_PING_WAIT_MS);
    const schedule = (ms: number): void => {
      this.#hbTimer = setTimeout(check, Math.max(1, Math.ceil(ms)));
      this.#hbTimer.unref();
    };
    const check = (): void => {
      this.#hbTimer = undefined;
      if (conn !== this.#conn) return;
      const now = performance.now();
      if (this.#hb) {
        const waited = now - this.#hbSent;
        if (waited < pingWait) return schedule(pingWait - waited);
        // Silent (frozen, or cut off): replace the connection; the calls in flight stay in
        // #sent and are re-sent on resume. Its kernel may still accept connections while
        // nothing answers, and the other nodes may still name it as the leader: for
        // SILENT_SKIP_MS it is neither dialled nor followed as a hint, then tried last.
        this.#moveOn(conn);
        this.#silent = conn.endpoint;
        this.#silentTill = performance.now() + SILENT_SKIP_MS;
        conn.destroy(new TimeoutError(`no answer from ${conn.name} to a heartbeat PING within ${pingWait} ms; reconnecting`));
        return;
      }
      // A request made meanwhile shortens the interval: look again within BUSY_HEARTBEAT_MS.
      const interval = this.#sent.size > 0 ? Math.min(every, BUSY_HEARTBEAT_MS) : every;
      const idle = now - conn.lastReceived;
      if (idle < interval) return schedule(Math.min(interval - idle, BUSY_HEARTBEAT_MS));
      this.#hbSent = now;
      const hb: Call = this.#internal({ op: Op.PING, what: 'heartbeat', timeoutMs: 0 }, () => {
        if (this.#hb === hb) this.#hb = undefined;
      });
      this.#hb = hb;
      schedule(pingWait);
    };
    schedule(Math.min(every, BUSY_HEARTBEAT_MS));
  }

  #stopHeartbeat(): void {
    if (this.#hbTimer) clearTimeout(this.#hbTimer);
    this.#hbTimer = undefined;
    this.#hb = undefined;
  }

  // ---- process liveness ----

  /** Keep the process alive while a caller waits for something: an answer, a connect, a close. */
  #wantRef(): boolean {
    return this.#pendingUser > 0 || this.#connectWaiters.length > 0 || this.#closing;
  }

  #updateRef(): void {
    const on = this.#wantRef();
    // Most calls do not change it (one caller after another): tell the connection only a change.
    if (on === this.#refOn && this.#dialConn === undefined && this.#backoffTimer === undefined) return;
    this.#refOn = on;
    this.#conn?.setRef(on);
    this.#dialConn?.setRef(on);
    if (this.#backoffTimer) {
      if (on) this.#backoffTimer.ref();
      else this.#backoffTimer.unref();
    }
  }

  // ---- closing ----

  /** Resolves once no caller waits for an answer and no clean-up is in flight. */
  #idle(): Promise<void> {
    if (this.#pendingUser === 0 && this.#cleanups <= 0) return Promise.resolve();
    return new Promise((resolve) => this.#idleWaiters.push(resolve));
  }

  #checkIdle(): void {
    if (this.#idleWaiters.length > 0 && this.#pendingUser === 0 && this.#cleanups <= 0) {
      const w = this.#idleWaiters.splice(0);
      for (const f of w) f();
    }
  }

  /** Waits (at most `ms`) for every answer and clean-up in flight, then closes. */
  async close(ms: number): Promise<void> {
    if (this.#closed) return;
    this.#closing = true;
    this.#updateRef();
    let timer: NodeJS.Timeout | undefined;
    await Promise.race([this.#idle(), new Promise<void>((r) => (timer = setTimeout(r, ms)))]);
    clearTimeout(timer);
    const conn = this.#conn;
    this.#shutdown(new ClientClosedError('the client was closed before the answer came'));
    if (conn) await conn.end();
  }

  /** Closes at once: every call still waiting rejects with {@link ClientClosedError}. */
  destroy(): void {
    if (this.#closed) return;
    const conn = this.#conn;
    this.#shutdown(new ClientClosedError('the client was destroyed before the answer came'));
    conn?.destroy(new ClientClosedError());
  }

  #shutdown(err: ClientClosedError): void {
    this.#closed = true;
    this.#conn = undefined;
    this.#stopHeartbeat();
    this.#clearGrace();
    this.#dialAbort?.abort();
    this.#wakeBackoff?.();
    for (const w of this.#connectWaiters.splice(0)) w.reject(err);
    const all = [...this.#queue.splice(0), ...this.#sent.values()];
    this.#sent.clear();
    for (const c of all) {
      if (c.abandoned) {
        c.state = 'done';
        if (c.cleanupError) this.#reject(c, c.cleanupError);
        continue;
      }
      this.#fail(c, new ClientClosedError(`${c.what}: ${err.message}`));
    }
    this.#cleanups = 0;
    this.#deadlines.stop();
    this.#checkIdle();
  }
}

function newSessionId(): Buffer {
  for (;;) {
    const id = randomBytes(Sizes.SESSION_ID);
    if (id.some((b) => b !== 0)) return id;
  }
}
