/**
 * One connection to one server: the socket, the handshake, the frame reader, and the table of
 * requests waiting for their answer. Requests are pipelined: any number may be in flight, and
 * each answer is dispatched by its request id. The client above owns reconnects and retries.
 *
 * @module
 */
import { randomBytes } from 'node:crypto';
import * as net from 'node:net';
import * as tls from 'node:tls';
import {
  FrameReader,
  Op,
  Sizes,
  Status,
  VERSION,
  FrameError,
  clientProof,
  decodeChallenge,
  decodeResponse,
  decodeWelcome,
  encodeAuth,
  encodeHello,
  encodeRequest,
  proofEqual,
  serverProof,
  type Request,
  type Response,
} from './protocol.js';
import {
  AuthFailedError,
  BusyError,
  ConnectionLostError,
  ProtocolError,
  ShuttingDownError,
  TicketingError,
  UnsupportedVersionError,
  errorForStatus,
} from './errors.js';

/** A server address. */
export interface Endpoint {
  host: string;
  port: number;
}

/** The default port of a Ticketing server. */
export const DEFAULT_PORT = 7070;

/** Parses `host:port`, `[v6]:port`, or a bare host (port 7070). */
export function parseEndpoint(s: string): Endpoint {
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
      port = Number(text.slice(i + 1));
    }
  }
  if (!host || !Number.isInteger(port) || port <= 0 || port > 65535) throw new TypeError(`invalid endpoint ${JSON.stringify(s)}: want host:port`);
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
  connectTimeout: number;
}

interface Pending {
  resolve(r: Response): void;
  reject(e: Error): void;
}

type State = 'challenge' | 'welcome' | 'ready' | 'closed';

/** One socket after a successful handshake. Create with {@link Connection.open}. */
export class Connection {
  readonly endpoint: Endpoint;
  /** Called for each EXPIRED notice: the lease of `token` on `key` ran out. */
  onExpired: (token: bigint, key: Buffer) => void = () => {};
  /** Called once when the connection closes, with the reason. */
  onClose: (err: TicketingError) => void = () => {};

  readonly #socket: net.Socket;
  readonly #reader: FrameReader;
  readonly #pending = new Map<bigint, Pending>();
  #state: State = 'challenge';
  #corked = false;
  #draining = false;
  #closeReason: TicketingError | undefined;
  readonly #closed: Promise<void>;

  // Handshake.
  readonly #opts: ConnectionOptions;
  readonly #clientNonce = randomBytes(Sizes.NONCE);
  #serverNonce: Buffer = Buffer.alloc(Sizes.NONCE);
  #handshake: { resolve(): void; reject(e: TicketingError): void } | undefined;

  private constructor(opts: ConnectionOptions, socket: net.Socket) {
    this.#opts = opts;
    this.endpoint = opts.endpoint;
    this.#socket = socket;
    this.#reader = new FrameReader((f) => this.#onFrame(f));
    this.#closed = new Promise((resolve) => socket.once('close', () => resolve()));
    socket.on('data', (chunk: Buffer) => {
      try {
        this.#reader.push(chunk);
      } catch (err) {
        const e = err instanceof FrameError ? new ProtocolError(`bad frame from ${this.name}: ${err.message}`, { cause: err }) : (err as Error);
        this.destroy(e instanceof TicketingError ? e : new ProtocolError(String(e), { cause: e }));
      }
    });
    socket.on('error', (err) => this.destroy(new ConnectionLostError(`connection to ${this.name} failed: ${err.message}`, { cause: err })));
    socket.on('close', () => this.destroy(new ConnectionLostError(`connection to ${this.name} closed`)));
  }

  /** `host:port` of the server. */
  get name(): string {
    return formatEndpoint(this.endpoint);
  }

  /** True while requests can be sent. */
  get ready(): boolean {
    return this.#state === 'ready' && !this.#draining;
  }

  /** Requests waiting for their answer. */
  get inflight(): number {
    return this.#pending.size;
  }

