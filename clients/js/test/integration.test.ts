// Integration tests against the real server binary ($TICKETING_BIN, or built by the tests),
// started on a free loopback port; restarts, stops and freezes are real signals to it.
import assert from 'node:assert/strict';
import { readdirSync, readFileSync } from 'node:fs';
import * as net from 'node:net';
import { performance } from 'node:perf_hooks';
import { after, before, describe, test } from 'node:test';
import {
  AuthFailedError,
  CancelledError,
  ClientClosedError,
  ConnectionLostError,
  InvalidRequestError,
  LockLostError,
  NotAcquiredError,
  NotHeldError,
  ServerRestartedError,
  ShuttingDownError,
  TimeoutError,
  TlsError,
  UnavailableError,
  createClient,
  type Client,
  type ClientOptions,
  type Lock,
} from '@ticketing/client';
import {
  ExpiredReason,
  FrameReader,
  Op,
  Status,
  decodeChallenge,
  decodeResponse,
  decodeWelcome,
  encodeAuth,
  encodeHello,
  encodeRequest,
} from '@ticketing/client/protocol';
import { eventually, settledWithin, sleep, startProxy, startServer, testCerts, type RunningServer } from './helpers.js';

const clients: Client[] = [];
function client(addr: string | RunningServer, opts: ClientOptions = {}): Client {
  const c = createClient({ endpoints: typeof addr === 'string' ? addr : addr.addr, ...opts });
  clients.push(c);
  return c;
}
const destroyAll = (): void => {
  for (const c of clients.splice(0)) c.destroy();
};

/** An observer client, like the conformance runner's R: INSPECT to see the server's view. */
let observers = new Map<string, Client>();
function observer(srv: RunningServer): Client {
  let c = observers.get(srv.addr);
  if (!c) observers.set(srv.addr, (c = client(srv)));
  return c;
}
const waiters = async (srv: RunningServer, key: string): Promise<number> => (await observer(srv).inspect(key)).waiters;
const held = async (srv: RunningServer, key: string): Promise<boolean> => (await observer(srv).inspect(key)).held;

