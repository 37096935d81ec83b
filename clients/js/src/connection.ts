/**
 * One connection to one server: the socket (TCP or TLS), the handshake (HELLO, CHALLENGE, AUTH,
 * WELCOME) with both proofs, and the frame reader. What the frames mean is the session's
 * business (session.ts): this module only delivers decoded responses and reports the close.
 *
 * @module
 * @internal
 */
import { randomBytes } from 'node:crypto';
import * as net from 'node:net';
import { performance } from 'node:perf_hooks';
import * as tls from 'node:tls';
import {
  AuthFailedError,
  BusyError,
  ClientClosedError,
  ConnectionLostError,
  NotLeaderError,
  ProtocolError,
  ShuttingDownError,
  TicketingError,
  TlsError,
  UnavailableError,
  UnsupportedVersionError,
  errorForStatus,
} from './errors.js';
import {
  FrameError,
  FrameReader,
  Sizes,
  Status,
  VERSION,
  challengeFrameSize,
  clientProof,
  decodeChallenge,
  HEADER_SIZE,
  decodeWelcome,
  encodeAuth,
  encodeHello,
  fieldName,
  limitName,
  proofEqual,
  serverProof,
  statusName,
  type Response,
} from './protocol.js';

/** The big-endian u32 at `off` (plain byte loads: the reader has checked the frame's length). */
function get32(b: Buffer, off: number): number {
  return ((b[off]! << 24) | (b[off + 1]! << 16) | (b[off + 2]! << 8) | b[off + 3]!) >>> 0;
}

/** A u64 of an answer (ids and tokens below 2^53, the usual, as one bigint from a number). */
function getU64(b: Buffer, off: number): bigint {
  const hi = get32(b, off);
  const lo = get32(b, off + 4);
  if (hi < 0x200000) return hi === 0 && lo === 0 ? 0n : BigInt(hi * 0x100000000 + lo);
  return b.readBigUInt64BE(off);
}

/**
 * A response frame as the session sees it: a {@link Response} whose request id is a number (the
 * session's ids start at 1 and would need centuries to pass 2^53; an id at or above it cannot be
 * one of ours, and reads as -1).
 */
export interface Reply extends Omit<Response, 'id'> {
  id: number;
}

/**
 * The whole response frame of `size` bytes at `off` in `b` (the reader checked its length field
 * against the limits), as {@link decodeResponse} decodes it, with its data copied out of `b`.
 */
function readReply(b: Buffer, off: number, size: number): Reply {
  const n = size - HEADER_SIZE;
  if (((b[off + 6]! << 8) | b[off + 7]!) !== n) throw new FrameError('length', 'key/data length disagrees with the frame length');
  const hi = get32(b, off + 8);
  return {
    op: b[off + 4]!,
    status: b[off + 5]!,
    id: hi < 0x200000 ? hi * 0x100000000 + get32(b, off + 12) : -1,
    token: getU64(b, off + 16),
    leaseMs: get32(b, off + 24),
    detail: get32(b, off + 28),
    // The data is a view into the read buffer: copy it for whoever keeps it.
    data: n > 0 ? Buffer.from(b.subarray(off + HEADER_SIZE, off + size)) : NO_DATA,
  };
}

/** Resolved: `.then` on it queues a microtask (the end-of-tick write of {@link Connection.write}). */
const RESOLVED = Promise.resolve();

/** The read buffer of a plain TCP connection (one per connection). */
const READ_BUFFER = 64 * 1024;

/** The data of an answer that carries none (a zero-length buffer can be shared). */
const NO_DATA = Buffer.alloc(0);

/** A server address. */
export interface Endpoint {
  host: string;
  port: number;
}

/** The default port of a Ticketing server. */
export const DEFAULT_PORT = 7070;

/**
 * Once TCP is connected, TLS and the protocol handshake must finish within this many ms (or the
 * connect timeout, if shorter): a frozen node's kernel still accepts connections, and the next
 * endpoint should not wait for the whole connect timeout behind it (docs/clients.md).
 */
export const HANDSHAKE_WAIT_MS = 2_000;

