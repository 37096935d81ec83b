// The conformance driver (tests/conformance/DRIVER.md), started the way the runner starts it
// (clients/js/conformance-driver from the repository root), driven through a few scenarios
// against the real server.
import assert from 'node:assert/strict';
import { spawn, type ChildProcess } from 'node:child_process';
import { join } from 'node:path';
import { performance } from 'node:perf_hooks';
import { createInterface } from 'node:readline';
import { after, before, describe, test } from 'node:test';
import { Status } from '@ticketing/client/protocol';
import { deadAddr, eventually, fakeServer, packageDir, repoRoot, startServer, type RunningServer } from './helpers.js';

interface Driver {
  proc: ChildProcess;
  /** Sends a command and resolves with its reply. */
  send(op: string, args?: Record<string, unknown>): Promise<any>;
  /** Sends a command without waiting; returns its id and the reply promise. */
  start(op: string, args?: Record<string, unknown>): { id: number; reply: Promise<any> };
  events: any[];
  exited: Promise<number | null>;
}

function startDriver(): Driver {
  const proc = spawn(join(packageDir, 'conformance-driver'), [], {
    cwd: repoRoot,
    env: { ...process.env, TICKETING_CONFORMANCE: '1' },
    stdio: ['pipe', 'pipe', 'inherit'],
  });
  const waiting = new Map<number, (r: any) => void>();
  const events: any[] = [];
  let nextId = 1;
  createInterface({ input: proc.stdout! }).on('line', (line) => {
    const msg = JSON.parse(line);
    if (msg.event) events.push(msg);
    else waiting.get(msg.id)?.(msg);
  });
  const exited = new Promise<number | null>((r) => proc.once('exit', (code) => r(code)));
  const start = (op: string, args: Record<string, unknown> = {}): { id: number; reply: Promise<any> } => {
    const id = nextId++;
    const reply = new Promise<any>((resolve, reject) => {
      const t = setTimeout(() => reject(new Error(`no reply to ${op} within 15 s`)), 15_000);
      waiting.set(id, (r) => (clearTimeout(t), resolve(r)));
    });
    proc.stdin!.write(`${JSON.stringify({ id, op, ...args })}\n`);
    return { id, reply };
  };
  return { proc, start, send: (op, args) => start(op, args).reply, events, exited };
}