describe('plain server', () => {
  let srv: RunningServer;
  before(async () => {
    srv = await startServer();
  });
  after(async () => {
    destroyAll();
    observers = new Map();
    await srv?.stop();
  });

  test('acquire, inspect, extend, verify, release', async () => {
    const c = client(srv);
    await c.connect();
    const t0 = Date.now();
    const lock = await c.acquire('basic', { leaseMs: 5000 });
    assert.equal(typeof lock.token, 'bigint');
    assert.ok(lock.token > 0n);
    assert.equal(lock.key, 'basic');
    assert.equal(lock.leaseMs, 5000);
    assert.ok(lock.deadline > t0 + 4900 && lock.deadline <= Date.now() + 5000, `deadline in ${lock.deadline - Date.now()} ms`);
    const mine = await c.inspect('basic');
    assert.equal(mine.held, true);
    assert.equal(mine.heldByThisClient, true);
    assert.equal(mine.token, lock.token, 'the holding session sees the token');
    const other = await observer(srv).inspect('basic');
    assert.equal(other.held, true);
    assert.equal(other.token, null, 'another session does not see the token');
    assert.equal(other.heldByThisClient, false);
    assert.ok((await observer(srv).inspect('basic', { token: lock.token })).tokenMatches);
    assert.equal(await lock.extend(20_000), 20_000);
    assert.ok(lock.deadline > Date.now() + 19_000);
    assert.equal(await lock.verify(), true);
    await lock.release();
    assert.equal(await held(srv, 'basic'), false);
    assert.equal(await lock.verify(), false);
    assert.ok(!lock.isLost);
  });

  test('tokens strictly increase; tryAcquire gives null; a wait timeout gives NotAcquiredError', async () => {
    const a = client(srv);
    const b = client(srv);
    const l1 = await a.acquire('held');
    assert.equal(await b.tryAcquire('held'), null);
    await assert.rejects(b.acquire('held', { waitTimeoutMs: 0 }), NotAcquiredError);
    const t = performance.now();
    await assert.rejects(b.acquire('held', { waitTimeoutMs: 300 }), NotAcquiredError);
    const took = performance.now() - t;
    assert.ok(took >= 290 && took < 2000, `waited ${took} ms`);
    assert.equal(await waiters(srv, 'held'), 0);
    await l1.release();
    const l2 = await b.tryAcquire('held');
    assert.ok(l2 && l2.token > l1.token);
    await l2.release();
  });

  test('FIFO: 10 waiters are granted in arrival order with increasing tokens', async () => {
    const holder = client(srv);
    const first = await holder.acquire('fifo', { leaseMs: 30_000 });
    const ws = await Promise.all(Array.from({ length: 10 }, () => client(srv).connect()));
    const order: number[] = [];
    const granted: Promise<Lock>[] = [];
    for (let i = 0; i < 10; i++) {
      granted.push(
        ws[i]!.acquire('fifo', { leaseMs: 30_000 }).then(async (l) => {
          order.push(i);
          await l.release();
          return l;
        }),
      );
      await eventually(async () => (await waiters(srv, 'fifo')) === i + 1, 3000, `waiter ${i} queued`);
    }
    await first.release();
    const locks = await Promise.all(granted);
    assert.deepEqual(
      order,
      Array.from({ length: 10 }, (_, i) => i),
    );
    let prev = first.token;
    for (const l of locks) {
      assert.ok(l.token > prev, `token ${l.token} after ${prev}`);
      prev = l.token;
    }
  });

  test('release and extend with a stale token: NotHeldError, nothing changes; any client may release by token', async () => {
    const a = client(srv);
    const old = await a.acquire('stale');
    await old.release();
    const cur = await a.acquire('stale');
    await assert.rejects(a.release('stale', old.token), NotHeldError);
    await assert.rejects(a.extend('stale', old.token, 1000), NotHeldError);
    assert.equal(await held(srv, 'stale'), true);
    await client(srv).release('stale', cur.token);
    assert.equal(await held(srv, 'stale'), false);
  });

  test('owner is the token: a release by another client makes the handle lost ("not held") once', async () => {
    const a = client(srv);
    const lock = await a.acquire('owner', { leaseMs: 10_000 });
    const reasons: string[] = [];
    lock.on('lost', (e) => reasons.push(e.reason));
    await client(srv).release('owner', lock.token);
    await assert.rejects(lock.release(), (e: unknown) => e instanceof LockLostError && e.reason === 'not held');
    await assert.rejects(lock.release(), LockLostError);
    assert.deepEqual(reasons, ['not held']);
  });

  test('INVALID answers carry the field; the connection stays', async () => {
    const c = client(srv);
    await assert.rejects(c.acquire('k'.repeat(300)), (e: unknown) => e instanceof InvalidRequestError && e.fieldName === 'KEY');
    await assert.rejects(c.acquire('k', { leaseMs: 2 * 3600_000 }), (e: unknown) => e instanceof InvalidRequestError && e.fieldName === 'LEASE');
    await c.ping();
  });

  test('many concurrent requests on one client; withLock excludes', async () => {
    const c = client(srv);
    const N = 300;
    const locks = await Promise.all(Array.from({ length: N }, (_, i) => c.acquire(`many-${i}`, { leaseMs: 30_000 })));
    const pings = Array.from({ length: 100 }, () => c.ping());
    assert.equal(new Set(locks.map((l) => l.token)).size, N);
    await Promise.all([...locks.map((l) => l.release()), ...pings]);
    let inside = 0;
    let maxInside = 0;
    await Promise.all(
      Array.from({ length: 30 }, () =>
        c.withLock('many-shared', { leaseMs: 30_000 }, async () => {
          inside++;
          maxInside = Math.max(maxInside, inside);
          await sleep(0);
          inside--;
        }),
      ),
    );
    assert.equal(maxInside, 1);
  });

  test('an aborted wait leaves nothing held or queued, also when it races the hand-off', async () => {
    const holder = client(srv);
    const waiter = client(srv);
    const lock = await holder.acquire('abort', { leaseMs: 60_000 });
    const ac = new AbortController();
    const p = waiter.acquire('abort', { leaseMs: 60_000, signal: ac.signal });
    await eventually(async () => (await waiters(srv, 'abort')) === 1, 3000, 'queued');
    ac.abort();
    await assert.rejects(p, CancelledError);
    assert.equal(await waiters(srv, 'abort'), 0);
    await lock.release();
    assert.equal(await held(srv, 'abort'), false, 'the aborted waiter was never granted');
    for (let i = 0; i < 15; i++) {
      const key = `abort-race-${i}`;
      const l = await holder.acquire(key, { leaseMs: 60_000 });
      const ac2 = new AbortController();
      const w = waiter.acquire(key, { leaseMs: 60_000, signal: ac2.signal }).then(
        (x) => x,
        (e: unknown) => {
          assert.ok(e instanceof CancelledError, String(e));
          return undefined;
        },
      );
      await eventually(async () => (await waiters(srv, key)) === 1, 3000, 'queued');
      const rel = l.release();
      if (i % 3 === 1) await sleep(i % 2);
      ac2.abort();
      await rel;
      const got = await w;
      await got?.release();
      await eventually(async () => !(await held(srv, key)), 3000, `${key} free (the lease is 60 s)`);
    }
  });

  test('lost fires (reason "expired") before the server hands the lock to the next waiter', async () => {
    const a = client(srv);
    const b = client(srv);
    const t = performance.now();
    const lock = await a.acquire('expiry', { leaseMs: 400 });
    let lostAt = 0;
    lock.onLost(() => (lostAt = performance.now()));
    const next = b.acquire('expiry', { leaseMs: 5000 }).then((l) => ((grantedAt = performance.now()), l));
    let grantedAt = 0;
    const l2 = await next;
    assert.ok(lostAt > 0 && lostAt <= grantedAt, 'lost before the next grant');
    assert.ok(lostAt - t >= 390 && lostAt - t < 1500, `lost after ${lostAt - t} ms`);
    assert.equal(lock.lostReason, 'expired');
    assert.ok(l2.token > lock.token);
    await assert.rejects(lock.release(), (e: unknown) => e instanceof LockLostError && e.reason === 'expired');
    await l2.release();
  });

  test('the server pushes EXPIRED with reason LEASE to the holder (raw protocol)', async () => {
    const sock = net.connect(srv.port, '127.0.0.1');
    const frames: Buffer[] = [];
    let wake = (): void => {};
    const reader = new FrameReader((f) => {
      frames.push(Buffer.from(f));
      wake();
    });
    sock.on('data', (d: Buffer) => reader.push(d));
    const next = async (): Promise<Buffer> => {
      const end = Date.now() + 5000;
      while (frames.length === 0) {
        if (Date.now() > end) throw new Error('no frame within 5 s');
        await new Promise<void>((r) => ((wake = r), setTimeout(r, 100)));
      }
      return frames.shift()!;
    };
    try {
      sock.write(encodeHello({ version: 1, sessionId: Buffer.alloc(16, 1), nonce: Buffer.alloc(32, 2) }));
      assert.equal(decodeChallenge(await next()).status, Status.OK);
      sock.write(encodeAuth({ proof: Buffer.alloc(32) }));
      const w = decodeWelcome(await next());
      assert.equal(w.status, Status.OK);
      assert.ok(Buffer.from(w.stateId).some((b) => b !== 0), 'a state id');
      sock.write(encodeRequest({ op: Op.ACQUIRE, id: 1n, leaseMs: 50, waitMs: 0, key: Buffer.from('pushed') }));
      const ok = decodeResponse(await next());
      assert.equal(ok.status, Status.OK);
      const exp = decodeResponse(await next());
      assert.equal(exp.op, Op.EXPIRED);
      assert.equal(exp.id, 0n);
      assert.equal(exp.token, ok.token);
      assert.equal(exp.detail, ExpiredReason.LEASE);
      assert.equal(exp.data.toString(), 'pushed');
    } finally {
      sock.destroy();
    }
  });

  test('keep-alive holds a short lease over several periods, and nothing is extended after release', async () => {
    const c = client(srv);
    // A 1 s lease (extended about every third of it): 300 ms let a loaded machine stall the
    // keep-alive past the lease now and then.
    const lock = await c.acquire('keepalive', { leaseMs: 1000, keepAlive: true });
    let lost = false;
    lock.onLost(() => (lost = true));
    for (let i = 0; i < 3; i++) {
      await sleep(1000);
      assert.ok(await held(srv, 'keepalive'), `still held after ${(i + 1) * 1000} ms`);
    }
    assert.ok(!lost && lock.isHeld);
    assert.ok(await lock.verify());
    await lock.release();
    assert.equal(await held(srv, 'keepalive'), false);
    await sleep(400);
    assert.equal(await held(srv, 'keepalive'), false);
    assert.ok(!lost, 'no lost signal after release');
  });

  test('await using releases; withLock reports a lock lost mid-work', async () => {
    const c = client(srv);
    {
      await using lock = await c.acquire('using', { leaseMs: 60_000 });
      assert.ok(await held(srv, 'using'));
      assert.ok(lock.isHeld);
    }
    assert.equal(await held(srv, 'using'), false);
    await assert.rejects(
      c.withLock('using', { leaseMs: 200 }, () => sleep(500)),
      (e: unknown) => e instanceof LockLostError && e.reason === 'expired',
    );
  });

  test('close() withdraws a waiting acquire at once; close does not release held locks', async () => {
    const a = client(srv);
    const lock = await a.acquire('close-waiter', { leaseMs: 60_000 });
    const b = createClient({ endpoints: srv.addr });
    const w = settledWithin(b.acquire('close-waiter', { leaseMs: 60_000 }), 5000);
    await eventually(async () => (await waiters(srv, 'close-waiter')) === 1, 3000, 'queued');
    await b.close();
    const r = await w;
    assert.ok(r !== 'pending' && !r.ok && r.error instanceof ClientClosedError);
    assert.equal(await waiters(srv, 'close-waiter'), 0);
    const holder = createClient({ endpoints: srv.addr });
    const h = await holder.acquire('close-holder', { leaseMs: 60_000 });
    await holder.close();
    assert.ok((await observer(srv).inspect('close-holder')).held, 'still held after close');
    await client(srv).release('close-holder', h.token);
    await lock.release();
  });

  test("a waiter's lease starts at the hand-off", async () => {
    const a = client(srv);
    const b = client(srv);
    const first = await a.acquire('handoff', { leaseMs: 60_000 });
    const w = b.acquire('handoff', { leaseMs: 300 });
    await eventually(async () => (await waiters(srv, 'handoff')) === 1, 3000, 'queued');
    await sleep(400); // longer than the waiter's lease
    const t = Date.now();
    await first.release();
    const lock = await w;
    assert.ok(lock.queuedMs >= 350, `queued ${lock.queuedMs} ms`);
    assert.ok(lock.deadline >= t + 250, 'the local deadline counts from the grant');
    await sleep(100);
    assert.ok(lock.isHeld);
    assert.ok(await held(srv, 'handoff'), 'still held 100 ms after the hand-off');
    await lock.release();
  });

  test('binary keys', async () => {
    const c = client(srv);
    const key = Buffer.from([0x00, 0xff, 0x10, 0xc3, 0xbc]);
    const lock = await c.acquire(key);
    assert.deepEqual(lock.key, key);
    assert.equal(await client(srv).tryAcquire(new Uint8Array(key)), null);
    await lock.release();
  });

  test('refuseHeld: already_held at once, nothing queued', async () => {
    const c = client(srv);
    const lock = await c.acquire('refuse', { leaseMs: 10_000 });
    await assert.rejects(c.acquire('refuse', { refuseHeld: true }), { name: 'AlreadyHeldError' });
    assert.equal(await waiters(srv, 'refuse'), 0);
    await lock.release();
  });
});

