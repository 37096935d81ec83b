// The JavaScript client's conformance driver (tests/conformance/DRIVER.md): reads one JSON
// command per line on stdin, runs it on the public API of the built package, and writes one
// JSON reply (or event) per line on stdout. Commands run concurrently; all checking is the
// runner's. Logs go to stderr.
import { readFileSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { createInterface } from 'node:readline';
import { fileURLToPath } from 'node:url';
import {
  AlreadyHeldError,
  AuthFailedError,
  BusyError,
  CancelledError,
  ClientClosedError,
  ConnectionLostError,
  InvalidArgumentError,
  LockLostError,
  NotAcquiredError,
  NotHeldError,
  ServerRestartedError,
  ShuttingDownError,
  TimeoutError,
  TlsError,
  UnavailableError,
  UnsupportedVersionError,
  createClient,
  type Client,
  type ClientOptions,
  type Key,
  type Lock,
  type LostReason,
} from '@ticketing/client';

type Command = { id: number; op: string } & Record<string, any>;
type Reply = Record<string, unknown>;

const FEATURES = ['locks', 'cancel', 'keepalive', 'with_lock', 'verify', 'refuse_held', 'tls', 'mtls', 'request_timeout', 'lost_events', 'connect_election'];

const version = ((): string => {
  try {
    const here = dirname(fileURLToPath(import.meta.url));
    return JSON.parse(readFileSync(join(here, '..', '..', 'package.json'), 'utf8')).version as string;
  } catch {
    return 'unknown';
  }
})();

/** One line out per call: replies and events never interleave. */
function out(msg: Reply): void {
  process.stdout.write(`${JSON.stringify(msg)}\n`);
}

const reasonName = (r: LostReason): string => r.replace(/ /g, '_');

function errorKind(e: unknown): string {
  if (e instanceof NotAcquiredError) return 'not_acquired';
  if (e instanceof CancelledError) return 'cancelled';
  if (e instanceof NotHeldError) return 'not_held';
  if (e instanceof LockLostError) return 'lock_lost';
  if (e instanceof InvalidArgumentError) return 'invalid_argument';
  if (e instanceof AlreadyHeldError) return 'already_held';
  if (e instanceof AuthFailedError) return 'auth_failed';
  if (e instanceof UnsupportedVersionError) return 'unsupported_version';
  if (e instanceof UnavailableError) return 'unavailable';
  if (e instanceof TlsError) return 'tls';
  if (e instanceof TimeoutError) return 'timeout';
  if (e instanceof ConnectionLostError) return 'connection_lost';
  if (e instanceof ServerRestartedError) return 'server_restarted';
  if (e instanceof BusyError) return 'busy';
  if (e instanceof ShuttingDownError) return 'shutting_down';
  if (e instanceof ClientClosedError) return 'closed';
  return 'other';
}

class DriverError extends Error {}

const clients = new Map<string, Client>();
const locks = new Map<string, Lock>();
const pending = new Map<number, AbortController>();
/** Bumped by `reset`: lost events of forgotten handles are not reported. */
let generation = 0;

function theClient(name: unknown): Client {
  const c = clients.get(String(name));
  if (!c) throw new DriverError(`no client named ${JSON.stringify(name)}`);
  return c;
}

function theLock(name: unknown): Lock {
  const l = locks.get(String(name));
  if (!l) throw new DriverError(`no lock named ${JSON.stringify(name)}`);
  return l;
}

function keyOf(cmd: Command): Key {
  return typeof cmd.key_hex === 'string' ? Buffer.from(cmd.key_hex, 'hex') : cmd.key;
}

/** A decimal string as a bigint; a malformed one is the caller's bad argument. */
function tokenOf(s: unknown): bigint {
  try {
    return BigInt(s as string);
  } catch {
    throw new InvalidArgumentError(`token must be a decimal string, got ${JSON.stringify(s)}`);
  }
}

function register(name: string, lock: Lock): void {
  const gen = generation;
  locks.set(name, lock);
  lock.on('lost', (e) => {
    if (gen === generation && locks.get(name) === lock) out({ event: 'lost', lock: name, reason: reasonName(e.reason) });
  });
}

function ms(v: unknown): number | undefined {
  return v === null || v === undefined ? undefined : (v as number);
}

const sleep = (n: number): Promise<void> => new Promise((r) => setTimeout(r, n));

async function run(cmd: Command): Promise<Reply> {
  switch (cmd.op) {
    case 'hello':
      return { language: 'js', client_version: version, features: FEATURES };
    case 'connect': {
      const opts: ClientOptions = { endpoints: cmd.endpoints };
      if (cmd.token !== null && cmd.token !== undefined) opts.token = cmd.token;
      if (cmd.tls) {
        const t = cmd.tls as { ca?: string; cert?: string; key?: string; server_name?: string };
        opts.tls = {
          ...(t.ca ? { ca: readFileSync(t.ca) } : {}),
          ...(t.cert ? { cert: readFileSync(t.cert) } : {}),
          ...(t.key ? { key: readFileSync(t.key) } : {}),
          ...(t.server_name ? { servername: t.server_name } : {}),
        };
      }
      const rt = ms(cmd.request_timeout_ms);
      const hb = ms(cmd.heartbeat_ms);
      const dt = ms(cmd.dial_timeout_ms);
      if (rt !== undefined) opts.requestTimeoutMs = rt;
      if (hb !== undefined) opts.heartbeatIntervalMs = hb;
      if (dt !== undefined) opts.connectTimeoutMs = dt;
      const client = createClient(opts);
      try {
        await client.connect();
      } catch (e) {
        client.destroy();
        throw e;
      }
      clients.get(String(cmd.client))?.destroy();
      clients.set(String(cmd.client), client);
      return { session_id: client.sessionId.toString('hex') };
    }
    case 'close': {
      const c = theClient(cmd.client);
      clients.delete(String(cmd.client));
      await c.close();
      return {};
    }
    case 'acquire': {
      const c = theClient(cmd.client);
      const ac = new AbortController();
      pending.set(cmd.id, ac);
      try {
        const lock = await c.acquire(keyOf(cmd), {
          leaseMs: cmd.lease_ms,
          waitTimeoutMs: ms(cmd.wait_ms),
          keepAlive: Boolean(cmd.keepalive),
          refuseHeld: Boolean(cmd.refuse_held),
          signal: ac.signal,
        });
        register(String(cmd.lock), lock);
        return { token: lock.token.toString(), lease_ms: lock.leaseMs };
      } finally {
        pending.delete(cmd.id);
      }
    }
    case 'try_acquire': {
      const lock = await theClient(cmd.client).tryAcquire(keyOf(cmd), { leaseMs: cmd.lease_ms });
      if (!lock) return { acquired: false };
      register(String(cmd.lock), lock);
      return { acquired: true, token: lock.token.toString() };
    }
    case 'cancel': {
      pending.get(Number(cmd.target))?.abort(new Error('cancelled by the conformance runner'));
      return {};
    }
    case 'release':
      await theLock(cmd.lock).release();
      return {};
    case 'extend':
      return { lease_ms: await theLock(cmd.lock).extend(cmd.lease_ms) };
    case 'lock_state': {
      const l = theLock(cmd.lock);
      // remainingMs is exact (the deadline clock) but stops at 0; once passed, the wall clock says by how much.
      const deadlineInMs = l.remainingMs || l.deadline - Date.now();
      return { lost: l.isLost, ...(l.lostReason ? { reason: reasonName(l.lostReason) } : {}), token: l.token.toString(), deadline_in_ms: deadlineInMs };
    }
    case 'verify':
      return { held: await theLock(cmd.lock).verify() };
    case 'release_token':
      await theClient(cmd.client).release(keyOf(cmd), tokenOf(cmd.token));
      return {};
    case 'inspect': {
      const info = await theClient(cmd.client).inspect(keyOf(cmd));
      return { held: info.held, waiters: info.waiters, lease_left_ms: info.leaseRemainingMs };
    }
    case 'ping':
      await theClient(cmd.client).ping();
      return {};
    case 'with_lock':
      await theClient(cmd.client).withLock(keyOf(cmd), { leaseMs: cmd.lease_ms }, () => sleep(Number(cmd.hold_ms)));
      return {};
    case 'reset': {
      generation++;
      const all = [...clients.values()];
      clients.clear();
      locks.clear();
      for (const ac of pending.values()) ac.abort(new Error('reset'));
      pending.clear();
      await Promise.allSettled(all.map((c) => c.close()));
      return {};
    }
    default:
      throw new DriverError(`unknown op ${JSON.stringify(cmd.op)}`);
  }
}

async function handle(line: string): Promise<void> {
  let cmd: Command;
  try {
    cmd = JSON.parse(line) as Command;
    if (typeof cmd !== 'object' || cmd === null || typeof cmd.op !== 'string') throw new Error('not a command object');
  } catch (e) {
    process.stderr.write(`driver: ignoring a line that is not a command (${(e as Error).message}): ${line.slice(0, 200)}\n`);
    return;
  }
  if (cmd.op === 'exit') {
    out({ id: cmd.id, ok: true });
    shutdown();
    return;
  }
  try {
    const result = await run(cmd);
    out({ id: cmd.id, ok: true, ...result });
  } catch (e) {
    const err = e as Error;
    const kind = errorKind(e);
    if (kind === 'other') process.stderr.write(`driver: ${cmd.op} failed: ${err?.stack ?? String(e)}\n`);
    out({ id: cmd.id, ok: false, error: { kind, message: err?.message ?? String(e), ...(e instanceof LockLostError ? { reason: reasonName(e.reason) } : {}) } });
  }
}

let stopping = false;
function shutdown(): void {
  if (stopping) return;
  stopping = true;
  for (const c of clients.values()) c.destroy();
  clients.clear();
  // Exit once stdout has taken everything written so far.
  process.stdout.write('', () => process.exit(0));
}

const rl = createInterface({ input: process.stdin, crlfDelay: Infinity });
rl.on('line', (line) => {
  if (line.trim() && !stopping) void handle(line);
});
rl.on('close', shutdown);
