// Cross-language FIFO test: one Node waiter. Usage: node waiter.mjs ADDR KEY
// Prints "granted TOKEN" once it holds KEY, releases on a line on stdin, then prints "released".
import { createInterface } from 'node:readline';
import { createClient } from '../../clients/js/dist/esm/index.js';

const [addr, key] = process.argv.slice(2);
const client = createClient({ endpoints: [addr] });
await client.connect();
const lock = await client.acquire(key, { lease: 60_000 }); // waits without limit, FIFO
console.log(`granted ${lock.token}`);
const rl = createInterface({ input: process.stdin });
for await (const _ of rl) break;
await lock.release();
console.log('released');
rl.close();
await client.close();
