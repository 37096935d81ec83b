// Integration tests against the real server binary (built by the tests unless TICKETING_BIN
// names one), started on a free loopback port.
import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import * as net from 'node:net';
import { after, before, describe, test } from 'node:test';
import {
  AuthFailedError,
  ConnectionLostError,
  InvalidRequestError,
  ShuttingDownError,
  NotAcquiredError,
  NotHeldError,
  createClient,
  type Client,
  type ClientOptions,
  type Lock,
} from '@ticketing/client';
import {
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
import { eventually, sleep, startServer, tlsFiles, type RunningServer } from './helpers.js';

const clients: Client[] = [];
function client(srv: RunningServer, opts: ClientOptions = {}): Client {
  const c = createClient({ endpoints: [srv.addr], ...opts });
  clients.push(c);
  return c;
}

/** True if `key` is free now, as seen by a fresh client (which then releases it). */
async function isFree(srv: RunningServer, key: string, opts: ClientOptions = {}): Promise<boolean> {
  const c = createClient({ endpoints: [srv.addr], ...opts });
  try {
    const l = await c.tryAcquire(key, { lease: 1000 });
    await l.release();
    return true;
  } catch (e) {
    if (e instanceof NotAcquiredError) return false;
    throw e;
  } finally {
    c.destroy();
  }
}

describe('plain server', () => {
  let srv: RunningServer;
  before(async () => {
    srv = await startServer();
  });
  after(async () => {
    for (const c of clients.splice(0)) c.destroy();
    await srv?.stop();
  });

  test('acquire, extend, release', async () => {
    const c = client(srv);
    await c.connect();
    const lock = await c.acquire('basic', { lease: 5000 });
    assert.equal(typeof lock.token, 'bigint');
    assert.ok(lock.token > 0n);
    assert.equal(lock.key, 'basic');
    assert.equal(lock.leaseMs, 5000);
    assert.ok(lock.deadline > Date.now() + 4000 && lock.deadline <= Date.now() + 5000);
    await lock.extend(20_000);
    assert.equal(lock.leaseMs, 20_000);
    assert.ok(lock.deadline > Date.now() + 19_000);
    await lock.release();
    assert.ok(await isFree(srv, 'basic'));
  });

  test('tokens strictly increase; tryAcquire on a held key -> NotAcquiredError', async () => {
    const a = client(srv);
    const b = client(srv);
    const l1 = await a.acquire('held');
    await assert.rejects(b.tryAcquire('held'), NotAcquiredError);
    const t = Date.now();
    await assert.rejects(b.acquire('held', { waitTimeout: 150 }), NotAcquiredError);
    assert.ok(Date.now() - t >= 140, 'waited for the timeout');
    await l1.release();
    const l2 = await b.tryAcquire('held');
    assert.ok(l2.token > l1.token);
    await l2.release();
  });

  test('20 waiters are granted in arrival order with increasing tokens', async () => {
    const holder = client(srv);
    const first = await holder.acquire('fifo', { lease: 30_000 });
    const waiters = await Promise.all(Array.from({ length: 20 }, () => client(srv).connect()));
    const order: number[] = [];
    const granted: Promise<Lock>[] = [];
    for (let i = 0; i < 20; i++) {
      const p = waiters[i]!.acquire('fifo', { lease: 30_000 }).then(async (l) => {
        order.push(i);
        await sleep(1);
        await l.release();
        return l;
      });
      granted.push(p);
      await waiters[i]!.ping(); // answered after the acquire joined the queue: arrival order is i
    }
    await first.release();
    const locks = await Promise.all(granted);
    assert.deepEqual(
      order,
      Array.from({ length: 20 }, (_, i) => i),
    );
    let prev = first.token;
    for (const l of locks) {
      assert.ok(l.token > prev, `token ${l.token} after ${prev}`);
      prev = l.token;
    }
  });

  test('release with a stale token -> NotHeldError and changes nothing', async () => {
    const a = client(srv);
    const old = await a.acquire('stale');
    await old.release();
    const cur = await a.acquire('stale');
    await assert.rejects(a.release('stale', old.token), NotHeldError);
    await assert.rejects(a.extend('stale', old.token, 1000), NotHeldError);
    assert.ok(!(await isFree(srv, 'stale')), 'the current holder still holds it');
    // Release needs only key + token, from any connection.
    const other = client(srv);
    await other.release('stale', cur.token);
    assert.ok(await isFree(srv, 'stale'));
  });

  test('INVALID answers carry the field', async () => {
    const c = client(srv);
    await assert.rejects(c.acquire('k'.repeat(300)), (e: unknown) => e instanceof InvalidRequestError && e.fieldName === 'KEY');
    await c.ping(); // the connection stays open
  });

  test('many concurrent requests on one client', async () => {
    const c = client(srv);
    const N = 500;
    const locks = await Promise.all(Array.from({ length: N }, (_, i) => c.acquire(`many-${i}`, { lease: 30_000 })));
    const pings = Array.from({ length: 200 }, () => c.ping());
    assert.equal(new Set(locks.map((l) => l.token)).size, N);
    await Promise.all([...locks.map((l) => l.release()), ...pings]);
    // And the same key from many requests at once: one at a time, FIFO.
    let inside = 0;
    let maxInside = 0;
    await Promise.all(
      Array.from({ length: 50 }, () =>
        c.withLock('many-shared', { lease: 30_000 }, async () => {
          inside++;
          maxInside = Math.max(maxInside, inside);
          await sleep(0);
          inside--;
        }),
      ),
    );
    assert.equal(maxInside, 1);
  });

  test('abort while waiting leaves no lock held', async () => {
    const holder = client(srv);
    const waiter = client(srv);
    const lock = await holder.acquire('abort', { lease: 60_000 });
    const ac = new AbortController();
    const p = waiter.acquire('abort', { lease: 60_000, signal: ac.signal });
    await waiter.ping();
    ac.abort();
    await assert.rejects(p, { name: 'AbortError' });
    await lock.release();
    assert.ok(await isFree(srv, 'abort'), 'the aborted waiter was never granted');

    // The race: the hand-off and the abort at the same moment. Whoever wins, the key ends free.
    for (let i = 0; i < 20; i++) {
      const key = `abort-race-${i}`;
      const l = await holder.acquire(key, { lease: 60_000 });
      const ac2 = new AbortController();
      const w = waiter.acquire(key, { lease: 60_000, signal: ac2.signal });
      w.catch(() => {});
      await waiter.ping();
      if (i % 2) await sleep(0);
      const rel = l.release();
      if (i % 3 === 0) await sleep(1);
      ac2.abort();
      await rel;
      // Either the abort won (AbortError), or the grant reached the client before abort() was
      // called: then acquire had already resolved and the caller holds the lock.
      const got = await w.then(
        (lock) => lock,
        (e: unknown) => {
          assert.equal((e as Error).name, 'AbortError');
          return undefined;
        },
      );
      await got?.release();
      await eventually(() => isFree(srv, key), 3000, `${key} free (lease is 60 s)`);
    }
  });

  test('lost fires at expiry, and the key is then free', async () => {
    const c = client(srv);
    const t = Date.now();
    const lock = await c.acquire('expiry', { lease: 200 });
    const lost = await lock.lost;
    const took = Date.now() - t;
    assert.ok(took >= 150 && took < 1000, `lost after ${took} ms`);
    assert.ok(['deadline', 'expired'].includes(lost.reason));
    assert.ok(lock.isLost);
    await eventually(() => isFree(srv, 'expiry'), 2000, 'server reclaims the lock');
    await assert.rejects(lock.extend(), /lost/);
  });

  test('the server pushes EXPIRED to the holder connection (raw protocol)', async () => {
    const sock = net.connect(srv.port, '127.0.0.1');
    const frames: Buffer[] = [];
    let wake = (): void => {};
    const reader = new FrameReader((f) => {
      frames.push(Buffer.from(f));
      wake();
    });
    sock.on('data', (d: Buffer) => reader.push(d));
    const next = async (): Promise<Buffer> => {
      while (frames.length === 0) await new Promise<void>((r) => (wake = r));
      return frames.shift()!;
    };
    try {
      sock.write(encodeHello({ version: 1, sessionId: Buffer.alloc(16, 1), nonce: Buffer.alloc(32, 2) }));
      const ch = decodeChallenge(await next());
      assert.equal(ch.status, Status.OK);
      sock.write(encodeAuth({ proof: Buffer.alloc(32) }));
      assert.equal(decodeWelcome(await next()).status, Status.OK);
      sock.write(encodeRequest({ op: Op.ACQUIRE, id: 1n, leaseMs: 50, waitMs: 0, key: Buffer.from('pushed') }));
      const ok = decodeResponse(await next());
      assert.equal(ok.status, Status.OK);
      const exp = decodeResponse(await next());
      assert.equal(exp.op, Op.EXPIRED);
      assert.equal(exp.id, 0n);
      assert.equal(exp.token, ok.token);
      assert.equal(exp.data.toString(), 'pushed');
    } finally {
      sock.destroy();
    }
  });

  test('keep-alive holds a short-lease lock over several lease periods', async () => {
    const c = client(srv);
    const lock = await c.acquire('keepalive', { lease: 300, keepAlive: true });
    let lostEarly = false;
    lock.onLost(() => (lostEarly = true));
    for (let i = 0; i < 4; i++) {
      await sleep(300);
      assert.ok(!(await isFree(srv, 'keepalive')), `still held after ${(i + 1) * 300} ms`);
    }
    assert.ok(!lostEarly && lock.isHeld);
    await lock.release();
    assert.ok(await isFree(srv, 'keepalive'));
    await sleep(400);
    assert.ok(!lostEarly, 'no lost signal after release');
  });

  test('await using releases', async () => {
    const c = client(srv);
    {
      await using lock = await c.acquire('using', { lease: 60_000 });
      assert.ok(!(await isFree(srv, 'using')));
      assert.ok(lock.isHeld);
    }
    assert.ok(await isFree(srv, 'using'));
  });

  test('a waiter whose connection closes leaves the queue', async () => {
    const a = client(srv);
    const lock = await a.acquire('gone-waiter', { lease: 60_000 });
    const b = createClient({ endpoints: [srv.addr] });
    const w = b.acquire('gone-waiter', { lease: 60_000 });
    await b.ping();
    b.destroy();
    await assert.rejects(w, ConnectionLostError);
    await sleep(50);
    await lock.release();
    assert.ok(await isFree(srv, 'gone-waiter'), 'never handed to the closed connection');
  });

  test("a waiter's lease starts at the hand-off", async () => {
    const a = client(srv);
    const b = client(srv);
    const first = await a.acquire('handoff', { lease: 60_000 });
    const t = Date.now();
    const w = b.acquire('handoff', { lease: 300 });
    await b.ping();
    await sleep(400); // longer than the waiter's lease
    await first.release();
    const lock = await w;
    assert.ok(lock.queuedMs >= 350, `queued ${lock.queuedMs} ms`);
    assert.ok(lock.deadline >= t + 650, 'local deadline counts from the grant');
    await sleep(100);
    assert.ok(lock.isHeld);
    assert.ok(!(await isFree(srv, 'handoff')), 'still held 100 ms after the hand-off');
    await lock.release();
  });

  test('inspect a free key: token null and zeros', async () => {
    const c = client(srv);
    assert.deepEqual(await c.inspect('inspect-free'), { token: null, leaseRemainingMs: 0, waiters: 0, heldForMs: 0, lockDelayRemainingMs: 0 });
  });

  test('inspect a held key with one waiter', async () => {
    const a = client(srv);
    const b = client(srv);
    const holder = await a.acquire('inspect-held', { lease: 10_000 });
    const w = b.acquire('inspect-held', { lease: 10_000 });
    await b.ping(); // answered after the acquire joined the queue
    const info = await b.inspect('inspect-held'); // any client may ask, even the waiter's
    assert.equal(info.token, holder.token);
    assert.equal(info.waiters, 1);
    assert.ok(info.leaseRemainingMs > 0 && info.leaseRemainingMs <= 10_000, `lease left ${info.leaseRemainingMs} ms`);
    assert.ok(info.heldForMs >= 0 && info.heldForMs < 10_000, `held for ${info.heldForMs} ms`);
    assert.equal(info.lockDelayRemainingMs, 0);
    await holder.release();
    const next = await w;
    const handedOff = await a.inspect('inspect-held');
    assert.equal(handedOff.token, next.token);
    assert.equal(handedOff.waiters, 0);
    await next.release();
    assert.equal((await a.inspect('inspect-held')).token, null);
  });

  test('binary keys', async () => {
    const c = client(srv);
    const key = Buffer.from([0x00, 0xff, 0x10, 0xc3, 0xbc]);
    const lock = await c.acquire(key);
    assert.deepEqual(lock.key, key);
    await assert.rejects(client(srv).tryAcquire(new Uint8Array(key)), NotAcquiredError);
    await lock.release();
  });
});

describe('server with a token', () => {
  let srv: RunningServer;
  const token = 'correct horse battery staple';
  before(async () => {
    srv = await startServer({ token });
  });
  after(async () => {
    for (const c of clients.splice(0)) c.destroy();
    await srv?.stop();
  });

  test('the right token authenticates both ways', async () => {
    const c = client(srv, { token });
    const lock = await c.acquire('auth');
    await lock.release();
  });

  test('a wrong token -> AuthFailedError', async () => {
    await assert.rejects(client(srv, { token: 'wrong' }).connect(), AuthFailedError);
  });

  test('no token -> AuthFailedError saying the server requires one', async () => {
    await assert.rejects(client(srv).connect(), (e: unknown) => e instanceof AuthFailedError && /requires a token/.test(e.message));
  });
});

describe('TLS server', () => {
  let srv: RunningServer;
  before(async () => {
    srv = await startServer({ tls: true, token: 'tls-token' });
  });
  after(async () => {
    for (const c of clients.splice(0)) c.destroy();
    await srv?.stop();
  });

  test('TLS with the test CA, by IP and by name', async () => {
    const ca = readFileSync(tlsFiles.ca);
    const c = client(srv, { tls: { ca }, token: 'tls-token' });
    const lock = await c.acquire('tls');
    await lock.release();
    const byName = createClient({ endpoints: [`localhost:${srv.port}`], tls: { ca }, token: 'tls-token' });
    clients.push(byName);
    assert.ok((await byName.ping()) >= 0);
  });

  test('an untrusted certificate is refused', async () => {
    await assert.rejects(client(srv, { tls: true, token: 'tls-token' }).connect(), /certificate/i);
  });
});

describe('server with lock-delay', () => {
  test('inspect reports the lock-delay left after a lease expiry', async () => {
    const srv = await startServer({ env: { TICKETING_LOCK_DELAY: '2s' } });
    try {
      const c = client(srv);
      const lock = await c.acquire('delayed', { lease: 100 });
      await lock.lost;
      let info = await c.inspect('delayed');
      await eventually(async () => (info = await c.inspect('delayed')).lockDelayRemainingMs > 0, 3000, 'lock-delay after expiry');
      assert.equal(info.token, null);
      assert.equal(info.leaseRemainingMs, 0);
      assert.equal(info.heldForMs, 0);
      assert.ok(info.lockDelayRemainingMs <= 2000, `lock-delay left ${info.lockDelayRemainingMs} ms`);
    } finally {
      for (const c of clients.splice(0)) c.destroy();
      await srv.stop();
    }
  });
});

describe('server shutdown', () => {
  test('a waiting acquire is answered, not left hanging, when the server stops', async () => {
    const srv = await startServer();
    try {
      const a = client(srv);
      const b = client(srv);
      await a.acquire('shutdown', { lease: 60_000 });
      const w = b.acquire('shutdown');
      w.catch(() => {});
      await b.ping();
      srv.proc.kill('SIGTERM');
      await assert.rejects(w, (e: unknown) => e instanceof ShuttingDownError || e instanceof ConnectionLostError);
    } finally {
      for (const c of clients.splice(0)) c.destroy();
      await srv.stop();
    }
  });
});
