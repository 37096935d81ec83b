/**
 * The clock of lock deadlines (PROTOCOL.md, "The lost signal"): it keeps counting while the host
 * is suspended, as the server's leases do, so that a client waking from a suspend never believes
 * it still holds a lock whose lease ran out while it slept.
 *
 * Node.js cannot read CLOCK_BOOTTIME, and its monotonic clock (`performance.now()`) stops during
 * a suspend on Linux. So the clock is `performance.now()` plus the suspend time seen so far,
 * found as PROTOCOL.md's fallback says: each interval between two looks counts as the larger of
 * the monotonic and the wall clock's advance (a suspend shows as the wall clock running ahead; a
 * wall clock stepped back is ignored; one stepped forward only makes deadlines earlier).
 *
 * @module
 * @internal
 */
import { performance } from 'node:perf_hooks';

/**
 * How often (monotonic ms) {@link SuspendClock.now} looks at the wall clock: the request path
 * reads this clock, and a look costs a second clock read.
 */
const LOOK_EVERY_MS = 20;

/**
 * `Date.now()` counts whole ms, so an interval's wall advance can exceed its monotonic advance by
 * up to this much without any suspend: less is never counted (it would add up, look by look).
 */
const WALL_RESOLUTION_MS = 1;

/**
 * Milliseconds on the scale of `performance.now()`, plus the suspend time seen so far; never goes
 * backwards. JavaScript runs one thing at a time, so there is nothing to lock.
 */
export class SuspendClock {
  #suspended = 0;
  /** The last look's wall reading, and the monotonic reading just before it. */
  #lastWall: number;
  #lastMono: number;

  /** `mono` and `wall` are the monotonic and the wall clock, in ms (replaced in tests). */
  constructor(
    private readonly mono: () => number = () => performance.now(),
    private readonly wall: () => number = () => Date.now(),
  ) {
    this.#lastMono = mono();
    this.#lastWall = wall();
  }

  /** The clock now. Suspend time is noticed at the first read {@link LOOK_EVERY_MS} after the last look. */
  now(): number {
    const m = this.mono();
    return (m - this.#lastMono >= LOOK_EVERY_MS ? this.#look() : m) + this.#suspended;
  }

  /** The clock now, having looked for suspend time first: for checking a deadline. */
  exactNow(): number {
    return this.#look() + this.#suspended;
  }

  /** The suspend time seen so far, ms: it changes when a look finds some. */
  get suspendedMs(): number {
    return this.#suspended;
  }

  /**
   * Adds the wall clock's advance beyond the monotonic one since the last look; returns the
   * monotonic reading. The wall reading is bracketed by two monotonic ones, and the interval's
   * monotonic advance taken from the outer ones: a thread preempted between two reads then makes
   * the wall clock seem behind, never ahead (read in pairs, it seemed ahead by the preemption
   * every other time, and that added up: tens of ms a minute on a loaded machine).
   */
  #look(): number {
    const before = this.mono();
    const w = this.wall();
    const after = this.mono();
    const ahead = w - this.#lastWall - (after - this.#lastMono);
    if (ahead >= WALL_RESOLUTION_MS) this.#suspended += ahead;
    this.#lastWall = w;
    this.#lastMono = before;
    return after;
  }
}

/** The process's deadline clock. */
export const clock = new SuspendClock();