describe('sessions through a proxy', () => {
  let srv: RunningServer;
  before(async () => {
    srv = await startServer();
  });
  after(async () => {
    destroyAll();
    observers = new Map();
    await srv?.stop();
  });

  test('resume keeps a waiter its place in a 10-waiter queue', async () => {
    const holder = client(srv);
    const first = await holder.acquire('resume-q', { leaseMs: 30_000 });
    const proxies = await Promise.all(Array.from({ length: 10 }, () => startProxy(srv.addr)));
    const ws = proxies.map((p) => client(p.addr));
    const lostEvents: string[] = [];
    const order: number[] = [];
    const granted: Promise<Lock>[] = [];
    for (let i = 0; i < 10; i++) {
      granted.push(
        ws[i]!.acquire('resume-q', { leaseMs: 30_000 }).then(async (l) => {
          l.on('lost', (e) => lostEvents.push(e.reason));
          order.push(i);
          await l.release();
          return l;
        }),
      );
      await eventually(async () => (await waiters(srv, 'resume-q')) === i + 1, 3000, `waiter ${i} queued`);
    }
    proxies[2]!.cutAll();
    await eventually(() => proxies[2]!.accepted === 2 && ws[2]!.isConnected, 5000, 'the third waiter reconnected');
    assert.equal(await waiters(srv, 'resume-q'), 10);
    await first.release();
    const locks = await Promise.all(granted);
    assert.deepEqual(
      order,
      Array.from({ length: 10 }, (_, i) => i),
    );
    for (let i = 1; i < locks.length; i++) assert.ok(locks[i]!.token > locks[i - 1]!.token);
    assert.deepEqual(lostEvents, []);
    await Promise.all(proxies.map((p) => p.close()));
  });

  test('a retried ACQUIRE is answered from the table: the same token, never a second grant', async () => {
    const proxy = await startProxy(srv.addr);
    const a = client(proxy.addr);
    await a.connect();
    proxy.holdServerBytes = true;
    const acq = a.acquire('retry', { leaseMs: 10_000 });
    await eventually(() => held(srv, 'retry'), 3000, 'granted on the server (the answer is held back)');
    proxy.cutAll();
    proxy.holdServerBytes = false;
    const lock = await acq;
    assert.equal(proxy.accepted, 2, 'answered on the resumed connection');
    await lock.release();
    const r = client(srv);
    const next = await r.acquire('retry');
    assert.equal(next.token, lock.token + 1n, 'no grant happened in between');
    await next.release();
    await proxy.close();
  });

  test('a retried RELEASE replays its outcome; no lost signal', async () => {
    const proxy = await startProxy(srv.addr);
    const a = client(proxy.addr);
    const lock = await a.acquire('release-retry', { leaseMs: 10_000 });
    const lost: string[] = [];
    lock.on('lost', (e) => lost.push(e.reason));
    proxy.holdServerBytes = true;
    const rel = lock.release();
    await eventually(async () => !(await held(srv, 'release-retry')), 3000, 'released on the server');
    proxy.cutAll();
    proxy.holdServerBytes = false;
    await rel;
    assert.ok(lock.isReleased);
    assert.deepEqual(lost, []);
    await proxy.close();
  });
});

