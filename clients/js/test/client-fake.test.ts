// Client behaviour against a scripted fake server: the cases a real server cannot be made to
// produce on demand (races, redirects, bad proofs, split frames, dropped connections).
import assert from 'node:assert/strict';
import * as net from 'node:net';
import { after, describe, test } from 'node:test';
import {
  AuthFailedError,
  BusyError,
  CancelledError,
  ClientClosedError,
  ConnectionLostError,
  LockLostError,
  NotAcquiredError,
  NotHeldError,
  Op,
  ProtocolError,
  Status,
  UnsupportedVersionError,
  createClient,
  type Client,
} from '@ticketing/client';
import { encodeResponse, type Request } from '@ticketing/client/protocol';
import { deadAddr, defaultAnswer, eventually, fakeServer, sleep, type FakeConn, type FakeServer } from './helpers.js';

const cleanups: (() => unknown)[] = [];
after(async () => {
  for (const c of cleanups.reverse()) await c();
});

async function setup(opts: Parameters<typeof fakeServer>[0] = {}, clientOpts: Parameters<typeof createClient>[0] = {}): Promise<{ srv: FakeServer; client: Client }> {
  const srv = await fakeServer(opts);
  const client = createClient({ endpoints: [srv.addr], connectTimeout: 2000, ...clientOpts });
  cleanups.push(() => srv.close(), () => client.destroy());
  return { srv, client };
}

const noAnswerToAcquire = (c: FakeConn, r: Request): void => {
  if (r.op !== Op.ACQUIRE) defaultAnswer(c, r);
};

describe('handshake', () => {
  test('sends a 16-byte session id and numbers requests from 1n', async () => {
    const { srv, client } = await setup();
    await client.connect();
    assert.ok(client.isConnected);
    await client.ping();
    await client.ping();
    const c = await srv.conn(0);
    assert.deepEqual(c.sessionId, client.sessionId);
    assert.equal(client.sessionId.length, 16);
    assert.deepEqual(
      c.requests.map((r) => r.id),
      [1n, 2n],
    );
  });

  test('refuses a server without AUTH_REQUIRED when a token is configured', async () => {
    const { client } = await setup({}, { token: 'secret' });
    await assert.rejects(client.connect(), (e: unknown) => e instanceof AuthFailedError && /does not require authentication/.test(e.message));
  });

  test('refuses a server whose proof does not verify', async () => {
    const { client } = await setup({ bogusProof: true }, { token: 'secret' });
    await assert.rejects(client.connect(), (e: unknown) => e instanceof AuthFailedError && /failed to prove/.test(e.message));
  });

  test('mutual auth with the right token', async () => {
    const { client } = await setup({ token: 'secret' }, { token: 'secret' });
    await client.connect();
    assert.ok((await client.ping()) >= 0);
  });

  test('wrong token -> AuthFailedError; no token -> "requires a token"', async () => {
    const { client } = await setup({ token: 'secret' }, { token: 'wrong' });
    await assert.rejects(client.connect(), AuthFailedError);
    const { client: c2 } = await setup({ token: 'secret' });
    await assert.rejects(c2.connect(), (e: unknown) => e instanceof AuthFailedError && /requires a token/.test(e.message));
  });

  test('CHALLENGE UNSUPPORTED_VERSION and BUSY', async () => {
    const { client } = await setup({ challengeStatus: Status.UNSUPPORTED_VERSION });
    await assert.rejects(client.connect(), UnsupportedVersionError);
    const { client: c2 } = await setup({ challengeStatus: Status.BUSY });
    await assert.rejects(c2.connect(), BusyError);
  });

  test('connect timeout when the server never answers', async () => {
    const mute = net.createServer(() => {});
    await new Promise<void>((r) => mute.listen(0, '127.0.0.1', r));
    const sockets: net.Socket[] = [];
    mute.on('connection', (s) => sockets.push(s));
    cleanups.push(() => {
      sockets.forEach((s) => s.destroy());
      return new Promise((r) => mute.close(r));
    });
    const client = createClient({ endpoints: [`127.0.0.1:${(mute.address() as net.AddressInfo).port}`], connectTimeout: 200 });
    const t = Date.now();
    await assert.rejects(client.connect(), (e: unknown) => e instanceof ConnectionLostError && /timed out/.test(e.message));
    assert.ok(Date.now() - t < 2000);
  });

  test('tries endpoints in order', async () => {
    const srv = await fakeServer();
    cleanups.push(() => srv.close());
    const client = createClient({ endpoints: [await deadAddr(), srv.addr] });
    cleanups.push(() => client.destroy());
    await client.connect();
    assert.equal(client.endpoint, srv.addr);
  });

  test('no endpoint reachable -> ConnectionLostError', async () => {
    const client = createClient({ endpoints: [await deadAddr(), await deadAddr()] });
    await assert.rejects(client.connect(), (e: unknown) => e instanceof ConnectionLostError && /could not connect/.test(e.message));
  });
});

