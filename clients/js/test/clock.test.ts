// The deadline clock (src/clock.ts): PROTOCOL.md's fallback for a runtime without CLOCK_BOOTTIME,
// and the lost signal after a suspend. A suspend shows to the process as the wall clock jumping
// ahead of the monotonic one: the lock tests fake it by moving Date.now() (in a file of their own,
// since the process's clock then stays ahead of performance.now() by the jump).
import assert from 'node:assert/strict';
import { performance } from 'node:perf_hooks';
import { after, before, describe, mock, test } from 'node:test';
import { ClientRules, createClient, type Client } from '@ticketing/client';
// Internal, so not in the package's exports: compiled from the source for these tests.
import { SuspendClock } from '../src/clock.js';
import { fakeServer, sleep } from './helpers.js';

type Scripted = {
  clock: SuspendClock;
  /** Time passes: `monoMs` on the monotonic clock, `wallMs` (default the same) on the wall clock. */
  advance(monoMs: number, wallMs?: number): void;
  /** The thread is preempted for `ms` right after its next read of that clock. */
  preemptAfter(which: 'mono' | 'wall', ms: number): void;
};

/** A SuspendClock on scripted clocks; the wall clock reads in whole ms, as Date.now() does. */
function scripted(): Scripted {
  let mono = 1000.25;
  let wall = 1_700_000_000_000.6;
  let preempt: { which: 'mono' | 'wall'; ms: number } | undefined;
  const read = (which: 'mono' | 'wall', v: number): number => {
    if (preempt?.which === which) {
      mono += preempt.ms;
      wall += preempt.ms;
      preempt = undefined;
    }
    return v;
  };
  const s: Scripted = {
    clock: new SuspendClock(
      () => read('mono', mono),
      () => read('wall', Math.floor(wall)),
    ),
    advance(monoMs, wallMs = monoMs) {
      mono += monoMs;
      wall += wallMs;
    },
    preemptAfter(which, ms) {
      preempt = { which, ms };
    },
  };
  return s;
}

describe('SuspendClock, the fallback', () => {
  test('runs with the monotonic clock; whole-ms wall readings and preempted reads add nothing up', () => {
    const s = scripted();
    const t0 = s.clock.now();
    let preempted = 0;
    for (let i = 0; i < 10_000; i++) {
      s.advance(20.37); // the wall clock's ms edges fall anywhere in an interval
      if (i % 5 < 2) {
        s.preemptAfter(i % 5 === 0 ? 'wall' : 'mono', 3);
        preempted += 3;
      }
      s.clock.exactNow();
    }
    assert.equal(s.clock.suspendedMs, 0);
    assert.ok(Math.abs(s.clock.now() - t0 - 10_000 * 20.37 - preempted) < 0.001, 'the monotonic clock');
  });

  test('a suspend (the wall clock runs ahead) is counted; now() notices it within 20 ms of monotonic time, exactNow() at once', () => {
    const s = scripted();
    s.advance(30);
    const t0 = s.clock.now();
    s.advance(0, 10_000); // suspended 10 s: the monotonic clock stood still
    assert.ok(Math.abs(s.clock.exactNow() - t0 - 10_000) <= 1, `${s.clock.exactNow() - t0}`);
    const t1 = s.clock.now();
    s.advance(5, 60_005);
    assert.ok(s.clock.now() - t1 < 6, 'not looked yet');
    s.advance(15);
    assert.ok(Math.abs(s.clock.now() - t1 - 60_020) <= 1, 'looked 20 ms after the last look');
  });

  test('a wall clock stepped back is ignored, and a suspend after it is counted in full', () => {
    const s = scripted();
    const t0 = s.clock.exactNow();
    s.advance(100, -3_600_000); // stepped back an hour
    const t1 = s.clock.exactNow();
    assert.ok(Math.abs(t1 - t0 - 100) < 0.001, `${t1 - t0}`);
    assert.equal(s.clock.suspendedMs, 0);
    s.advance(0, 7000); // then suspended 7 s
    assert.ok(Math.abs(s.clock.exactNow() - t1 - 7000) <= 1);
    s.advance(50); // the wall clock runs on as the monotonic one
    assert.ok(Math.abs(s.clock.exactNow() - t1 - 7050) <= 1);
  });

  test('never goes backwards', () => {
    const s = scripted();
    let last = s.clock.now();
    for (const [m, w] of [[10, 10], [25, -5000], [0, 3000], [30, 0], [1, -1], [40, 40]] as const) {
      s.advance(m, w);
      for (const t of [s.clock.now(), s.clock.exactNow()]) {
        assert.ok(t >= last, `${t} after ${last}`);
        last = t;
      }
    }
  });
});

describe('locks after a suspend', () => {
  const clients: Client[] = [];
  const closers: (() => Promise<void>)[] = [];
  after(async () => {
    for (const c of clients) c.destroy();
    for (const f of closers) await f();
  });

  async function holdLock(key: string): Promise<{ lock: Awaited<ReturnType<Client['acquire']>> }> {
    const srv = await fakeServer();
    closers.push(() => srv.close());
    const client = createClient({ endpoints: [srv.addr] });
    clients.push(client);
    return { lock: await client.acquire(key, { leaseMs: 60_000 }) };
  }

  const realNow = Date.now.bind(Date);
  let wallAhead = 0;
  before(() => mock.method(Date, 'now', () => realNow() + wallAhead));
  after(() => mock.restoreAll());

  /** Moves Date.now() `ms` ahead (a suspend of `ms`, as the process sees it) or back (a negative `ms`). */
  function wallJump(ms: number): void {
    wallAhead += ms;
  }

  test('a wall clock stepped back changes nothing', async () => {
    const { lock } = await holdLock('back');
    const left = lock.remainingMs;
    wallJump(-120_000);
    await sleep(ClientRules.LOST_CHECK_MS + 100);
    assert.ok(lock.isHeld && !lock.isLost);
    const now = lock.remainingMs;
    assert.ok(now < left - ClientRules.LOST_CHECK_MS && now > left - 5000, `${left} ms left before, ${now} after`);
  });

  test('the lost timer fires within LOST_CHECK_MS of a suspend longer than the lease', async () => {
    const { lock } = await holdLock('suspend');
    const lost: string[] = [];
    lock.on('lost', (e) => lost.push(e.reason));
    await sleep(100);
    assert.ok(!lock.lostReason && lost.length === 0, 'held before the suspend');
    wallJump(120_000);
    const t = performance.now();
    const e = await lock.lost;
    const took = performance.now() - t;
    assert.equal(e.reason, 'expired');
    assert.deepEqual(lost, ['expired']);
    // Timer latency on a loaded machine comes on top.
    assert.ok(took <= ClientRules.LOST_CHECK_MS + 250, `lost ${took.toFixed(0)} ms after the jump`);
  });

  test('asking about a lock checks its deadline against the clock at once', async () => {
    const { lock } = await holdLock('ask');
    assert.ok(!lock.isLost);
    wallJump(120_000);
    assert.ok(lock.isLost, 'isLost, right after the suspend');
    assert.equal(lock.lostReason, 'expired');
    assert.equal(lock.remainingMs, 0);
  });
});
