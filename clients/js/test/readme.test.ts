// Runs the README's example, exactly as written, against a started server.
import assert from 'node:assert/strict';
import { execFile } from 'node:child_process';
import { readFileSync, rmSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { after, before, test } from 'node:test';
import { promisify } from 'node:util';
import { packageDir, startServer, type RunningServer } from './helpers.js';

let srv: RunningServer;
before(async () => {
  srv = await startServer();
});
after(async () => {
  await srv?.stop();
});

/** The first ```js block after the "## Example" heading. */
function exampleCode(): string {
  const readme = readFileSync(join(packageDir, 'README.md'), 'utf8');
  const section = readme.slice(readme.indexOf('## Example'));
  const m = /```js\n([\s\S]*?)```/.exec(section);
  assert.ok(m, 'README has a ```js example under "## Example"');
  return m[1]!;
}

test('the README example runs as written', async () => {
  const code = exampleCode();
  assert.match(code, /process\.env\.TICKETING_ADDR \?\? '127\.0\.0\.1:7070'/);
  // Inside the package directory, so that `import ... from '@ticketing/client'` resolves to this package.
  const file = join(packageDir, 'dist', 'test', `readme-example-${process.pid}.mjs`);
  writeFileSync(file, code);
  try {
    const { stdout } = await promisify(execFile)(process.execPath, [file], {
      env: { ...process.env, TICKETING_ADDR: srv.addr },
      timeout: 20_000,
    });
    assert.match(stdout, /^holding order-1234 with fencing token \d+\n$/);
  } finally {
    rmSync(file, { force: true });
  }
});