describe('pipelining', () => {
  test('answers out of order are matched by request id', async () => {
    const held: Request[] = [];
    const { srv, client } = await setup({
      onRequest: (c, r) => {
        if (r.op !== Op.ACQUIRE) return defaultAnswer(c, r);
        held.push(r);
        if (held.length === 50) {
          for (const h of held.reverse()) c.send({ op: h.op, id: h.id, token: 1000n + BigInt(Number(h.key!.toString().slice(2))), leaseMs: 5000 });
        }
      },
    });
    const locks = await Promise.all(Array.from({ length: 50 }, (_, i) => client.acquire(`k-${i}`, { lease: 5000 })));
    locks.forEach((l, i) => assert.equal(l.token, 1000n + BigInt(i)));
    assert.equal((await srv.conn(0)).requests.length, 50);
  });

  test('a waiting acquire does not block other requests', async () => {
    const { client } = await setup({ onRequest: noAnswerToAcquire });
    const ac = new AbortController();
    const waiting = client.acquire('busy', { signal: ac.signal });
    waiting.catch(() => {});
    for (let i = 0; i < 10; i++) await client.ping();
    ac.abort();
    await assert.rejects(waiting, { name: 'AbortError' });
  });

  test('frames split byte by byte and many frames per write', async () => {
    let queue = Promise.resolve(); // one writer, so frames never interleave
    const { client } = await setup({
      onRequest: (c, r) => {
        const frame = encodeResponse({ op: r.op, status: 0, id: r.id, token: 2n ** 63n + r.id, leaseMs: 1000, detail: 0 });
        queue = queue.then(async () => {
          if (r.id % 2n === 0n) {
            for (const b of frame) {
              c.socket.write(Buffer.from([b]));
              await sleep(1);
            }
          } else {
            c.socket.write(Buffer.concat([frame, encodeResponse({ op: Op.EXPIRED, status: 0, id: 0n, token: 1n, leaseMs: 0, detail: 0, data: Buffer.from('other') })]));
          }
        });
      },
    });
    const locks = await Promise.all(Array.from({ length: 6 }, (_, i) => client.acquire(`s${i}`)));
    for (const l of locks) assert.ok(l.token > 2n ** 63n, 'tokens above 2^53 keep every bit');
    assert.equal(new Set(locks.map((l) => l.token)).size, 6);
  });

  test('64-bit tokens survive exactly', async () => {
    const { client } = await setup({ onRequest: (c, r) => c.send({ op: r.op, id: r.id, token: 0xfffffffffffffffen, leaseMs: 1000 }) });
    const lock = await client.acquire('big');
    assert.equal(lock.token, 18446744073709551614n);
  });
});