describe('restart (TICKETING_STARTUP_GRACE=0)', () => {
  test('the lock is lost "server restarted" on reconnect; the queued waiter fails, is not re-queued; nothing on the old lock succeeds', async () => {
    const srv = await startServer({ env: { TICKETING_STARTUP_GRACE: '0' } });
    try {
      const a = client(srv);
      const r = client(srv);
      const b = client(srv);
      const lock = await a.acquire('k', { leaseMs: 10_000, keepAlive: true });
      const lostEvents: string[] = [];
      lock.on('lost', (e) => lostEvents.push(e.reason));
      const rk2 = await r.acquire('k2', { leaseMs: 30_000 });
      const queued = settledWithin(b.acquire('k2', { leaseMs: 10_000 }), 10_000);
      await eventually(async () => (await r.inspect('k2')).waiters === 1, 3000, 'B queued');
      const oldSession = a.sessionId;
      await srv.restart();
      const t = performance.now();
      const e = await lock.lost;
      assert.ok(performance.now() - t < 3000, 'lost within 3 s');
      assert.equal(e.reason, 'server restarted');
      const q = await queued;
      assert.ok(q !== 'pending' && !q.ok && q.error instanceof ServerRestartedError, String(q !== 'pending' && !q.ok && q.error));
      const fresh = client(srv);
      assert.equal((await fresh.inspect('k2')).waiters, 0, 'the waiter is not re-queued on the new server');
      await assert.rejects(lock.release(), (x: unknown) => x instanceof LockLostError && x.reason === 'server restarted');
      await assert.rejects(lock.extend(), (x: unknown) => x instanceof LockLostError && x.reason === 'server restarted');
      assert.equal(await lock.verify(), false);
      await assert.rejects(rk2.release(), LockLostError);
      assert.notDeepEqual(a.sessionId, oldSession, 'a new session');
      const c = await fresh.tryAcquire('k');
      assert.ok(c, 'a new client acquires k at once');
      assert.ok(c.token > lock.token, 'tokens never go backwards');
      assert.deepEqual(lostEvents, ['server restarted']);
      await c.release();
    } finally {
      destroyAll();
      observers = new Map();
      await srv.stop();
    }
  });

  test('a call made while the client reconnects waits for the connection, bounded by its own timeout (docs/clients.md, rule 1)', async () => {
    const srv = await startServer({ env: { TICKETING_STARTUP_GRACE: '0' } });
    try {
      const a = client(srv);
      const lock = await a.acquire('reconnect', { leaseMs: 10_000 });
      await srv.kill('SIGKILL');
      const killed = performance.now();
      await sleep(100);
      let settled = false;
      const ping = settledWithin(a.ping(), 10_000);
      void ping.then(() => (settled = true));
      const short = settledWithin(a.ping({ timeoutMs: 400 }), 3000);
      // Its own timeout passes while the server is down (refused at every round): it fails then, not at once.
      const s = await short;
      const tookShort = performance.now() - killed - 100;
      assert.ok(s !== 'pending' && !s.ok && s.error instanceof TimeoutError && /within 400 ms/.test((s.error as Error).message), String(s !== 'pending' && !s.ok && s.error));
      assert.ok(tookShort >= 350 && tookShort < 1500, `the 400 ms call failed after ${tookShort} ms`);
      await sleep(Math.max(0, 1500 - (performance.now() - killed)));
      assert.equal(settled, false, 'the ping is still waiting while the server is down');
      await srv.restart(); // same port and data directory, TICKETING_STARTUP_GRACE=0
      const r = await ping;
      const took = performance.now() - killed;
      assert.ok(r !== 'pending' && r.ok, `the ping waited for the restarted server: ${String(r !== 'pending' && !r.ok && r.error)}`);
      assert.ok(took >= 1500 && took < 6000, `answered ${took} ms after the kill`);
      // A new state id: the lock is lost, the ping made while reconnecting was simply sent on the new session.
      assert.equal((await lock.lost).reason, 'server restarted');
    } finally {
      destroyAll();
      await srv.stop();
    }
  });

  test('graceful stop: holders lost "server stopping" before the process exits; waiters get ShuttingDownError', async () => {
    const srv = await startServer();
    try {
      const a = client(srv);
      const b = client(srv);
      const lock = await a.acquire('stopping', { leaseMs: 10_000 });
      let lostBeforeExit = false;
      const exited = new Promise<void>((r) => srv.proc.once('exit', () => r()));
      lock.onLost((e) => {
        lostBeforeExit = srv.proc.exitCode === null && srv.proc.signalCode === null;
        assert.equal(e.reason, 'server stopping');
      });
      const w = settledWithin(b.acquire('stopping'), 10_000);
      await eventually(async () => (await b.inspect('stopping')).waiters === 1, 3000, 'queued');
      srv.proc.kill('SIGTERM');
      const r = await w;
      assert.ok(r !== 'pending' && !r.ok && r.error instanceof ShuttingDownError);
      await exited;
      assert.equal(lock.lostReason, 'server stopping');
      assert.ok(lostBeforeExit, 'lost before the server exited');
    } finally {
      destroyAll();
      await srv.stop();
    }
  });

  test('session grace 0: a dropped connection fails a waiter "connection lost"', async () => {
    const srv = await startServer({ env: { TICKETING_SESSION_GRACE: '0' } });
    const proxy = await startProxy(srv.addr);
    try {
      const holder = client(srv);
      const l = await holder.acquire('nograce', { leaseMs: 30_000 });
      const w = client(proxy.addr);
      const p = settledWithin(w.acquire('nograce'), 5000);
      await eventually(async () => (await holder.inspect('nograce')).waiters === 1, 3000, 'queued');
      proxy.cutAll();
      const r = await p;
      assert.ok(r !== 'pending' && !r.ok && r.error instanceof ConnectionLostError, String(r !== 'pending' && !r.ok && r.error));
      await eventually(async () => (await holder.inspect('nograce')).waiters === 0, 3000, 'the waiter left');
      await l.release();
    } finally {
      destroyAll();
      await proxy.close();
      await srv.stop();
    }
  });
});