/** Parses `host:port`, `[v6]:port`, or a bare host (port 7070); `undefined` when it is not an address. */
export function tryParseEndpoint(s: string): Endpoint | undefined {
  const text = s.trim();
  let host = text;
  let port = DEFAULT_PORT;
  const v6 = /^\[([^\]]+)\](?::(\d+))?$/.exec(text);
  if (v6) {
    host = v6[1]!;
    if (v6[2] !== undefined) port = Number(v6[2]);
  } else {
    const i = text.lastIndexOf(':');
    if (i >= 0 && text.indexOf(':') === i) {
      host = text.slice(0, i);
      port = /^\d+$/.test(text.slice(i + 1)) ? Number(text.slice(i + 1)) : NaN;
    }
  }
  if (!host || /\s/.test(host) || !Number.isInteger(port) || port <= 0 || port > 65535) return undefined;
  return { host, port };
}

/** Formats an endpoint as `host:port` (`[v6]:port`). */
export function formatEndpoint(e: Endpoint): string {
  return net.isIPv6(e.host) ? `[${e.host}]:${e.port}` : `${e.host}:${e.port}`;
}

/** What a connection needs to open. */
export interface ConnectionOptions {
  endpoint: Endpoint;
  sessionId: Buffer;
  token: Buffer | undefined;
  tls: tls.ConnectionOptions | undefined;
  connectTimeoutMs: number;
  /** Whether the socket (and the handshake timer) keep the process alive. */
  ref: boolean;
  /** Aborting it abandons the attempt. */
  signal?: AbortSignal;
  /** Called at once with the connection being opened (so that its caller can change its ref). */
  onOpening?: (conn: Connection) => void;
}

/** What WELCOME said. */
export interface WelcomeInfo {
  resumed: boolean;
  sessionGraceMs: number;
  stateId: Buffer;
}

type State = 'tcp' | 'challenge' | 'welcome' | 'ready' | 'closed';

// Socket errors that mean "nobody reachable there" (before the TCP connection is up).
const UNREACHABLE = new Set(['ECONNREFUSED', 'EHOSTUNREACH', 'ENETUNREACH', 'ENOTFOUND', 'EAI_AGAIN', 'EAI_NONAME', 'EADDRNOTAVAIL', 'ETIMEDOUT', 'ECONNRESET', 'EPIPE']);

const UNREACHABLE_TEXT: Record<string, string> = {
  ECONNREFUSED: 'connection refused',
  EHOSTUNREACH: 'host unreachable',
  ENETUNREACH: 'network unreachable',
  ENOTFOUND: 'host not found',
  EAI_AGAIN: 'the host name could not be resolved now',
  EAI_NONAME: 'host not found',
  EADDRNOTAVAIL: 'address not available',
  ETIMEDOUT: 'the TCP connection timed out',
  ECONNRESET: 'connection reset',
  EPIPE: 'connection closed (broken pipe)',
};

function isTlsFailure(err: NodeJS.ErrnoException): boolean {
  const code = err.code ?? '';
  return (
    code.startsWith('ERR_SSL') ||
    code.startsWith('ERR_TLS') ||
    code.startsWith('CERT_') ||
    code.includes('CERT') ||
    code === 'UNABLE_TO_VERIFY_LEAF_SIGNATURE' ||
    code === 'UNABLE_TO_GET_ISSUER_CERT_LOCALLY' ||
    code === 'HOSTNAME_MISMATCH'
  );
}

/** An error message on one line (OpenSSL's end with a newline). */
function oneLine(s: string): string {
  return s.replace(/\s*[\r\n]+\s*/g, ' ').trim();
}

/** One socket after (or during) the handshake. Create with {@link Connection.open}. */
export class Connection {
  /** The server this connection goes to. */
  readonly endpoint: Endpoint;
  /** What WELCOME said; set once the handshake succeeded. */
  welcome!: WelcomeInfo;
  /** Monotonic ms (performance.now()) when bytes last arrived. */
  lastReceived = performance.now();