describe('cancellation', () => {
  test('abort while waiting sends CANCEL and rejects with the reason', async () => {
    const { srv, client } = await setup({
      onRequest: (c, r) => {
        if (r.op === Op.ACQUIRE) return;
        if (r.op === Op.CANCEL) {
          c.send({ op: Op.ACQUIRE, id: r.token!, status: Status.CANCELLED });
          c.send({ op: Op.CANCEL, id: r.id, detail: 1 });
          return;
        }
        defaultAnswer(c, r);
      },
    });
    const ac = new AbortController();
    const p = client.acquire('k', { signal: ac.signal });
    const c = await srv.conn(0);
    const acq = await c.next((r) => r.op === Op.ACQUIRE);
    const reason = new Error('stop waiting');
    ac.abort(reason);
    await assert.rejects(p, (e) => e === reason);
    const cancel = await c.next((r) => r.op === Op.CANCEL);
    assert.equal(cancel.token, acq.id);
    await client.ping();
    assert.ok(!c.requests.some((r) => r.op === Op.RELEASE));
  });

  test('a grant that races the abort is released', async () => {
    const { srv, client } = await setup({
      onRequest: (c, r) => {
        if (r.op === Op.ACQUIRE) return;
        if (r.op === Op.CANCEL) {
          // The grant happened before the CANCEL arrived: ACQUIRE OK, then CANCEL OK detail 0.
          c.send({ op: Op.ACQUIRE, id: r.token!, token: 777n, leaseMs: 60_000 });
          c.send({ op: Op.CANCEL, id: r.id, detail: 0 });
          return;
        }
        defaultAnswer(c, r);
      },
    });
    const ac = new AbortController();
    const p = client.acquire('raced', { signal: ac.signal, lease: 60_000 });
    const c = await srv.conn(0);
    await c.next((r) => r.op === Op.ACQUIRE);
    ac.abort();
    await assert.rejects(p, { name: 'AbortError' });
    const rel = await c.next((r) => r.op === Op.RELEASE);
    assert.equal(rel.token, 777n);
    assert.equal(rel.key.toString(), 'raced');
  });

  test('an already aborted signal sends nothing', async () => {
    const { srv, client } = await setup();
    await client.connect();
    const reason = new Error('already');
    await assert.rejects(client.acquire('k', { signal: AbortSignal.abort(reason) }), (e) => e === reason);
    await client.ping();
    assert.deepEqual(
      (await srv.conn(0)).requests.map((r) => r.op),
      [Op.PING],
    );
  });

  test('TIMED_OUT -> NotAcquiredError; CANCELLED -> CancelledError', async () => {
    const { client } = await setup({
      onRequest: (c, r) => c.send({ op: r.op, id: r.id, status: r.key.toString() === 't' ? Status.TIMED_OUT : Status.CANCELLED }),
    });
    await assert.rejects(client.tryAcquire('t'), NotAcquiredError);
    await assert.rejects(client.acquire('c'), CancelledError);
  });

  test('wait timeout and lease go on the wire as ms', async () => {
    const { srv, client } = await setup();
    await (await client.acquire('a', { lease: 1234, waitTimeout: 5000 })).release();
    await (await client.tryAcquire('b', { lease: 10 })).release();
    await (await client.acquire('c')).release();
    const acq = (await srv.conn(0)).requests.filter((r) => r.op === Op.ACQUIRE);
    assert.equal(acq[0]!.leaseMs, 1234);
    assert.ok(acq[0]!.waitMs! <= 5000 && acq[0]!.waitMs! >= 4900);
    assert.equal(acq[1]!.waitMs, 0);
    assert.equal(acq[2]!.waitMs, 0xffffffff);
    assert.equal(acq[2]!.leaseMs, 30_000);
  });

  test('bad arguments reject before anything is sent', async () => {
    const { srv, client } = await setup();
    await assert.rejects(client.acquire(''), RangeError);
    await assert.rejects(client.acquire('k', { lease: 0 }), RangeError);
    await assert.rejects(client.acquire('k', { waitTimeout: -1 }), RangeError);
    await assert.rejects(client.acquire('k'.repeat(70_000)), RangeError);
    await assert.rejects(client.extend('k', 1n, -5), RangeError);
    await client.ping();
    assert.deepEqual(
      (await srv.conn(0)).requests.map((r) => r.op),
      [Op.PING],
    );
  });
});

