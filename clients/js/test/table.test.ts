// The integer-keyed table of the request path (src/table.ts): the session's requests awaiting
// their answer (by id) and the client's locks (by token). Checked against a Map over random
// operations, around its growth and shrinking, across wrapped probe runs, and for iteration in
// key order (the session re-sends requests in id order).
import assert from 'node:assert/strict';
import { describe, test } from 'node:test';
// Internal, so not in the package's exports: compiled from the source for these tests.
import { IntTable } from '../src/table.js';

/** A small deterministic generator (xorshift), so that a failure repeats. */
function rng(seed: number): () => number {
  let x = seed >>> 0 || 1;
  return () => {
    x ^= x << 13;
    x >>>= 0;
    x ^= x >>> 17;
    x ^= x << 5;
    x >>>= 0;
    return x / 0x100000000;
  };
}

function same<V>(t: IntTable<V>, m: Map<number, V>): void {
  assert.equal(t.size, m.size);
  const want = [...m.entries()].sort((a, b) => a[0] - b[0]).map((e) => e[1]);
  assert.deepEqual(t.values(), want, 'values in key order');
  for (const [k, v] of m) assert.equal(t.get(k), v, `get(${k})`);
}

describe('IntTable', () => {
  test('set, get, has, delete, size; a set of an existing key replaces its value', () => {
    const t = new IntTable<string>();
    assert.equal(t.get(1), undefined);
    assert.equal(t.delete(1), false);
    t.set(1, 'a');
    t.set(2, 'b');
    t.set(1, 'c');
    assert.equal(t.size, 2);
    assert.equal(t.get(1), 'c');
    assert.ok(t.has(2));
    assert.equal(t.delete(1), true);
    assert.equal(t.delete(1), false);
    assert.equal(t.get(1), undefined);
    assert.equal(t.get(2), 'b');
    assert.equal(t.size, 1);
    t.clear();
    assert.equal(t.size, 0);
    assert.equal(t.get(2), undefined);
    assert.deepEqual(t.values(), []);
  });

  test('keys that share a slot (equal modulo the capacity) stay reachable through every delete', () => {
    const t = new IntTable<number>();
    const m = new Map<number, number>();
    // 16 is the smallest capacity: 3, 19, 35 share slot 3 and run into the keys after them.
    for (const k of [3, 19, 4, 35, 5, 15, 31, 0, 47]) {
      t.set(k, k * 10);
      m.set(k, k * 10);
    }
    same(t, m);
    for (const k of [3, 31, 4, 19, 15, 0, 35, 47, 5]) {
      assert.equal(t.delete(k), true);
      m.delete(k);
      same(t, m);
    }
  });

  test('keys past 2^32 and up to 2^53 - 1: exact, in key order', () => {
    const t = new IntTable<string>();
    const keys = [2 ** 53 - 1, 2 ** 32, 2 ** 32 + 16, 16, 2 ** 40 + 3, 3, 2 ** 53 - 17];
    for (const k of keys) t.set(k, String(k));
    assert.deepEqual(
      t.values(),
      [...keys].sort((a, b) => a - b).map(String),
    );
    for (const k of keys) assert.equal(t.get(k), String(k));
    assert.equal(t.get(2 ** 53 - 2), undefined);
  });

  test('grows under a burst and shrinks after it, keeping every entry', () => {
    const t = new IntTable<number>();
    const m = new Map<number, number>();
    for (let k = 1; k <= 5000; k++) {
      t.set(k, k);
      m.set(k, k);
    }
    same(t, m);
    for (let k = 1; k <= 4990; k++) {
      t.delete(k);
      m.delete(k);
    }
    same(t, m);
    for (let k = 4991; k <= 5000; k++) {
      t.delete(k);
      m.delete(k);
    }
    same(t, m);
  });

  test('random operations agree with a Map (ids in a moving window, as requests in flight)', () => {
    for (const seed of [1, 2, 3, 42, 1234]) {
      const r = rng(seed);
      const t = new IntTable<number>();
      const m = new Map<number, number>();
      let next = 1;
      for (let i = 0; i < 20_000; i++) {
        const x = r();
        if (x < 0.45 || m.size === 0) {
          // A new request; now and then one far ahead, or a key far below (an old waiter).
          const k = x < 0.02 ? next + Math.floor(r() * 1e6) : x < 0.04 ? Math.floor(r() * 100) : next++;
          t.set(k, i);
          m.set(k, i);
        } else if (x < 0.9) {
          // An answer: mostly the oldest few, sometimes any.
          const keys = [...m.keys()];
          const k = keys[x < 0.7 ? Math.floor(r() * Math.min(4, keys.length)) : Math.floor(r() * keys.length)]!;
          assert.equal(t.delete(k), true);
          m.delete(k);
        } else {
          const k = Math.floor(r() * next * 1.5);
          assert.equal(t.get(k), m.get(k), `get(${k})`);
          assert.equal(t.delete(k), m.delete(k), `delete(${k})`);
        }
        if (i % 1000 === 0) same(t, m);
      }
      same(t, m);
    }
  });
});