  readonly #socket: net.Socket | tls.TLSSocket;
  readonly #reader: FrameReader;
  readonly #opts: ConnectionOptions;
  #state: State = 'tcp';
  #tcpUp = false;
  #secure = false;
  /**
   * Frames written in this tick, whose write is queued (a microtask): the first, and the others
   * after it (usually none: no array to grow and empty for one caller's frame).
   */
  #first: Buffer | undefined;
  #more: Buffer[] | undefined;
  /**
   * The next frame may be written at once, alone: the latest read carried one answer, and no
   * frame has been written since (see {@link Connection.write}).
   */
  #writeNow = false;
  #closeReason: TicketingError | undefined;
  #handshakeTimer: NodeJS.Timeout | undefined;
  /** Whether the socket and the handshake timer keep the process alive. */
  #ref = true;
  #handshake: { resolve(): void; reject(e: TicketingError): void } | undefined;
  readonly #clientNonce = randomBytes(Sizes.NONCE);
  #serverNonce: Buffer = Buffer.alloc(Sizes.NONCE);
  #authRequired = false;
  // Frames (and the close) that arrive after WELCOME but before the session attached.
  #early: Reply[] = [];
  #onFrame: ((r: Reply) => void) | undefined;
  #onClose: ((err: TicketingError) => void) | undefined;
  readonly #closed: Promise<void>;