describe('inspect', () => {
  test('sends the key and maps the answer', async () => {
    const { srv, client } = await setup({
      onRequest: (c, r) => {
        if (r.op !== Op.INSPECT) return defaultAnswer(c, r);
        c.send({ op: r.op, id: r.id, token: 0xfffffffffffffffen, leaseMs: 25_000, detail: 3, data: Buffer.from('0000138800000064', 'hex') });
      },
    });
    const info = await client.inspect(Buffer.from([0, 0xff]));
    assert.deepEqual(info, { token: 0xfffffffffffffffen, leaseRemainingMs: 25_000, waiters: 3, heldForMs: 5000, lockDelayRemainingMs: 100 });
    const req = await (await srv.conn(0)).next((r) => r.op === Op.INSPECT);
    assert.deepEqual(req.key, Buffer.from([0, 0xff]));
    assert.equal(req.token, 0n);
    assert.equal(req.leaseMs, 0);
    assert.equal(req.waitMs, 0);
  });

  test('token 0 is null', async () => {
    const { client } = await setup({
      onRequest: (c, r) => (r.op === Op.INSPECT ? c.send({ op: r.op, id: r.id, data: Buffer.alloc(8) }) : defaultAnswer(c, r)),
    });
    assert.deepEqual(await client.inspect('free'), { token: null, leaseRemainingMs: 0, waiters: 0, heldForMs: 0, lockDelayRemainingMs: 0 });
  });

  test('aborting the signal rejects with the reason; the late answer is dropped', async () => {
    let answer = (): void => {};
    const { srv, client } = await setup({
      onRequest: (c, r) => {
        if (r.op !== Op.INSPECT) return defaultAnswer(c, r);
        answer = () => c.send({ op: r.op, id: r.id, data: Buffer.alloc(8) });
      },
    });
    const ac = new AbortController();
    const p = client.inspect('k', { signal: ac.signal });
    await (await srv.conn(0)).next((r) => r.op === Op.INSPECT);
    const reason = new Error('enough');
    ac.abort(reason);
    await assert.rejects(p, (e) => e === reason);
    answer();
    await client.ping(); // the connection is fine, and the late answer went nowhere
    await client.close();
  });

  test('an already aborted signal sends nothing', async () => {
    const { srv, client } = await setup();
    await client.connect();
    const reason = new Error('already');
    await assert.rejects(client.inspect('k', { signal: AbortSignal.abort(reason) }), (e) => e === reason);
    await client.ping();
    assert.deepEqual(
      (await srv.conn(0)).requests.map((r) => r.op),
      [Op.PING],
    );
  });

  test('an answer without its 8 bytes of data -> ProtocolError', async () => {
    const { client } = await setup(); // the default answer has no data
    await assert.rejects(client.inspect('k'), (e: unknown) => e instanceof ProtocolError && /INSPECT data/.test(e.message));
  });
});