  /**
   * Connects and runs the handshake: HELLO, CHALLENGE, AUTH, WELCOME, verifying the server's
   * proof when a token is configured. Rejects with {@link ConnectionLostError} on network
   * failure or timeout, {@link AuthFailedError}, {@link UnsupportedVersionError},
   * {@link BusyError} (connection limit) or {@link ShuttingDownError}.
   */
  static open(opts: ConnectionOptions): Promise<Connection> {
    const { host, port } = opts.endpoint;
    const socket = opts.tls
      ? tls.connect({ host, port, ...(net.isIP(host) ? {} : { servername: host }), ...opts.tls })
      : net.connect({ host, port });
    socket.setNoDelay(true);
    const conn = new Connection(opts, socket);
    return new Promise<Connection>((resolve, reject) => {
      const timer = setTimeout(() => {
        conn.destroy(new ConnectionLostError(`connecting to ${conn.name} timed out after ${opts.connectTimeout} ms`));
      }, opts.connectTimeout);
      conn.#handshake = {
        resolve: () => {
          clearTimeout(timer);
          resolve(conn);
        },
        reject: (e) => {
          clearTimeout(timer);
          reject(e);
        },
      };
      socket.once(opts.tls ? 'secureConnect' : 'connect', () => {
        socket.setKeepAlive(true, 30_000);
        socket.write(encodeHello({ version: VERSION, sessionId: opts.sessionId, nonce: conn.#clientNonce }));
      });
    });
  }

  #onFrame(frame: Buffer): void {
    switch (this.#state) {
      case 'challenge':
        return this.#onChallenge(frame);
      case 'welcome':
        return this.#onWelcome(frame);
      case 'ready':
        return this.#onResponse(frame);
      case 'closed':
        return;
    }
  }

  #onChallenge(frame: Buffer): void {
    const c = decodeChallenge(frame);
    if (c.status === Status.UNSUPPORTED_VERSION) {
      return this.destroy(new UnsupportedVersionError(`${this.name} does not speak protocol version ${VERSION} (it speaks ${c.version})`, c.version));
    }
    if (c.status === Status.BUSY) return this.destroy(new BusyError(`${this.name} refused the connection: too many connections`, 1));
    if (c.status !== Status.OK) return this.destroy(errorForStatus(c.status, 0, Buffer.alloc(0), `connect to ${this.name}`));
    const authRequired = (c.flags & Sizes.CHALLENGE_AUTH_REQUIRED) !== 0;
    const token = this.#opts.token;
    if (token && !authRequired) {
      return this.destroy(
        new AuthFailedError(`${this.name} does not require authentication, but a token is configured: refusing a server that cannot prove it holds the token`),
      );
    }
    this.#serverNonce = Buffer.from(c.nonce);
    const proof = token && authRequired ? clientProof(token, this.#opts.sessionId, this.#clientNonce, this.#serverNonce) : Buffer.alloc(Sizes.PROOF);
    this.#state = 'welcome';
    this.#socket.write(encodeAuth({ proof }));
  }

  #onWelcome(frame: Buffer): void {
    const w = decodeWelcome(frame);
    const token = this.#opts.token;
    if (w.status === Status.AUTH_FAILED) {
      return this.destroy(
        new AuthFailedError(token ? `${this.name} rejected the token (authentication failed)` : `${this.name} requires a token (authentication failed)`),
      );
    }
    if (w.status === Status.SHUTTING_DOWN) return this.destroy(new ShuttingDownError(`${this.name} is shutting down`));
    if (w.status !== Status.OK) return this.destroy(errorForStatus(w.status, 0, Buffer.alloc(0), `connect to ${this.name}`));
    if (token) {
      const want = serverProof(token, this.#opts.sessionId, this.#clientNonce, this.#serverNonce);
      if (!proofEqual(want, w.proof)) {
        return this.destroy(new AuthFailedError(`${this.name} failed to prove that it holds the token (bad server proof)`));
      }
    }
    this.#state = 'ready';
    const h = this.#handshake;
    this.#handshake = undefined;
    h?.resolve();
  }

  #onResponse(frame: Buffer): void {
    const r = decodeResponse(frame);
    if (r.op === Op.EXPIRED && r.id === 0n) {
      try {
        this.onExpired(r.token, Buffer.from(r.data));
      } catch (err) {
        // A throwing 'lost' listener is the application's bug, not the connection's: report it
        // as Node reports any throwing listener, without breaking the stream.
        queueMicrotask(() => {
          throw err;
        });
      }
      return;
    }
    const p = this.#pending.get(r.id);
    if (!p) return; // not ours (or a future push): ignore
    this.#pending.delete(r.id);
    // The data is a view into the read buffer: copy it for whoever keeps it.
    r.data = r.data.length ? Buffer.from(r.data) : Buffer.alloc(0);
    p.resolve(r);
    if (this.#draining && this.#pending.size === 0) this.#end();
  }

  /**
   * Sends a request and resolves with its answer, whatever the status. Rejects only when the
   * connection closes first ({@link ConnectionLostError}).
   */
  request(req: Request): Promise<Response> {
    if (this.#state !== 'ready' || this.#closeReason) {
      return Promise.reject(this.#closeReason ?? new ConnectionLostError(`connection to ${this.name} is not ready`));
    }
    const frame = encodeRequest(req);
    return new Promise<Response>((resolve, reject) => {
      this.#pending.set(req.id, { resolve, reject });
      this.#write(frame);
    });
  }

  #write(frame: Buffer): void {
    // Batch every frame written in this tick into one write.
    if (!this.#corked) {
      this.#corked = true;
      this.#socket.cork();
      process.nextTick(() => {
        this.#corked = false;
        this.#socket.uncork();
      });
    }
    this.#socket.write(frame);
  }

  /** Stops taking new requests and closes once every request in flight has its answer. */
  drain(): Promise<void> {
    if (this.#state === 'closed') return this.#closed;
    this.#draining = true;
    if (this.#pending.size === 0) this.#end();
    return this.#closed;
  }

  #end(): void {
    this.#socket.end();
    // A server that never closes its side must not hold up a graceful close.
    setTimeout(() => this.destroy(), 2000).unref();
  }

  /** Closes at once; every request in flight rejects with `reason`. */
  destroy(reason: TicketingError = new ConnectionLostError(`connection to ${this.name} closed`)): void {
    if (this.#state === 'closed') return;
    this.#state = 'closed';
    this.#closeReason = reason instanceof ConnectionLostError ? reason : new ConnectionLostError(reason.message, { cause: reason });
    this.#socket.destroy();
    const h = this.#handshake;
    this.#handshake = undefined;
    h?.reject(reason);
    const pending = [...this.#pending.values()];
    this.#pending.clear();
    for (const p of pending) p.reject(this.#closeReason);
    this.onClose(reason);
  }

  /** Resolves when the socket has closed. */
  get closed(): Promise<void> {
    return this.#closed;
  }
}
