/**
 * A map from integer keys (request ids, fencing tokens below 2^53) to values, for the request
 * path: the requests awaiting their answer, the locks held.
 *
 * Why not a `Map`: with one caller, such a map goes from 0 to 1 entry and back with every
 * request, and V8 rebuilds a `Map`'s hash table as it shrinks on a delete and as the deleted
 * entries fill it on a set: about 150 bytes of garbage and a rehash per request (measured: 440 ns
 * per set+delete). This table is open addressing with linear probing and backward-shift deletion
 * (no tombstones), so a set and a delete allocate nothing until it has to grow.
 *
 * The keys are integers below 2^53 (request ids from 1 up; tokens). Consecutive keys land in
 * consecutive slots (the hash is the key's low bits), so the requests in flight, whose ids are
 * close together, do not collide. Iteration ({@link IntTable.values}) is in key order: the
 * session re-sends requests in id order, as a `Map` in insertion order did.
 *
 * @module
 * @internal
 */

/** The smallest capacity (a power of two); the table never shrinks below it. */
const MIN_CAPACITY = 16;

export class IntTable<V> {
  #keys: number[];
  #vals: (V | undefined)[];
  #mask: number;
  #size = 0;

  constructor() {
    this.#keys = new Array<number>(MIN_CAPACITY).fill(0);
    this.#vals = new Array<V | undefined>(MIN_CAPACITY).fill(undefined);
    this.#mask = MIN_CAPACITY - 1;
  }

  /** The number of entries. */
  get size(): number {
    return this.#size;
  }

  /** The slot of `key`, or -1. */
  #find(key: number): number {
    const keys = this.#keys;
    const vals = this.#vals;
    const mask = this.#mask;
    // `key % 2^32` as an int, masked: the low bits (exact for any integer below 2^53).
    for (let i = key & mask; ; i = (i + 1) & mask) {
      if (vals[i] === undefined) return -1;
      if (keys[i] === key) return i;
    }
  }

  get(key: number): V | undefined {
    const i = this.#find(key);
    return i < 0 ? undefined : this.#vals[i];
  }

  has(key: number): boolean {
    return this.#find(key) >= 0;
  }

  /** Sets `key` to `value` (which must not be undefined: an empty slot holds undefined). */
  set(key: number, value: V): void {
    const mask = this.#mask;
    const keys = this.#keys;
    const vals = this.#vals;
    let i = key & mask;
    for (; vals[i] !== undefined; i = (i + 1) & mask) {
      if (keys[i] === key) {
        vals[i] = value;
        return;
      }
    }
    keys[i] = key;
    vals[i] = value;
    // At most half full: probes stay short.
    if (++this.#size * 2 > mask + 1) this.#resize((mask + 1) * 2);
  }

  /** Removes `key`; true if it was there. */
  delete(key: number): boolean {
    let i = this.#find(key);
    if (i < 0) return false;
    const keys = this.#keys;
    const vals = this.#vals;
    const mask = this.#mask;
    // Backward-shift deletion: move up each later entry of the run whose home slot is at or
    // before the hole, so that every entry stays reachable from its home slot without tombstones.
    for (let j = (i + 1) & mask; vals[j] !== undefined; j = (j + 1) & mask) {
      const home = keys[j]! & mask;
      // Does the entry at j stay reachable if the hole at i is left? Only if its home lies
      // cyclically in (i, j].
      if (((j - home) & mask) >= ((j - i) & mask)) {
        keys[i] = keys[j]!;
        vals[i] = vals[j];
        i = j;
      }
    }
    keys[i] = 0;
    vals[i] = undefined;
    this.#size--;
    // Give back the room a burst took (a quarter of the growth threshold: no flapping).
    if (mask + 1 > MIN_CAPACITY && this.#size * 8 < mask + 1) this.#resize((mask + 1) / 2);
    return true;
  }

  clear(): void {
    this.#keys = new Array<number>(MIN_CAPACITY).fill(0);
    this.#vals = new Array<V | undefined>(MIN_CAPACITY).fill(undefined);
    this.#mask = MIN_CAPACITY - 1;
    this.#size = 0;
  }

  /** The values, in key order (a new array: the table may change while it is walked). */
  values(): V[] {
    const keys = this.#keys;
    const vals = this.#vals;
    const idx: number[] = [];
    for (let i = 0; i <= this.#mask; i++) if (vals[i] !== undefined) idx.push(i);
    idx.sort((a, b) => keys[a]! - keys[b]!);
    return idx.map((i) => vals[i]!);
  }

  #resize(capacity: number): void {
    const keys = this.#keys;
    const vals = this.#vals;
    this.#keys = new Array<number>(capacity).fill(0);
    this.#vals = new Array<V | undefined>(capacity).fill(undefined);
    this.#mask = capacity - 1;
    this.#size = 0;
    for (let i = 0; i < keys.length; i++) if (vals[i] !== undefined) this.set(keys[i]!, vals[i]!);
  }
}
