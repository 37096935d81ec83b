// The JS client's benchmark program (bench/ runs it through bench-run.sh): one client object
// shared by N concurrent async loops, each acquiring its own key (try once, lease 10 s) and
// releasing it, again and again; 1 s of warm-up, then SECONDS counted. Prints one JSON line:
// {"pairs_per_sec": R, "errors": E} (exit 1 when more than 1% of the attempts failed).
//
//   node bench.mjs --addr HOST:PORT --callers N --seconds S
//
// Run it only against a server you started for it.
import { parseArgs } from 'node:util';
import { createClient, TicketingError } from '../dist/esm/index.js';

const { values } = parseArgs({
  options: {
    addr: { type: 'string', default: '127.0.0.1:7070' },
    callers: { type: 'string', default: '1' },
    seconds: { type: 'string', default: '5' },
  },
});
const callers = Number(values.callers);
const seconds = Number(values.seconds);
if (!(Number.isInteger(callers) && callers >= 1 && callers <= 100000) || !(seconds > 0 && seconds <= 3600)) {
  console.error('bench.mjs: --callers 1..100000 and --seconds 0..3600');
  process.exit(2);
}

const WARMUP_MS = 1000;
const LEASE_MS = 10_000;
const client = createClient({ endpoints: values.addr });
await client.connect();
let stop = false;
const counts = new Array(callers).fill(0);
const errors = new Array(callers).fill(0);
const prefix = `bench-${process.pid}-`;

async function caller(i) {
  const key = `${prefix}${i}`;
  while (!stop) {
    try {
      const lock = await client.tryAcquire(key, { leaseMs: LEASE_MS });
      if (lock === null) {
        errors[i]++;
      } else {
        await lock.release();
        counts[i]++;
      }
    } catch (e) {
      if (!(e instanceof TicketingError)) throw e;
      errors[i]++;
    }
  }
}

const sum = (a) => a.reduce((x, y) => x + y, 0);
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
const loops = Array.from({ length: callers }, (_, i) => caller(i));
await sleep(WARMUP_MS);
const n0 = sum(counts), e0 = sum(errors), t0 = process.hrtime.bigint();
await sleep(seconds * 1000);
const n1 = sum(counts), e1 = sum(errors), t1 = process.hrtime.bigint();
stop = true;
await Promise.race([Promise.all(loops), sleep(10_000)]);
await client.close();
const pairs = n1 - n0, errs = e1 - e0;
const secs = Number(t1 - t0) / 1e9;
console.log(JSON.stringify({ pairs_per_sec: Math.round((pairs / secs) * 10) / 10, errors: errs }));
process.exit(errs > 0.01 * Math.max(1, pairs + errs) ? 1 : 0);