describe('frozen server (SIGSTOP)', () => {
  test('every call times out; close() returns in bounded time', async () => {
    const srv = await startServer();
    try {
      const a = client(srv, { requestTimeoutMs: 500, heartbeatIntervalMs: 200 });
      const lock = await a.acquire('frozen', { leaseMs: 30_000 });
      srv.proc.kill('SIGSTOP');
      // kill() only queues the signal: wait until every thread of the server is stopped (state T
      // in /proc), or a call sent at once may still be answered.
      const task = `/proc/${srv.proc.pid}/task`;
      await eventually(() => readdirSync(task).every((t) => /^\d+ \(.*\) T/.test(readFileSync(`${task}/${t}/stat`, 'utf8'))), 5000, 'the server to stop');
      const t = performance.now();
      const results = await Promise.allSettled([a.ping(), a.inspect('frozen'), a.release('other', 5n), a.acquire('frozen2', { waitTimeoutMs: 100 })]);
      const took = performance.now() - t;
      for (const r of results) {
        assert.ok(r.status === 'rejected' && (r.reason instanceof TimeoutError || r.reason instanceof ConnectionLostError), String((r as PromiseRejectedResult).reason));
      }
      assert.ok(took < 3000, `failed after ${took} ms`);
      const t2 = performance.now();
      await a.close();
      assert.ok(performance.now() - t2 < 5000, 'close within 5 s');
      assert.ok(!lock.isLost, 'a frozen server does not make a held lock lost before its deadline');
    } finally {
      srv.proc.kill('SIGCONT');
      destroyAll();
      await srv.stop();
    }
  });
});

