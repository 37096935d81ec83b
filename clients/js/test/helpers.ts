// Shared test helpers: the repository's vectors, the real server binary, and a scriptable fake
// server for the cases a real server cannot produce on demand.
import { execFileSync, spawn, type ChildProcess } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { existsSync, mkdtempSync, readFileSync, rmSync } from 'node:fs';
import * as net from 'node:net';
import { tmpdir } from 'node:os';
import { dirname, join, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';
import {
  FrameReader,
  Op,
  Sizes,
  Status,
  decodeAuth,
  decodeHello,
  decodeRequest,
  encodeChallenge,
  encodeResponse,
  encodeWelcome,
  serverProof,
  clientProof,
  proofEqual,
  type Request,
  type Response,
} from '@ticketing/client/protocol';

/** The repository root: the nearest directory above this file that holds PROTOCOL.md. */
export const repoRoot: string = (() => {
  let dir = dirname(fileURLToPath(import.meta.url));
  for (;;) {
    if (existsSync(join(dir, 'PROTOCOL.md')) && existsSync(join(dir, 'protocol', 'vectors.json'))) return dir;
    const up = dirname(dir);
    if (up === dir) throw new Error('repository root (PROTOCOL.md) not found above the tests');
    dir = up;
  }
})();

/** The client package's directory (clients/js). */
export const packageDir = resolve(repoRoot, 'clients', 'js');

export function readJSON<T = any>(rel: string): T {
  return JSON.parse(readFileSync(join(repoRoot, rel), 'utf8')) as T;
}

export const hex = (s: string): Buffer => Buffer.from(s, 'hex');

// ---- The real server ----

let builtBin: string | undefined;

/** The server binary: $TICKETING_BIN, or built once per process with `go build`. */
export function serverBinary(): string {
  if (process.env.TICKETING_BIN) return resolve(process.env.TICKETING_BIN);
  if (builtBin) return builtBin;
  const dir = mkdtempSync(join(tmpdir(), 'ticketing-js-bin-'));
  const bin = join(dir, 'ticketing');
  execFileSync('go', ['build', '-o', bin, './cmd/ticketing'], { cwd: repoRoot, stdio: ['ignore', 'inherit', 'inherit'], timeout: 180_000 });
  process.on('exit', () => rmSync(dir, { recursive: true, force: true }));
  builtBin = bin;
  return bin;
}

export interface ServerOptions {
  token?: string;
  tls?: boolean;
  env?: Record<string, string>;
}

export interface RunningServer {
  /** `127.0.0.1:PORT` */
  addr: string;
  port: number;
  proc: ChildProcess;
  /** Everything the server wrote to stderr so far. */
  log(): string;
  /** SIGTERM, then SIGKILL after 5 s; resolves when the process has exited. */
  stop(): Promise<void>;
}

/** Paths of the test-only TLS material. */
export const tlsFiles = {
  ca: join(repoRoot, 'testdata', 'tls', 'ca.pem'),
  cert: join(repoRoot, 'testdata', 'tls', 'server.pem'),
  key: join(repoRoot, 'testdata', 'tls', 'server.key'),
};

/** Starts `ticketing server` on a free loopback port and waits (bounded) for its `msg=listening` line. */
export async function startServer(opts: ServerOptions = {}): Promise<RunningServer> {
  const bin = serverBinary();
  const dataDir = mkdtempSync(join(tmpdir(), 'ticketing-js-data-'));
  const env: Record<string, string> = {
    ...(process.env as Record<string, string>),
    TICKETING_ADDR: '127.0.0.1:0',
    TICKETING_DATA_DIR: dataDir,
    ...(opts.token ? { TICKETING_TOKEN: opts.token } : {}),
    ...(opts.tls ? { TICKETING_TLS_CERT: tlsFiles.cert, TICKETING_TLS_KEY: tlsFiles.key } : {}),
    ...opts.env,
  };
  if (!opts.token) delete env.TICKETING_TOKEN;
  const proc = spawn(bin, ['server'], { env, stdio: ['ignore', 'ignore', 'pipe'] });
  let log = '';
  const exited = new Promise<void>((res) => proc.once('exit', () => res()));
  const port = await new Promise<number>((res, rej) => {
    const timer = setTimeout(() => rej(new Error(`server did not log msg=listening within 15 s; stderr:\n${log}`)), 15_000);
    proc.stderr!.setEncoding('utf8');
    proc.stderr!.on('data', (s: string) => {
      log += s;
      for (const line of log.split('\n')) {
        if (!line.includes('msg=listening')) continue;
        const m = /addr=(?:"?)127\.0\.0\.1:(\d+)/.exec(line);
        if (m) {
          clearTimeout(timer);
          res(Number(m[1]));
        }
      }
    });
    proc.once('exit', (code, sig) => {
      clearTimeout(timer);
      rej(new Error(`server exited (${code ?? sig}) before listening; stderr:\n${log}`));
    });
  });
  return {
    addr: `127.0.0.1:${port}`,
    port,
    proc,
    log: () => log,
    async stop() {
      if (proc.exitCode === null && proc.signalCode === null) {
        proc.kill('SIGTERM');
        const t = setTimeout(() => proc.kill('SIGKILL'), 5_000);
        await exited;
        clearTimeout(t);
      }
      rmSync(dataDir, { recursive: true, force: true });
    },
  };
}

// ---- A scriptable fake server ----

export interface FakeConn {
  socket: net.Socket;
  sessionId: Buffer;
  /** Requests received, in order. */
  requests: (Request & { key: Buffer })[];
  /** Sends a response frame. */
  send(r: Partial<Response> & { op: number; id: bigint }): void;
  /** Resolves with the next request matching `pred` (already received ones included). */
  next(pred?: (r: Request) => boolean): Promise<Request & { key: Buffer }>;
}

export interface FakeServerOptions {
  /** The token the fake server holds (AUTH_REQUIRED when set). */
  token?: string;
  /** Set AUTH_REQUIRED without holding a token (and send a bogus proof). */
  bogusProof?: boolean;
  /** CHALLENGE status to answer with (default OK). */
  challengeStatus?: number;
  /** WELCOME status to answer with (default: OK, or AUTH_FAILED on a bad proof). */
  welcomeStatus?: number;
  /** Called for every request after the handshake; the default answers PING/RELEASE/EXTEND/CANCEL OK and grants ACQUIRE. */
  onRequest?: (c: FakeConn, r: Request & { key: Buffer }) => void;
}

export interface FakeServer {
  addr: string;
  conns: FakeConn[];
  /** Resolves with the n-th connection (0-based) once it completed the handshake. */
  conn(n: number): Promise<FakeConn>;
  close(): Promise<void>;
}

let fakeToken = 100n;

/** A default answer to `r`: OK for everything, ACQUIRE granted with a fresh token. */
export function defaultAnswer(c: FakeConn, r: Request): void {
  if (r.op === Op.ACQUIRE) c.send({ op: r.op, id: r.id, token: ++fakeToken, leaseMs: r.leaseMs ?? 0 });
  else if (r.op === Op.EXTEND) c.send({ op: r.op, id: r.id, token: r.token ?? 0n, leaseMs: r.leaseMs ?? 0 });
  else c.send({ op: r.op, id: r.id });
}

export async function fakeServer(opts: FakeServerOptions = {}): Promise<FakeServer> {
  const conns: FakeConn[] = [];
  const waiters: { n: number; res: (c: FakeConn) => void }[] = [];
  const sockets = new Set<net.Socket>();
  const server = net.createServer((socket) => {
    sockets.add(socket);
    socket.on('close', () => sockets.delete(socket));
    socket.on('error', () => {});
    let state: 'hello' | 'auth' | 'ready' = 'hello';
    let hello: ReturnType<typeof decodeHello> | undefined;
    const serverNonce = opts.token || opts.bogusProof ? randomBytes(32) : Buffer.alloc(32);
    const taken = new Set<Request>();
    const reqWaiters: { pred: (r: Request) => boolean; res: (r: Request & { key: Buffer }) => void }[] = [];
    const c: FakeConn = {
      socket,
      sessionId: Buffer.alloc(16),
      requests: [],
      send(r) {
        if (!socket.destroyed) {
          socket.write(encodeResponse({ status: Status.OK, token: 0n, leaseMs: 0, detail: 0, ...r }));
        }
      },
      next(pred = () => true) {
        const seen = c.requests.find((r) => pred(r) && !taken.has(r));
        if (seen) {
          taken.add(seen);
          return Promise.resolve(seen);
        }
        return new Promise((res) =>
          reqWaiters.push({
            pred,
            res: (r) => {
              taken.add(r);
              res(r);
            },
          }),
        );
      },
    };
    const reader = new FrameReader((f) => {
      if (state === 'hello') {
        hello = decodeHello(f);
        c.sessionId = Buffer.from(hello.sessionId);
        const flags = opts.token || opts.bogusProof ? Sizes.CHALLENGE_AUTH_REQUIRED : 0;
        socket.write(encodeChallenge({ status: opts.challengeStatus ?? Status.OK, version: 1, flags, nonce: serverNonce }));
        if ((opts.challengeStatus ?? 0) !== 0) socket.end();
        state = 'auth';
        return;
      }
      if (state === 'auth') {
        const a = decodeAuth(f);
        let status = opts.welcomeStatus ?? Status.OK;
        let proof: Buffer = Buffer.alloc(32);
        if (opts.token) {
          const want = clientProof(opts.token, hello!.sessionId, hello!.nonce, serverNonce);
          if (!proofEqual(want, a.proof)) status = Status.AUTH_FAILED;
          else proof = serverProof(opts.token, hello!.sessionId, hello!.nonce, serverNonce);
        } else if (opts.bogusProof) {
          proof = randomBytes(32);
        }
        socket.write(encodeWelcome({ status, proof }));
        if (status !== Status.OK) {
          socket.end();
          return;
        }
        state = 'ready';
        conns.push(c);
        for (const w of waiters.filter((w) => w.n < conns.length)) w.res(conns[w.n]!);
        return;
      }
      const r = decodeRequest(f);
      const req = { ...r, key: Buffer.from(r.key!) };
      c.requests.push(req);
      const i = reqWaiters.findIndex((w) => w.pred(req));
      if (i >= 0) reqWaiters.splice(i, 1)[0]!.res(req);
      (opts.onRequest ?? defaultAnswer)(c, req);
    });
    socket.on('data', (d: Buffer) => reader.push(d));
  });
  await new Promise<void>((res) => server.listen(0, '127.0.0.1', res));
  const port = (server.address() as net.AddressInfo).port;
  return {
    addr: `127.0.0.1:${port}`,
    conns,
    conn(n) {
      if (n < conns.length) return Promise.resolve(conns[n]!);
      return new Promise((res) => waiters.push({ n, res }));
    },
    close() {
      for (const s of sockets) s.destroy();
      return new Promise((res) => server.close(() => res()));
    },
  };
}

/** A port on loopback with nothing listening. */
export async function deadAddr(): Promise<string> {
  const s = net.createServer();
  await new Promise<void>((res) => s.listen(0, '127.0.0.1', res));
  const port = (s.address() as net.AddressInfo).port;
  await new Promise((res) => s.close(res));
  return `127.0.0.1:${port}`;
}

export const sleep = (ms: number): Promise<void> => new Promise((r) => setTimeout(r, ms));

/** Polls `fn` until it returns true or `ms` pass. */
export async function eventually(fn: () => boolean | Promise<boolean>, ms = 3000, what = 'condition'): Promise<void> {
  const end = Date.now() + ms;
  for (;;) {
    if (await fn()) return;
    if (Date.now() > end) throw new Error(`timed out waiting for ${what}`);
    await sleep(10);
  }
}