describe('failover', () => {
  test('NOT_LEADER moves to the hinted leader and retries with the same request id', async () => {
    const leader = await fakeServer();
    const follower = await fakeServer({
      onRequest: (c, r) => c.send({ op: r.op, id: r.id, status: Status.NOT_LEADER, data: Buffer.from(leader.addr) }),
    });
    cleanups.push(() => leader.close(), () => follower.close());
    const client = createClient({ endpoints: [follower.addr] });
    cleanups.push(() => client.destroy());
    const lock = await client.acquire('k');
    assert.equal(client.endpoint, leader.addr);
    const f = (await follower.conn(0)).requests[0]!;
    const l = (await leader.conn(0)).requests[0]!;
    assert.equal(l.id, f.id);
    assert.deepEqual((await leader.conn(0)).sessionId, (await follower.conn(0)).sessionId);
    await lock.release();
  });

  test('SHUTTING_DOWN moves to the next endpoint and retries', async () => {
    const stopping = await fakeServer({ onRequest: (c, r) => c.send({ op: r.op, id: r.id, status: Status.SHUTTING_DOWN }) });
    const next = await fakeServer();
    cleanups.push(() => stopping.close(), () => next.close());
    const client = createClient({ endpoints: [stopping.addr, next.addr] });
    cleanups.push(() => client.destroy());
    await client.ping();
    assert.equal(client.endpoint, next.addr);
    assert.equal((await stopping.conn(0)).requests.length, 1);
  });

  test('a dropped connection rejects in-flight requests; the next call reconnects with the same session', async () => {
    const { srv, client } = await setup({
      onRequest: (c, r) => {
        if (r.op === Op.ACQUIRE && r.key.toString() === 'drop') c.socket.destroy();
        else defaultAnswer(c, r);
      },
    });
    const disconnects: unknown[] = [];
    client.on('disconnect', (e) => disconnects.push(e));
    await assert.rejects(client.acquire('drop'), ConnectionLostError);
    await eventually(() => !client.isConnected, 2000, 'disconnect');
    assert.equal(disconnects.length, 1);
    const lock = await client.acquire('fine');
    const [c0, c1] = [await srv.conn(0), await srv.conn(1)];
    assert.deepEqual(c1.sessionId, c0.sessionId);
    assert.ok(c1.requests[0]!.id > c0.requests[0]!.id, 'request ids keep counting across reconnects');
    await lock.release();
  });
});

describe('lock', () => {
  test('EXPIRED notice fires the lost signal', async () => {
    const { srv, client } = await setup();
    const lock = await client.acquire('exp', { lease: 60_000 });
    const events: LockLostError[] = [];
    const callbacks: LockLostError[] = [];
    lock.on('lost', (e) => events.push(e));
    lock.onLost((e) => callbacks.push(e));
    const signal = lock.signal;
    const c = await srv.conn(0);
    c.send({ op: Op.EXPIRED, id: 0n, token: lock.token + 1n, data: Buffer.from('exp') }); // not ours
    c.send({ op: Op.EXPIRED, id: 0n, token: lock.token, data: Buffer.from('exp') });
    const e = await lock.lost;
    assert.ok(e instanceof LockLostError);
    assert.equal(e.reason, 'expired');
    assert.ok(lock.isLost);
    assert.ok(signal.aborted);
    assert.equal(signal.reason, e);
    await sleep(5);
    assert.deepEqual(events, [e]);
    assert.deepEqual(callbacks, [e]);
    const late: LockLostError[] = [];
    lock.onLost((x) => late.push(x));
    await sleep(1);
    assert.deepEqual(late, [e]);
    await assert.rejects(lock.extend(), LockLostError);
  });

  test('the local deadline fires the lost signal at t_send + queued + lease', async () => {
    const { client } = await setup({ onRequest: (c, r) => c.send({ op: r.op, id: r.id, token: 5n, leaseMs: r.leaseMs!, detail: 40 }) });
    const t0 = Date.now();
    const lock = await client.acquire('d', { lease: 100 });
    const t1 = Date.now();
    assert.equal(lock.queuedMs, 40);
    // t_send lies between t0 and t1, so the deadline does too, shifted by queued + lease
    // (5 ms of slack: Date.now() is whole ms and drifts from performance.timeOrigin + now()).
    assert.ok(lock.deadline >= t0 + 135 && lock.deadline <= t1 + 145, `deadline ${lock.deadline - t0} ms after t0, t1 at ${t1 - t0}`);
    const e = await lock.lost;
    const took = Date.now() - t0;
    assert.equal(e.reason, 'deadline');
    assert.ok(took >= 130 && took < 1000, `lost after ${took} ms`);
  });

  test('NOT_HELD on extend loses the lock', async () => {
    const { client } = await setup({
      onRequest: (c, r) => (r.op === Op.EXTEND ? c.send({ op: r.op, id: r.id, status: Status.NOT_HELD }) : defaultAnswer(c, r)),
    });
    const lock = await client.acquire('n', { lease: 60_000 });
    await assert.rejects(lock.extend(1000), NotHeldError);
    assert.equal((await lock.lost).reason, 'not-held');
  });

  test('extend moves the deadline', async () => {
    const { srv, client } = await setup();
    const lock = await client.acquire('x', { lease: 1000 });
    const d0 = lock.deadline;
    await lock.extend(60_000);
    assert.equal(lock.leaseMs, 60_000);
    assert.ok(lock.deadline > d0 + 50_000);
    const ext = (await srv.conn(0)).requests.find((r) => r.op === Op.EXTEND)!;
    assert.equal(ext.token, lock.token);
    assert.equal(ext.leaseMs, 60_000);
    assert.equal(ext.key.toString(), 'x');
  });

  test('keep-alive extends at ~lease/3 and stops at release', async () => {
    const { srv, client } = await setup();
    const lock = await client.acquire('ka', { lease: 150, keepAlive: true });
    await sleep(500);
    assert.ok(lock.isHeld, 'not lost');
    const c = await srv.conn(0);
    const n = c.requests.filter((r) => r.op === Op.EXTEND).length;
    assert.ok(n >= 6 && n <= 11, `${n} extends in 500 ms`);
    assert.ok(c.requests.filter((r) => r.op === Op.EXTEND).every((r) => r.leaseMs === 150 && r.token === lock.token));
    await lock.release();
    const m = c.requests.filter((r) => r.op === Op.EXTEND).length;
    await sleep(150);
    assert.equal(c.requests.filter((r) => r.op === Op.EXTEND).length, m);
    assert.ok(!lock.isLost);
  });

  test('await using releases', async () => {
    const { srv, client } = await setup();
    let token = 0n;
    {
      await using lock = await client.acquire('u');
      token = lock.token;
    }
    const rel = (await srv.conn(0)).requests.find((r) => r.op === Op.RELEASE)!;
    assert.equal(rel.token, token);
  });

  test('withLock releases when the callback throws', async () => {
    const { srv, client } = await setup();
    await assert.rejects(
      client.withLock('w', {}, async () => {
        throw new Error('boom');
      }),
      /boom/,
    );
    assert.equal(await client.withLock('w', {}, (l) => l.key), 'w');
    assert.equal((await srv.conn(0)).requests.filter((r) => r.op === Op.RELEASE).length, 2);
  });

  test('release twice sends one RELEASE', async () => {
    const { srv, client } = await setup();
    const lock = await client.acquire('r');
    await Promise.all([lock.release(), lock.release()]);
    await lock.release();
    assert.equal((await srv.conn(0)).requests.filter((r) => r.op === Op.RELEASE).length, 1);
    assert.ok(lock.isReleased);
  });
});

