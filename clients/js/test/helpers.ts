// Shared test helpers: the repository's vectors, the real server binary (started, stopped,
// restarted), test certificates made at test time, a TCP proxy the test controls, and a
// scriptable fake server for the cases a real single node cannot produce on demand.
import { execFileSync, spawn, type ChildProcess } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { existsSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import * as net from 'node:net';
import { tmpdir } from 'node:os';
import { dirname, join, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';
import {
  FrameReader,
  Op,
  Sizes,
  Status,
  clientProof,
  decodeAuth,
  decodeHello,
  decodeRequest,
  encodeChallenge,
  encodeResponse,
  encodeWelcome,
  proofEqual,
  serverProof,
  type Request,
  type Response,
} from '@ticketing/client/protocol';

/** The repository root: the nearest directory above this file that holds PROTOCOL.md. */
export const repoRoot: string = (() => {
  let dir = dirname(fileURLToPath(import.meta.url));
  for (let i = 0; i < 20; i++) {
    if (existsSync(join(dir, 'PROTOCOL.md')) && existsSync(join(dir, 'protocol', 'vectors.json'))) return dir;
    dir = dirname(dir);
  }
  throw new Error('repository root (PROTOCOL.md) not found above the tests');
})();

/** The client package's directory (clients/js). */
export const packageDir = resolve(repoRoot, 'clients', 'js');

/** Reads a JSON file of the repository. */
export function readJSON<T = any>(rel: string): T {
  return JSON.parse(readFileSync(join(repoRoot, rel), 'utf8')) as T;
}

export const hex = (s: string): Buffer => Buffer.from(s, 'hex');

export const sleep = (ms: number): Promise<void> => new Promise((r) => setTimeout(r, ms));

/** Polls `fn` every 10 ms until it returns true, or fails after `ms`. */
export async function eventually(fn: () => boolean | Promise<boolean>, ms = 3000, what = 'condition'): Promise<void> {
  const end = Date.now() + ms;
  for (;;) {
    if (await fn()) return;
    if (Date.now() > end) throw new Error(`timed out after ${ms} ms waiting for ${what}`);
    await sleep(10);
  }
}

/** Resolves with how `p` settled, or `'pending'` if it has not settled within `ms`. */
export async function settledWithin<T>(p: Promise<T>, ms: number): Promise<{ ok: true; value: T } | { ok: false; error: unknown } | 'pending'> {
  let timer: NodeJS.Timeout | undefined;
  const t = new Promise<'pending'>((r) => (timer = setTimeout(() => r('pending'), ms)));
  try {
    return await Promise.race([p.then((value) => ({ ok: true as const, value }), (error: unknown) => ({ ok: false as const, error })), t]);
  } finally {
    clearTimeout(timer);
  }
}

// ---- The real server ----

let builtBin: string | undefined;

/** The server binary: $TICKETING_BIN, or built once per process with `go build`. */
export function serverBinary(): string {
  if (process.env.TICKETING_BIN) return resolve(process.env.TICKETING_BIN);
  if (builtBin) return builtBin;
  const dir = mkdtempSync(join(tmpdir(), 'ticketing-js-bin-'));
  const bin = join(dir, 'ticketing');
  execFileSync('go', ['build', '-o', bin, './cmd/ticketing'], { cwd: repoRoot, stdio: ['ignore', 'inherit', 'inherit'], timeout: 300_000 });
  process.on('exit', () => rmSync(dir, { recursive: true, force: true }));
  builtBin = bin;
  return bin;
}

/** Certificates made for this test run (never committed): a CA, a server certificate for 127.0.0.1/localhost, a client certificate. */
export interface TestCerts {
  dir: string;
  ca: string;
  serverCert: string;
  serverKey: string;
  clientCert: string;
  clientKey: string;
}

let certs: TestCerts | undefined;

/** Makes (once per process) the test certificates with the openssl CLI. */
export function testCerts(): TestCerts {
  if (certs) return certs;
  const dir = mkdtempSync(join(tmpdir(), 'ticketing-js-tls-'));
  process.on('exit', () => rmSync(dir, { recursive: true, force: true }));
  const p = (f: string): string => join(dir, f);
  const ssl = (...args: string[]): void => {
    execFileSync('openssl', args, { stdio: ['ignore', 'ignore', 'pipe'], timeout: 30_000 });
  };
  const ec = ['-newkey', 'ec', '-pkeyopt', 'ec_paramgen_curve:P-256', '-nodes'];
  ssl('req', '-x509', ...ec, '-keyout', p('ca.key'), '-out', p('ca.pem'), '-days', '2', '-subj', '/CN=ticketing-js test CA', '-addext', 'basicConstraints=critical,CA:TRUE', '-addext', 'keyUsage=critical,keyCertSign,cRLSign');
  writeFileSync(p('server.ext'), 'subjectAltName=IP:127.0.0.1,IP:::1,DNS:localhost\nextendedKeyUsage=serverAuth\n');
  ssl('req', ...ec, '-keyout', p('server.key'), '-out', p('server.csr'), '-subj', '/CN=localhost');
  ssl('x509', '-req', '-in', p('server.csr'), '-CA', p('ca.pem'), '-CAkey', p('ca.key'), '-CAcreateserial', '-out', p('server.pem'), '-days', '2', '-extfile', p('server.ext'));
  writeFileSync(p('client.ext'), 'extendedKeyUsage=clientAuth\n');
  ssl('req', ...ec, '-keyout', p('client.key'), '-out', p('client.csr'), '-subj', '/CN=ticketing-js test client');
  ssl('x509', '-req', '-in', p('client.csr'), '-CA', p('ca.pem'), '-CAkey', p('ca.key'), '-CAcreateserial', '-out', p('client.pem'), '-days', '2', '-extfile', p('client.ext'));
  certs = { dir, ca: p('ca.pem'), serverCert: p('server.pem'), serverKey: p('server.key'), clientCert: p('client.pem'), clientKey: p('client.key') };
  return certs;
}

export interface ServerOptions {
  token?: string;
  /** Serve TLS with the test certificates. */
  tls?: boolean;
  /** Require client certificates from the test CA (mutual TLS). */
  mtls?: boolean;
  /** More environment (TICKETING_SESSION_GRACE, TICKETING_LOCK_DELAY, ...). */
  env?: Record<string, string>;
}

export interface RunningServer {
  /** `127.0.0.1:PORT` */
  addr: string;
  port: number;
  proc: ChildProcess;
  /** Everything the server wrote to stderr so far (all its runs). */
  log(): string;
  /** Stops it (`SIGTERM`, then `SIGKILL` after 5 s, or `SIGKILL` at once) and waits for the exit. */
  kill(signal?: 'SIGTERM' | 'SIGKILL'): Promise<void>;
  /** Starts it again on the same port and data directory. */
  restart(): Promise<void>;
  /** Stops it for good and removes its data directory. */
  stop(): Promise<void>;
}

const running = new Set<ChildProcess>();
process.on('exit', () => {
  for (const p of running) p.kill('SIGKILL');
});

/** Starts `ticketing server` on a free loopback port and waits (bounded) for its `msg=listening` line. */
export async function startServer(opts: ServerOptions = {}): Promise<RunningServer> {
  const bin = serverBinary();
  const dataDir = mkdtempSync(join(tmpdir(), 'ticketing-js-data-'));
  const env: Record<string, string> = { ...(process.env as Record<string, string>) };
  for (const k of Object.keys(env)) if (k.startsWith('TICKETING_') && k !== 'TICKETING_BIN') delete env[k];
  Object.assign(env, { TICKETING_DATA_DIR: dataDir, TICKETING_STARTUP_GRACE: '0' });
  if (opts.token) env.TICKETING_TOKEN = opts.token;
  if (opts.tls || opts.mtls) {
    const c = testCerts();
    Object.assign(env, { TICKETING_TLS_CERT: c.serverCert, TICKETING_TLS_KEY: c.serverKey });
    if (opts.mtls) env.TICKETING_TLS_CLIENT_CA = c.ca;
  }
  Object.assign(env, opts.env ?? {});
  let log = '';
  let proc!: ChildProcess;
  let exited!: Promise<void>;
  const launch = async (addr: string): Promise<number> => {
    proc = spawn(bin, ['server'], { env: { ...env, TICKETING_ADDR: addr }, stdio: ['ignore', 'ignore', 'pipe'] });
    running.add(proc);
    const p = proc;
    exited = new Promise<void>((res) => p.once('exit', () => (running.delete(p), res())));
    return new Promise<number>((res, rej) => {
      const timer = setTimeout(() => rej(new Error(`server did not log msg=listening within 20 s; stderr:\n${log}`)), 20_000);
      let buf = '';
      p.stderr!.setEncoding('utf8');
      p.stderr!.on('data', (s: string) => {
        log += s;
        buf += s;
        const lines = buf.split('\n');
        buf = lines.pop()!;
        for (const line of lines) {
          const m = line.includes('msg=listening') ? /addr="?(?:127\.0\.0\.1|\[::1\]):(\d+)/.exec(line) : null;
          if (m) {
            clearTimeout(timer);
            res(Number(m[1]));
          }
        }
      });
      p.once('exit', (code, sig) => {
        clearTimeout(timer);
        rej(new Error(`server exited (${code ?? sig}) before listening; stderr:\n${log}`));
      });
    });
  };
  const port = await launch('127.0.0.1:0');
  const kill = async (signal: 'SIGTERM' | 'SIGKILL' = 'SIGTERM'): Promise<void> => {
    if (proc.exitCode !== null || proc.signalCode !== null) return;
    proc.kill(signal);
    const t = setTimeout(() => proc.kill('SIGKILL'), 5_000);
    await exited;
    clearTimeout(t);
  };
  return {
    addr: `127.0.0.1:${port}`,
    port,
    get proc() {
      return proc;
    },
    log: () => log,
    kill,
    async restart() {
      await kill('SIGKILL');
      // The port may linger for a moment; retry a few times.
      for (let i = 0; ; i++) {
        try {
          await launch(`127.0.0.1:${port}`);
          return;
        } catch (err) {
          if (i >= 20) throw err;
          await sleep(100);
        }
      }
    },
    async stop() {
      await kill('SIGTERM');
      rmSync(dataDir, { recursive: true, force: true });
    },
  };
}

// ---- A TCP proxy the test controls ----

export interface Proxy {
  /** `127.0.0.1:PORT` to give clients. */
  addr: string;
  /** Connections accepted so far. */
  accepted: number;
  /** While true, bytes from the server are held back (and dropped if the connection is cut). */
  holdServerBytes: boolean;
  /** Resets every proxied connection, both ways. */
  cutAll(): void;
  close(): Promise<void>;
}

/** A proxy to `upstream` (`host:port`). */
export async function startProxy(upstream: string): Promise<Proxy> {
  const [host, port] = [upstream.slice(0, upstream.lastIndexOf(':')), Number(upstream.slice(upstream.lastIndexOf(':') + 1))];
  const pairs = new Set<[net.Socket, net.Socket]>();
  const proxy: Proxy = {
    addr: '',
    accepted: 0,
    holdServerBytes: false,
    cutAll() {
      for (const [a, b] of pairs) {
        a.resetAndDestroy();
        b.resetAndDestroy();
      }
      pairs.clear();
    },
    close: async () => {
      proxy.cutAll();
      await new Promise((r) => server.close(r));
    },
  };
  const server = net.createServer((client) => {
    proxy.accepted++;
    const up = net.connect(port, host);
    const pair: [net.Socket, net.Socket] = [client, up];
    pairs.add(pair);
    const end = (): void => {
      pairs.delete(pair);
      client.destroy();
      up.destroy();
    };
    client.on('error', end).on('close', end);
    up.on('error', end).on('close', end);
    client.on('data', (d: Buffer) => up.write(d));
    up.on('data', (d: Buffer) => {
      if (!proxy.holdServerBytes) client.write(d);
    });
  });
  await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
  proxy.addr = `127.0.0.1:${(server.address() as net.AddressInfo).port}`;
  return proxy;
}

// ---- A scriptable fake server ----

export interface FakeConn {
  socket: net.Socket;
  sessionId: Buffer;
  /** WELCOME said RESUMED. */
  resumed: boolean;
  /** Requests received, in order. */
  requests: (Request & { key: Buffer })[];
  /** Sends a response frame (fields not given are 0). */
  send(r: Partial<Response> & { op: number; id: bigint }): void;
  /** Resolves with the next request matching `pred` not yet taken (received ones included). */
  next(pred?: (r: Request & { key: Buffer }) => boolean, ms?: number): Promise<Request & { key: Buffer }>;
}

export interface FakeServerOptions {
  /** The token the fake server holds (AUTH_REQUIRED when set). */
  token?: string;
  /** Set AUTH_REQUIRED without holding a token, and send a bogus proof. */
  bogusProof?: boolean;
  /** Answer HELLO with this CHALLENGE status (then close). */
  challenge?: { status: number; detail?: number; data?: string };
  /** Answer AUTH with this WELCOME status (then close). */
  welcome?: { status: number; detail?: number };
  /** Send CHALLENGE, then never answer AUTH (a server that stops before WELCOME). */
  noWelcome?: boolean;
  /** The state id in WELCOME (mutable on the server object). Default: random. */
  stateId?: Buffer;
  /** WELCOME's session grace. Default 5000. */
  graceMs?: number;
  /** Sessions known to be live (share one set between fake servers to model a cluster). */
  sessions?: Set<string>;
  /** Called for every request after the handshake; the default answers everything OK and grants every ACQUIRE. */
  onRequest?: (c: FakeConn, r: Request & { key: Buffer }) => void;
}

export interface FakeServer {
  addr: string;
  /** Completed handshakes, in order. */
  conns: FakeConn[];
  /** HELLOs received (handshakes begun, refused ones included). */
  hellos: number;
  /** Sessions seen (hex ids): a HELLO naming one of them is RESUMED. */
  sessions: Set<string>;
  /** The state id sent in WELCOME; change it to act as a restarted server. */
  stateId: Buffer;
  /** Resolves with the n-th connection (0-based) once it completed the handshake. */
  conn(n: number, ms?: number): Promise<FakeConn>;
  /** Resets every open connection. */
  dropAll(): void;
  close(): Promise<void>;
}

let fakeToken = 100n;

/** The default answer to `r`: OK for everything, ACQUIRE granted with a fresh token, INSPECT all zero. */
export function defaultAnswer(c: FakeConn, r: Request): void {
  if (r.op === Op.ACQUIRE) c.send({ op: r.op, id: r.id, token: ++fakeToken, leaseMs: r.leaseMs ?? 0 });
  else if (r.op === Op.EXTEND) c.send({ op: r.op, id: r.id, token: r.token ?? 0n, leaseMs: r.leaseMs ?? 0 });
  else if (r.op === Op.INSPECT) c.send({ op: r.op, id: r.id, data: Buffer.alloc(Sizes.INSPECT_DATA) });
  else c.send({ op: r.op, id: r.id });
}

/** Like {@link defaultAnswer}, but an ACQUIRE is never answered (it waits forever). */
export const acquiresWait = (c: FakeConn, r: Request): void => {
  if (r.op !== Op.ACQUIRE) defaultAnswer(c, r);
};

export async function fakeServer(opts: FakeServerOptions = {}): Promise<FakeServer> {
  const conns: FakeConn[] = [];
  const waiters: { n: number; res: (c: FakeConn) => void }[] = [];
  const sockets = new Set<net.Socket>();
  const fake: FakeServer = {
    addr: '',
    conns,
    hellos: 0,
    sessions: opts.sessions ?? new Set(),
    stateId: opts.stateId ?? randomBytes(16),
    conn(n, ms = 5000) {
      if (n < conns.length) return Promise.resolve(conns[n]!);
      return new Promise((res, rej) => {
        const t = setTimeout(() => rej(new Error(`fake server: no connection #${n} within ${ms} ms`)), ms);
        waiters.push({ n, res: (c) => (clearTimeout(t), res(c)) });
      });
    },
    dropAll() {
      for (const s of sockets) s.resetAndDestroy();
    },
    close() {
      fake.dropAll();
      return new Promise((res) => server.close(() => res()));
    },
  };
  const server = net.createServer((socket) => {
    sockets.add(socket);
    socket.on('close', () => sockets.delete(socket));
    socket.on('error', () => {});
    let state: 'hello' | 'auth' | 'ready' = 'hello';
    let hello: ReturnType<typeof decodeHello> | undefined;
    const authRequired = Boolean(opts.token || opts.bogusProof);
    const serverNonce = authRequired ? randomBytes(32) : Buffer.alloc(32);
    const taken = new Set<Request>();
    const reqWaiters: { pred: (r: Request & { key: Buffer }) => boolean; res: (r: Request & { key: Buffer }) => void }[] = [];
    const c: FakeConn = {
      socket,
      sessionId: Buffer.alloc(16),
      resumed: false,
      requests: [],
      send(r) {
        if (!socket.destroyed) socket.write(encodeResponse({ status: Status.OK, token: 0n, leaseMs: 0, detail: 0, ...r }));
      },
      next(pred = () => true, ms = 5000) {
        const seen = c.requests.find((r) => pred(r) && !taken.has(r));
        if (seen) {
          taken.add(seen);
          return Promise.resolve(seen);
        }
        return new Promise((res, rej) => {
          const t = setTimeout(() => rej(new Error(`fake server: no matching request within ${ms} ms`)), ms);
          reqWaiters.push({
            pred,
            res: (r) => {
              clearTimeout(t);
              taken.add(r);
              res(r);
            },
          });
        });
      },
    };
    const reader = new FrameReader((f) => {
      if (state === 'hello') {
        hello = decodeHello(Buffer.from(f));
        fake.hellos++;
        c.sessionId = Buffer.from(hello.sessionId);
        const ch = opts.challenge ?? { status: Status.OK };
        socket.write(
          encodeChallenge({
            status: ch.status,
            version: 1,
            flags: authRequired ? Sizes.CHALLENGE_AUTH_REQUIRED : 0,
            detail: ch.detail ?? 0,
            nonce: ch.status === Status.OK ? serverNonce : Buffer.alloc(32),
            data: Buffer.from(ch.data ?? ''),
          }),
        );
        if (ch.status !== Status.OK) socket.end();
        state = 'auth';
        return;
      }
      if (state === 'auth') {
        if (opts.noWelcome) return;
        const a = decodeAuth(f);
        let status = opts.welcome?.status ?? Status.OK;
        if (opts.token && !proofEqual(clientProof(opts.token, hello!.sessionId, hello!.nonce, serverNonce), a.proof)) status = Status.AUTH_FAILED;
        const sid = c.sessionId.toString('hex');
        const resumed = status === Status.OK && fake.sessions.has(sid);
        const signed = {
          status,
          flags: resumed ? Sizes.WELCOME_RESUMED : 0,
          detail: status === Status.OK ? 0 : (opts.welcome?.detail ?? 0),
          sessionGraceMs: status === Status.OK ? (opts.graceMs ?? 5000) : 0,
          stateId: status === Status.OK ? fake.stateId : Buffer.alloc(16),
        };
        let proof: Uint8Array = Buffer.alloc(32);
        if (status === Status.OK && opts.token) proof = serverProof(opts.token, hello!.sessionId, hello!.nonce, serverNonce, signed);
        if (status === Status.OK && opts.bogusProof) proof = randomBytes(32);
        socket.write(encodeWelcome({ ...signed, proof }));
        if (status !== Status.OK) {
          socket.end();
          return;
        }
        fake.sessions.add(sid);
        c.resumed = resumed;
        state = 'ready';
        conns.push(c);
        for (const w of waiters.filter((w) => w.n < conns.length)) {
          waiters.splice(waiters.indexOf(w), 1);
          w.res(conns[w.n]!);
        }
        return;
      }
      const r = decodeRequest(f);
      const req = { ...r, key: Buffer.from(r.key) };
      c.requests.push(req);
      const i = reqWaiters.findIndex((w) => w.pred(req));
      if (i >= 0) reqWaiters.splice(i, 1)[0]!.res(req);
      (opts.onRequest ?? defaultAnswer)(c, req);
    });
    socket.on('data', (d: Buffer) => {
      try {
        reader.push(d);
      } catch {
        socket.destroy();
      }
    });
  });
  await new Promise<void>((res) => server.listen(0, '127.0.0.1', res));
  fake.addr = `127.0.0.1:${(server.address() as net.AddressInfo).port}`;
  return fake;
}

/** A port on loopback with nothing listening. */
export async function deadAddr(): Promise<string> {
  const s = net.createServer();
  await new Promise<void>((res) => s.listen(0, '127.0.0.1', res));
  const port = (s.address() as net.AddressInfo).port;
  await new Promise((res) => s.close(res));
  return `127.0.0.1:${port}`;
}

/** A server that accepts connections and never says a word (a half-open or frozen peer). */
export async function muteServer(): Promise<{ addr: string; close(): Promise<void> }> {
  const sockets = new Set<net.Socket>();
  const s = net.createServer((sock) => {
    sockets.add(sock);
    sock.on('error', () => {});
  });
  await new Promise<void>((res) => s.listen(0, '127.0.0.1', res));
  return {
    addr: `127.0.0.1:${(s.address() as net.AddressInfo).port}`,
    close: () => {
      for (const x of sockets) x.destroy();
      return new Promise((r) => s.close(() => r()));
    },
  };
}