describe('conformance driver', () => {
  let srv: RunningServer;
  let d: Driver;
  before(async () => {
    srv = await startServer();
  });
  after(async () => {
    if (d?.proc.exitCode === null) d.proc.kill('SIGKILL');
    await srv?.stop();
  });

  test('starts and says hello', async () => {
    const t = performance.now();
    d = startDriver();
    const hello = await d.send('hello');
    // About 0.3 s on a quiet machine; 9 s was seen beside two CPU hogs and a build. The bound
    // catches a driver that does slow work at start (compiling, a network wait), not load.
    assert.ok(performance.now() - t < 20000, `hello after ${performance.now() - t} ms`);
    assert.equal(hello.ok, true);
    assert.equal(hello.language, 'js');
    assert.match(hello.client_version, /^\d+\.\d+\.\d+/);
    for (const f of ['locks', 'cancel', 'keepalive', 'with_lock', 'verify', 'refuse_held', 'tls', 'mtls', 'request_timeout', 'lost_events']) assert.ok(hello.features.includes(f), f);
  });

  test('basic, lock_state, inspect, verify, release_token', async () => {
    const c = await d.send('connect', { client: 'A', endpoints: [srv.addr], token: null, tls: null, request_timeout_ms: null, heartbeat_ms: null, dial_timeout_ms: null });
    assert.equal(c.ok, true);
    assert.match(c.session_id, /^[0-9a-f]{32}$/);
    await d.send('connect', { client: 'B', endpoints: [srv.addr], token: null, tls: null, request_timeout_ms: null, heartbeat_ms: null, dial_timeout_ms: null });
    const a = await d.send('acquire', { client: 'A', key: 'k', lease_ms: 5000, wait_ms: null, keepalive: false, lock: 'l1' });
    assert.equal(a.ok, true, JSON.stringify(a));
    assert.match(a.token, /^\d+$/);
    assert.equal(a.lease_ms, 5000);
    const { id: _id, deadline_in_ms: deadlineIn, ...state } = await d.send('lock_state', { lock: 'l1' });
    assert.deepEqual(state, { ok: true, lost: false, token: a.token });
    assert.ok(typeof deadlineIn === 'number' && deadlineIn > 4000 && deadlineIn <= 5000 * 0.998, `deadline_in_ms ${deadlineIn}`);
    const ins = await d.send('inspect', { client: 'B', key: 'k' });
    assert.equal(ins.held, true);
    assert.equal(ins.waiters, 0);
    assert.ok(ins.lease_left_ms > 4000);
    assert.equal((await d.send('verify', { lock: 'l1' })).held, true);
    assert.equal((await d.send('release_token', { client: 'B', key: 'k', token: a.token })).ok, true);
    assert.equal((await d.send('verify', { lock: 'l1' })).held, false);
    const rel = await d.send('release', { lock: 'l1' });
    assert.deepEqual(rel.error.kind, 'lock_lost');
    assert.equal(rel.error.reason, 'not_held');
    await eventually(() => d.events.some((e) => e.lock === 'l1'), 2000, 'lost event');
    assert.deepEqual(d.events, [{ event: 'lost', lock: 'l1', reason: 'not_held' }]);
  });

  test('try_acquire, wait 0, bad arguments, refuse_held', async () => {
    const got = await d.send('try_acquire', { client: 'A', key: 't', lease_ms: 5000, lock: 't1' });
    assert.equal(got.acquired, true);
    assert.equal((await d.send('try_acquire', { client: 'B', key: 't', lease_ms: 5000, lock: 't2' })).acquired, false);
    assert.equal((await d.send('acquire', { client: 'B', key: 't', lease_ms: 5000, wait_ms: 0, keepalive: false, lock: 't3' })).error.kind, 'not_acquired');
    assert.equal((await d.send('acquire', { client: 'A', key: 't', lease_ms: 5000, wait_ms: null, keepalive: false, lock: 't4', refuse_held: true })).error.kind, 'already_held');
    const bad: [string, Record<string, unknown>][] = [
      ['acquire', { client: 'A', key: '', lease_ms: 5000, wait_ms: null, keepalive: false, lock: 'x' }],
      ['acquire', { client: 'A', key: 'k'.repeat(65_536), lease_ms: 5000, wait_ms: null, keepalive: false, lock: 'x' }],
      ['acquire', { client: 'A', key: 'k', lease_ms: 0, wait_ms: null, keepalive: false, lock: 'x' }],
      ['acquire', { client: 'A', key: 'k', lease_ms: -5, wait_ms: null, keepalive: false, lock: 'x' }],
      ['acquire', { client: 'A', key: 'k', lease_ms: 5000, wait_ms: -5, keepalive: false, lock: 'x' }],
      ['extend', { lock: 't1', lease_ms: 0 }],
      ['release_token', { client: 'A', key: 'k', token: '0' }],
    ];
    for (const [op, args] of bad) assert.equal((await d.send(op, args)).error?.kind, 'invalid_argument', `${op} ${JSON.stringify(args).slice(0, 80)}`);
    assert.equal((await d.send('release', { lock: 't1' })).ok, true);
  });

  test('cancel a waiting acquire', async () => {
    const held = await d.send('acquire', { client: 'A', key: 'c', lease_ms: 5000, wait_ms: null, keepalive: false, lock: 'c1' });
    assert.equal(held.ok, true);
    const w = d.start('acquire', { client: 'B', key: 'c', lease_ms: 5000, wait_ms: null, keepalive: false, lock: 'c2' });
    await eventually(async () => (await d.send('inspect', { client: 'A', key: 'c' })).waiters === 1, 3000, 'queued');
    assert.equal((await d.send('cancel', { target: w.id })).ok, true);
    const r = await w.reply;
    assert.equal(r.error.kind, 'cancelled');
    assert.equal((await d.send('inspect', { client: 'A', key: 'c' })).waiters, 0);
    await d.send('release', { lock: 'c1' });
  });

  test('with_lock reports a lost lock; lost events on expiry', async () => {
    const lost = await d.send('with_lock', { client: 'A', key: 'w', lease_ms: 300, hold_ms: 900 });
    assert.equal(lost.error.kind, 'lock_lost');
    assert.equal(lost.error.reason, 'expired');
    assert.equal((await d.send('with_lock', { client: 'A', key: 'w2', lease_ms: 2000, hold_ms: 100 })).ok, true);
    assert.equal((await d.send('acquire', { client: 'A', key: 'e', lease_ms: 300, wait_ms: null, keepalive: false, lock: 'e1' })).ok, true);
    await eventually(() => d.events.some((e) => e.lock === 'e1'), 3000, 'lost event');
    assert.deepEqual(
      d.events.filter((e) => e.lock === 'e1'),
      [{ event: 'lost', lock: 'e1', reason: 'expired' }],
    );
    assert.equal((await d.send('release', { lock: 'e1' })).error.reason, 'expired');
  });

  test('a follower whose leader hint leads to a node that has just stepped down: connect fails unavailable', async () => {
    const stepped = await fakeServer({ challenge: { status: Status.NOT_LEADER } });
    const follower = await fakeServer({ challenge: { status: Status.NOT_LEADER, data: stepped.addr } });
    try {
      const args = { token: null, tls: null, request_timeout_ms: null, heartbeat_ms: null, dial_timeout_ms: 1000 };
      const r = await d.send('connect', { client: 'F', endpoints: [follower.addr], ...args });
      assert.equal(r.ok, false);
      assert.equal(r.error.kind, 'unavailable', JSON.stringify(r));
      assert.match(r.error.message, /not the leader/);
      const r2 = await d.send('connect', { client: 'F', endpoints: [stepped.addr], ...args });
      assert.equal(r2.error?.kind, 'unavailable', JSON.stringify(r2));
    } finally {
      await follower.close();
      await stepped.close();
    }
  });

  test('unreachable: unavailable promptly; reset and exit', async () => {
    const t = performance.now();
    const r = await d.send('connect', { client: 'U', endpoints: [await deadAddr()], token: null, tls: null, request_timeout_ms: null, heartbeat_ms: null, dial_timeout_ms: 1000 });
    assert.equal(r.error.kind, 'unavailable');
    assert.ok(performance.now() - t < 2000);
    assert.equal((await d.send('reset')).ok, true);
    assert.equal((await d.send('ping', { client: 'A' })).ok, false, 'clients are forgotten');
    assert.equal((await d.send('exit')).ok, true);
    assert.equal(await d.exited, 0);
  });
});