describe('close and destroy', () => {
  test('destroy rejects in-flight requests and later calls', async () => {
    const { client } = await setup({ onRequest: noAnswerToAcquire });
    const p = client.acquire('k');
    await client.ping();
    client.destroy();
    await assert.rejects(p, ClientClosedError);
    await assert.rejects(client.ping(), ClientClosedError);
    client.destroy(); // idempotent
  });

  test('close withdraws waiting acquires and waits for answers in flight', async () => {
    const { srv, client } = await setup({
      onRequest: (c, r) => {
        if (r.op === Op.ACQUIRE) return;
        if (r.op === Op.CANCEL) {
          c.send({ op: Op.ACQUIRE, id: r.token!, status: Status.CANCELLED });
          c.send({ op: Op.CANCEL, id: r.id, detail: 1 });
          return;
        }
        if (r.op === Op.PING) setTimeout(() => defaultAnswer(c, r), 50);
        else defaultAnswer(c, r);
      },
    });
    const waiting = client.acquire('k');
    waiting.catch(() => {});
    await client.ping();
    const ping = client.ping();
    await client.close();
    await assert.rejects(waiting, CancelledError);
    assert.ok((await ping) >= 0);
    await assert.rejects(client.acquire('k'), ClientClosedError);
    const c = await srv.conn(0);
    await eventually(() => c.socket.readableEnded || c.socket.destroyed, 2000, 'server sees the close');
  });
});