  private constructor(opts: ConnectionOptions, socket: net.Socket | tls.TLSSocket) {
    this.#opts = opts;
    this.endpoint = opts.endpoint;
    this.#socket = socket;
    this.#reader = new FrameReader((f) => this.#frame(f));
    this.#closed = new Promise((resolve) => socket.once('close', () => resolve()));
    if (opts.tls) socket.on('data', (chunk: Buffer) => this.#data(chunk));
    socket.on('error', (err: NodeJS.ErrnoException) => this.destroy(this.#classify(err)));
    socket.on('close', () => this.destroy(this.#closedError()));
  }

  /** `host:port` of the server. */
  get name(): string {
    return formatEndpoint(this.endpoint);
  }

  /** True after WELCOME OK and until the connection closes. */
  get ready(): boolean {
    return this.#state === 'ready';
  }

  /**
   * Connects and runs the handshake, verifying the server's proof when a token is configured.
   * Rejects with {@link UnavailableError} (refused, unreachable, TCP timeout, the connection
   * closed during the handshake, or a node that is not the leader: then its `cause` is a
   * {@link NotLeaderError} with the leader hint, or no answer within the connect timeout, the
   * TLS or protocol handshake included), {@link TlsError}, {@link AuthFailedError},
   * {@link UnsupportedVersionError}, {@link BusyError}, {@link ShuttingDownError} or
   * {@link ProtocolError}.
   */
  static open(opts: ConnectionOptions): Promise<Connection> {
    const { host, port } = opts.endpoint;
    // Plain TCP reads into one buffer per connection, handed to the frame reader as it fills
    // (no stream machinery, no new buffer per read); TLS goes through the stream's 'data'.
    let reader: Connection | undefined;
    const socket = opts.tls
      ? tls.connect({ host, port, ...(net.isIP(host) ? {} : { servername: host }), ...opts.tls })
      : net.connect({
          host,
          port,
          onread: {
            buffer: Buffer.allocUnsafe(READ_BUFFER),
            callback: (n: number, buf: Uint8Array): boolean => {
              if (reader) reader.#read(n, buf as Buffer);
              return true;
            },
          },
        });
    const conn = new Connection(opts, socket);
    reader = conn;
    conn.#ref = opts.ref;
    if (!opts.ref) socket.unref();
    opts.onOpening?.(conn);
    return new Promise<Connection>((resolve, reject) => {
      const onAbort = (): void => conn.destroy(new ClientClosedError(`connecting to ${conn.name}: the client was closed`));
      opts.signal?.addEventListener('abort', onAbort, { once: true });
      conn.#handshake = {
        resolve: () => {
          opts.signal?.removeEventListener('abort', onAbort);
          resolve(conn);
        },
        reject: (e) => {
          opts.signal?.removeEventListener('abort', onAbort);
          reject(e);
        },
      };
      // A connect that runs out of time is UnavailableError at every stage (docs/clients.md rule 1:
      // a handshake that times out is unavailable); TimeoutError is a call's own timeout.
      const started = performance.now();
      const arm = (ms: number, afterTcp: boolean): void => {
        if (conn.#handshakeTimer) clearTimeout(conn.#handshakeTimer);
        conn.#handshakeTimer = setTimeout(() => {
          const within = `within ${ms} ms${afterTcp ? ' of the TCP connection' : ''}`;
          const msg =
            conn.#state !== 'tcp'
              ? `connecting to ${conn.name}: no handshake answer ${within}${conn.#plaintextHint() || ' (is the server frozen?)'}`
              : conn.#tcpUp
                ? `connecting to ${conn.name}: the TLS handshake did not complete ${within} (is the server using TLS?)`
                : `connecting to ${conn.name} timed out after ${ms} ms (the TCP connection did not complete)`;
          conn.destroy(new UnavailableError(msg));
        }, ms);
        if (!conn.#ref) conn.#handshakeTimer.unref();
      };
      arm(opts.connectTimeoutMs, false);
      socket.once('connect', () => {
        conn.#tcpUp = true;
        // TLS and the handshake get at most HANDSHAKE_WAIT_MS once TCP is up (a frozen node).
        const left = opts.connectTimeoutMs - (performance.now() - started);
        if (conn.#state !== 'closed' && HANDSHAKE_WAIT_MS < left) arm(HANDSHAKE_WAIT_MS, true);
        socket.setNoDelay(true);
        socket.setKeepAlive(true, 10_000);
        if (!opts.tls) conn.#sendHello();
      });
      if (opts.tls) {
        socket.once('secureConnect', () => {
          conn.#secure = true;
          conn.#sendHello();
        });
      }
    });
  }

  #sendHello(): void {
    if (this.#state !== 'tcp') return;
    this.#state = 'challenge';
    this.#socket.write(encodeHello({ version: VERSION, sessionId: this.#opts.sessionId, nonce: this.#clientNonce }));
  }

  /**
   * Receives frames after the handshake: first those that arrived early, then each as it
   * comes. `onClose` is called once, when the connection closes (at once if it already has).
   */
  attach(onFrame: (r: Reply) => void, onClose: (err: TicketingError) => void): void {
    this.#onFrame = onFrame;
    this.#onClose = onClose;
    const early = this.#early;
    this.#early = [];
    for (const r of early) {
      if (this.#onFrame !== onFrame) break; // detached meanwhile
      onFrame(r);
    }
    if (this.#state === 'closed') onClose(this.#closeReason!);
  }

  /** Whether the socket (and the handshake timer) keep the process alive. */
  setRef(on: boolean): void {
    if (this.#state === 'closed' || on === this.#ref) return;
    this.#ref = on;
    if (on) {
      this.#socket.ref();
      this.#handshakeTimer?.ref();
    } else {
      this.#socket.unref();
      this.#handshakeTimer?.unref();
    }
  }

  /** `n` bytes were read into `buf`, which the next read reuses: the reader copies what it keeps past this call. */
  #read(n: number, buf: Buffer): void {
    if (this.#state === 'ready' && this.#reader.buffered === 0) {
      // The usual read after the handshake: whole answers, decoded where they lie (no view per
      // read or per frame); only a frame cut off at the end goes to the reader, as a copy.
      this.lastReceived = performance.now();
      // One whole frame: the request it prompts may be written at once (see write).
      this.#writeNow = n >= 4 && n === 4 + get32(buf, 0);
      let off = 0;
      try {
        while (n - off >= 4) {
          const l = get32(buf, off);
          if (l < HEADER_SIZE - 4) throw new FrameError('length', `frame length ${l} is below the header`);
          if (l > HEADER_SIZE - 4 + Sizes.MAX_DATA_LEN) throw new FrameError('too_large', `frame length ${l} is above the limit`);
          if (n - off < 4 + l) break;
          this.#reply(buf, off, 4 + l);
          if (this.#state !== 'ready') return; // closed by what the frame said (or by its handler)
          off += 4 + l;
        }
        if (off < n) this.#reader.push(Buffer.from(buf.subarray(off, n)));
      } catch (err) {
        const msg = err instanceof Error ? err.message : String(err);
        this.destroy(new ProtocolError(`bad frame from ${this.name}: ${msg}`, { cause: err }));
      }
      return;
    }
    const chunk = buf.subarray(0, n);
    // A frame begun in an earlier read is kept in parts: this one joins it, so it must be a copy.
    this.#data(this.#reader.buffered > 0 ? Buffer.from(chunk) : chunk);
  }

  #data(chunk: Buffer): void {
    this.lastReceived = performance.now();
    this.#writeNow = this.#reader.buffered === 0 && chunk.length >= 4 && chunk.length === 4 + get32(chunk, 0);
    if (this.#state === 'closed') return;
    if (this.#state === 'challenge' && !this.#secure && this.#reader.buffered === 0 && chunk.length >= 2 && (chunk[0] === 0x15 || chunk[0] === 0x16) && chunk[1] === 0x03) {
      // A TLS record (alert or handshake) where CHALLENGE should be.
      this.destroy(new TlsError(`${this.name} answered with TLS: is the server using TLS? (set the tls option)`));
      return;
    }
    try {
      if (this.#state === 'challenge' && this.#reader.buffered === 0 && chunk.length >= 4) challengeFrameSize(chunk);
      this.#reader.push(chunk);
    } catch (err) {
      const msg = err instanceof Error ? err.message : String(err);
      this.destroy(new ProtocolError(`bad frame from ${this.name}: ${msg}`, { cause: err }));
    }
  }

  #frame(frame: Buffer): void {
    try {
      switch (this.#state) {
        case 'challenge':
          return this.#onChallenge(frame);
        case 'welcome':
          return this.#onWelcome(frame);
        case 'ready':
          return this.#reply(frame, 0, frame.length);
        default:
          return;
      }
    } catch (err) {
      if (err instanceof FrameError) {
        this.destroy(new ProtocolError(`bad ${this.#state === 'ready' ? 'frame' : 'handshake frame'} from ${this.name}: ${err.message}`, { cause: err }));
        return;
      }
      throw err;
    }
  }

  /** Hands the answer of `size` bytes at `off` in `b` to the session (or keeps it until the session attaches). */
  #reply(b: Buffer, off: number, size: number): void {
    const r = readReply(b, off, size);
    if (this.#onFrame) this.#onFrame(r);
    else this.#early.push(r);
  }

  #onChallenge(frame: Buffer): void {
    const c = decodeChallenge(frame);
    const text = Buffer.from(c.data).toString('utf8').replace(/[\r\n]+/g, ' ');
    const why = text ? `: ${text}` : '';
    switch (c.status) {
      case Status.OK:
        break;
      case Status.UNSUPPORTED_VERSION:
        return this.destroy(new UnsupportedVersionError(`${this.name} does not speak protocol version ${VERSION} (it speaks ${c.version})`, c.version));
      case Status.BUSY:
        return this.destroy(new BusyError(`${this.name} refused the connection: server busy (${limitName(c.detail)})${why}`, c.detail));
      case Status.SHUTTING_DOWN:
        return this.destroy(new ShuttingDownError(`${this.name} refused the connection: the server is shutting down`));
      case Status.NOT_LEADER:
        return this.destroy(this.#notLeader(text));
      case Status.INVALID:
        return this.destroy(new ProtocolError(`${this.name} refused the HELLO: invalid ${fieldName(c.detail)}${why}`));
      default:
        return this.destroy(new ProtocolError(`${this.name} answered HELLO with status ${statusName(c.status)}${why}`));
    }
    this.#authRequired = (c.flags & Sizes.CHALLENGE_AUTH_REQUIRED) !== 0;
    const token = this.#opts.token;
    if (token && !this.#authRequired) {
      return this.destroy(
        new AuthFailedError(`${this.name} does not require authentication, but a token is configured: refusing a server that cannot prove it holds the token`),
      );
    }
    this.#serverNonce = Buffer.from(c.nonce);
    const proof = token && this.#authRequired ? clientProof(token, this.#opts.sessionId, this.#clientNonce, this.#serverNonce) : Buffer.alloc(Sizes.PROOF);
    this.#state = 'welcome';
    this.#socket.write(encodeAuth({ proof }));
  }

  #onWelcome(frame: Buffer): void {
    const w = decodeWelcome(frame);
    const token = this.#opts.token;
    switch (w.status) {
      case Status.OK:
        break;
      case Status.AUTH_FAILED:
        return this.destroy(
          new AuthFailedError(
            token ? `${this.name} rejected the token (authentication failed)` : `${this.name} requires a token: authentication failed (set the token option)`,
          ),
        );
      case Status.BUSY:
        return this.destroy(new BusyError(`${this.name} refused the session: server busy (${limitName(w.detail)})`, w.detail));
      case Status.SHUTTING_DOWN:
        return this.destroy(new ShuttingDownError(`${this.name} refused the session: the server is shutting down`));
      case Status.NOT_LEADER:
        return this.destroy(this.#notLeader(''));
      default:
        return this.destroy(errorForStatus(w.status, w.detail, Buffer.alloc(0), `handshake with ${this.name}`));
    }
    if (token && this.#authRequired) {
      const want = serverProof(token, this.#opts.sessionId, this.#clientNonce, this.#serverNonce, frame);
      if (!proofEqual(want, w.proof)) {
        return this.destroy(new AuthFailedError(`${this.name} failed to prove that it holds the token (bad server proof)`));
      }
    }
    this.welcome = {
      resumed: (w.flags & Sizes.WELCOME_RESUMED) !== 0,
      sessionGraceMs: w.sessionGraceMs,
      stateId: Buffer.from(w.stateId),
    };
    this.#state = 'ready';
    if (this.#handshakeTimer) clearTimeout(this.#handshakeTimer);
    const h = this.#handshake;
    this.#handshake = undefined;
    h?.resolve();
  }

  /**
   * A node that is not the leader refused the connection: like any failed connect, that is
   * {@link UnavailableError} (every client reports it so; the session follows the hint and
   * retries). The {@link NotLeaderError} with the hint (`''` when none) is its `cause`.
   */
  #notLeader(hint: string): UnavailableError {
    const why = `not the leader${hint ? `; leader is ${hint}` : ', and it knows no leader'}`;
    return new UnavailableError(`cannot connect to ${this.name}: ${why}`, { cause: new NotLeaderError(`${this.name} is ${why}`, hint) });
  }

  // A connect that fails short of an auth, TLS or protocol error is UnavailableError, as in every
  // client (the session retries it while it reconnects); once ready, a drop is ConnectionLostError.
  #classify(err: NodeJS.ErrnoException): TicketingError {
    const code = err.code ? ` (${err.code})` : '';
    const msg = oneLine(err.message);
    if (this.#state === 'ready') return new ConnectionLostError(`connection to ${this.name} lost: ${msg}`, { cause: err });
    if (isTlsFailure(err)) return new TlsError(`TLS with ${this.name} failed: ${msg}${code}`, { cause: err });
    if (!this.#tcpUp && UNREACHABLE.has(err.code ?? '')) {
      // Node's message repeats the address ("connect ECONNREFUSED 127.0.0.1:7070"): say what happened once.
      const what = UNREACHABLE_TEXT[err.code!] ?? msg.split(`${this.endpoint.host}:${this.endpoint.port}`).join('').trim();
      return new UnavailableError(`cannot connect to ${this.name}: ${what}${code}`, { cause: err });
    }
    if (this.#opts.tls && !this.#secure) {
      return new TlsError(`TLS handshake with ${this.name} failed: ${msg}${code} (is the server using TLS?)`, { cause: err });
    }
    if (this.#refusedAfterTls()) return new TlsError(`${this.name} reset the connection right after the TLS handshake${this.#certHint()}`, { cause: err });
    return new UnavailableError(`connection to ${this.name} failed during the handshake: ${msg}${this.#plaintextHint()}`, { cause: err });
  }

  #closedError(): TicketingError {
    if (this.#state === 'ready') return new ConnectionLostError(`connection to ${this.name} closed by the server`);
    if (!this.#tcpUp) return new UnavailableError(`cannot connect to ${this.name}: connection closed`);
    if (this.#opts.tls && !this.#secure) return new TlsError(`TLS handshake with ${this.name} failed: the server closed the connection (is the server using TLS?)`);
    if (this.#refusedAfterTls()) return new TlsError(`${this.name} closed the connection right after the TLS handshake${this.#certHint()}`);
    return new UnavailableError(`${this.name} closed the connection during the handshake${this.#plaintextHint()}`);
  }

  /** A plaintext connection closed before CHALLENGE came: perhaps the server speaks TLS. */
  #plaintextHint(): string {
    return !this.#opts.tls && this.#state === 'challenge' ? ' (is the server using TLS?)' : '';
  }

  /**
   * A TLS connection closed after the TLS handshake, before any CHALLENGE: the signature of a
   * server that refused the client certificate (normally it says so with an alert, which is a
   * TLS failure above; a reset can swallow the alert).
   */
  #refusedAfterTls(): boolean {
    return Boolean(this.#opts.tls) && this.#secure && this.#state === 'challenge' && this.#reader.buffered === 0;
  }

  #certHint(): string {
    return this.#opts.tls?.cert ? ' (was the client certificate refused?)' : ' (does the server require a client certificate?)';
  }

  /**
   * Sends a frame, in order after those before it. Frames written in one tick go out in one
   * write, from a microtask at the end of the tick; except the first after a read that carried a
   * single answer, which is written at once: a lone caller's next request (one caller, or calls
   * one at a time) goes out without waiting for the tick's end, while a read that carried several
   * answers (several callers resumed at once) still gives one write for all their requests.
   *
   * (A microtask, not process.nextTick: in Node 20 every run of the tick queue also allocates
   * a Map for unhandled rejections, and answers settle callers in microtasks anyway.)
   */
  write(frame: Buffer): void {
    if (this.#state !== 'ready') return;
    if (this.#first === undefined) {
      if (this.#writeNow) {
        this.#writeNow = false;
        this.#socket.write(frame);
        return;
      }
      this.#first = frame;
      void RESOLVED.then(this.#flush);
    } else (this.#more ??= []).push(frame);
  }

  /** Writes the frames queued in this tick: one buffer, one write (a closed connection drops them). */
  readonly #flush = (): void => {
    const first = this.#first;
    if (first === undefined) return;
    const more = this.#more;
    this.#first = this.#more = undefined;
    const data = more === undefined ? first : Buffer.concat([first, ...more]);
    // (A write to a socket that failed reports the error as an event: it does not throw here.)
    if (this.#state === 'ready') this.#socket.write(data);
  };

  /**
   * Ends the connection gracefully (after the frames already written), destroying it if the
   * server does not close within `ms`. Keeps the process alive until then: someone awaits it.
   */
  end(ms = 1000): Promise<void> {
    if (this.#state !== 'closed') {
      this.#flush(); // the frames of this tick first
      this.#onFrame = () => {};
      this.#ref = true;
      this.#socket.ref();
      this.#socket.end();
      const timer = setTimeout(() => this.destroy(), ms);
      void this.#closed.then(() => clearTimeout(timer));
    }
    return this.#closed;
  }

  /** Closes at once and reports `reason` (once) to the close handler, or to the pending handshake. */
  destroy(reason?: TicketingError): void {
    if (this.#state === 'closed') return;
    const wasReady = this.#state === 'ready';
    this.#state = 'closed';
    this.#closeReason = reason ?? new ConnectionLostError(`connection to ${this.name} closed`);
    if (this.#handshakeTimer) clearTimeout(this.#handshakeTimer);
    this.#socket.destroy();
    const h = this.#handshake;
    this.#handshake = undefined;
    h?.reject(this.#closeReason);
    if (wasReady) this.#onClose?.(this.#closeReason);
  }

  /** Resolves when the socket has closed. */
  get closed(): Promise<void> {
    return this.#closed;
  }
}