describe('server with a token', () => {
  let srv: RunningServer;
  const token = 'correct horse battery staple';
  before(async () => {
    srv = await startServer({ token });
  });
  after(async () => {
    destroyAll();
    await srv?.stop();
  });

  test('the right token authenticates both ways', async () => {
    const lock = await client(srv, { token }).acquire('auth');
    await lock.release();
  });

  test('a wrong token -> AuthFailedError', async () => {
    await assert.rejects(client(srv, { token: 'wrong' }).connect(), (e: unknown) => e instanceof AuthFailedError && /rejected the token/.test(e.message));
  });

  test('no token -> AuthFailedError saying the server requires one', async () => {
    await assert.rejects(client(srv).connect(), (e: unknown) => e instanceof AuthFailedError && /requires a token/.test(e.message));
  });
});

describe('TLS', () => {
  let srv: RunningServer;
  let plain: RunningServer;
  before(async () => {
    srv = await startServer({ tls: true, token: 'tls-token' });
    plain = await startServer();
  });
  after(async () => {
    destroyAll();
    await srv?.stop();
    await plain?.stop();
  });

  test('TLS with the CA, by IP and by name', async () => {
    const ca = readFileSync(testCerts().ca);
    const lock = await client(srv, { tls: { ca }, token: 'tls-token' }).acquire('tls');
    await lock.release();
    const byName = client(`localhost:${srv.port}`, { tls: { ca }, token: 'tls-token' });
    assert.ok((await byName.ping()) >= 0);
  });

  test('an untrusted certificate is refused with TlsError', async () => {
    await assert.rejects(client(srv, { tls: true, token: 'tls-token' }).connect(), (e: unknown) => e instanceof TlsError && /certificate/i.test(e.message));
  });

  test('plaintext to a TLS server, and TLS to a plaintext server, fail promptly', async () => {
    const t = performance.now();
    await assert.rejects(
      client(srv, { token: 'tls-token', connectTimeoutMs: 2000 }).connect(),
      (e: unknown) => e instanceof TlsError || e instanceof TimeoutError || (e instanceof UnavailableError && /is the server using TLS\?/.test(e.message)),
    );
    const ca = readFileSync(testCerts().ca);
    await assert.rejects(client(plain, { tls: { ca }, connectTimeoutMs: 2000 }).connect(), (e: unknown) => e instanceof TlsError && /is the server using TLS\?/.test(e.message));
    assert.ok(performance.now() - t < 3000);
  });
});

describe('mutual TLS', () => {
  let srv: RunningServer;
  before(async () => {
    srv = await startServer({ mtls: true });
  });
  after(async () => {
    destroyAll();
    await srv?.stop();
  });

  test('with the client certificate: ok; without: refused', async () => {
    const c = testCerts();
    const ca = readFileSync(c.ca);
    const ok = client(srv, { tls: { ca, cert: readFileSync(c.clientCert), key: readFileSync(c.clientKey) } });
    const lock = await ok.acquire('mtls');
    await lock.release();
    const t = performance.now();
    await assert.rejects(client(srv, { tls: { ca }, connectTimeoutMs: 2000 }).connect(), (e: unknown) => e instanceof TlsError || e instanceof ConnectionLostError);
    assert.ok(performance.now() - t < 3000);
  });
});

describe('server with lock-delay', () => {
  test('inspect reports the lock-delay left after a lease expiry', async () => {
    const srv = await startServer({ env: { TICKETING_LOCK_DELAY: '2s' } });
    try {
      const c = client(srv);
      const lock = await c.acquire('delayed', { leaseMs: 100 });
      await lock.lost;
      let info = await c.inspect('delayed');
      await eventually(async () => (info = await c.inspect('delayed')).lockDelayRemainingMs > 0, 3000, 'lock-delay after expiry');
      assert.equal(info.held, false);
      assert.equal(info.token, null);
      assert.ok(info.lockDelayRemainingMs <= 2000, `lock-delay left ${info.lockDelayRemainingMs} ms`);
      assert.equal(await c.tryAcquire('delayed'), null, 'unavailable during the lock-delay');
    } finally {
      destroyAll();
      await srv.stop();
    }
  });
});
