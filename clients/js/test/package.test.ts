// The package as its users get it: package.sh builds the .tgz (running npm's own pre-publish
// checks), a fresh project (`npm init -y`) installs that file offline, and there the README's
// example runs against a real server as an ES module (import) and as CommonJS (require, as the
// README says); TypeScript finds the types both ways.
import assert from 'node:assert/strict';
import { execFile } from 'node:child_process';
import { mkdtempSync, readdirSync, readFileSync, rmSync, statSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { basename, join, relative } from 'node:path';
import { after, before, describe, test } from 'node:test';
import { promisify } from 'node:util';
import { packageDir, repoRoot, startServer, type RunningServer } from './helpers.js';

const run = promisify(execFile);
const readme = readFileSync(join(packageDir, 'README.md'), 'utf8');

/** The README's example: the first ```js block under "## Example". */
function readmeExample(): string {
  const m = /^## Example\n[\s\S]*?^```js\n([\s\S]*?)^```$/m.exec(readme);
  assert.ok(m, 'README has a ```js block under "## Example"');
  return m[1]!;
}

/** The example as CommonJS, the way the README says: its import becomes the README's require line, the rest runs in an async function. */
function asCommonJS(example: string): string {
  const req = /`(const \{ ([\w, ]+) \} = require\('@ticketing\/client'\);)`/.exec(readme);
  assert.ok(req, 'README shows the require() line');
  const imp = /^import \{ ([\w, ]+) \} from '@ticketing\/client';\n/m.exec(example);
  assert.ok(imp, 'the example imports from @ticketing/client');
  assert.equal(req[2], imp[1], 'the require line names what the example imports');
  const body = example.replace(imp[0], '');
  return `${req[1]}\n(async () => {\n${body}})().catch((err) => {\n  console.error(err);\n  process.exitCode = 1;\n});\n`;
}

function checkPrints(example: string, stdout: string): void {
  const want = [...example.matchAll(/^\/\/ prints: (.*)$/gm)].map((m) => m[1]!);
  assert.ok(want.length > 0, 'the example says what it prints');
  for (const w of want) assert.ok(stdout.split('\n').some((l) => l.startsWith(w)), `output has a line starting ${JSON.stringify(w)}; got:\n${stdout}`);
}

function filesUnder(dir: string): string[] {
  return readdirSync(dir).flatMap((f) => (statSync(join(dir, f)).isDirectory() ? filesUnder(join(dir, f)) : [join(dir, f)]));
}

describe('the package, installed into a fresh project', () => {
  let server: RunningServer;
  let dir: string;
  let tgz: string;
  const installed = (): string => join(dir, 'node_modules', '@ticketing', 'client');
  const node = async (file: string): Promise<string> =>
    (await run(process.execPath, [file], { cwd: dir, env: { ...process.env, TICKETING_ADDR: server.addr }, timeout: 20_000 })).stdout;

  before(async () => {
    dir = mkdtempSync(join(tmpdir(), 'ticketing-js-fresh-'));
    const [s, packed] = await Promise.all([startServer(), run('bash', [join(packageDir, 'package.sh')], { timeout: 180_000 })]);
    server = s;
    tgz = packed.stdout.trim().split('\n').pop()!;
    assert.match(packed.stdout, /no warnings/);
    await run('npm', ['init', '-y'], { cwd: dir, timeout: 60_000 });
    await run('npm', ['install', '--offline', '--no-audit', '--no-fund', '--loglevel=error', tgz], { cwd: dir, timeout: 120_000 });
  });
  after(async () => {
    await server?.stop();
    if (dir) rmSync(dir, { recursive: true, force: true });
  });

  test('package.sh writes the file that the README installs, with the project version and license', () => {
    assert.equal(tgz, join(repoRoot, 'dist', 'js', basename(tgz)));
    assert.ok(readme.includes(`npm install path/to/ticketing/dist/js/${basename(tgz)}\n`), `README installs ${basename(tgz)}`);
    const pkg = JSON.parse(readFileSync(join(installed(), 'package.json'), 'utf8'));
    assert.equal(pkg.version, readFileSync(join(repoRoot, 'VERSION'), 'utf8').trim());
    assert.equal(pkg.license, 'Apache-2.0');
    assert.equal(pkg.scripts?.prepare, undefined, 'no prepare script');
    assert.deepEqual(Object.keys(pkg.dependencies ?? {}), [], 'no runtime dependencies');
  });

  test('ships only the built library (ESM, CommonJS, .d.ts), README.md, LICENSE and package.json', () => {
    const files = filesUnder(installed()).map((f) => relative(installed(), f));
    const extra = files.filter((f) => !/^(package\.json|README\.md|LICENSE|dist\/(esm|cjs)\/[a-z]+\.(js|d\.ts)|dist\/cjs\/package\.json)$/.test(f));
    assert.deepEqual(extra, []);
    for (const f of ['README.md', 'LICENSE', 'dist/esm/index.js', 'dist/esm/index.d.ts', 'dist/cjs/index.js', 'dist/cjs/index.d.ts', 'dist/esm/protocol.js', 'dist/cjs/protocol.d.ts']) {
      assert.ok(files.includes(f), f);
    }
    assert.equal(readFileSync(join(installed(), 'LICENSE'), 'utf8'), readFileSync(join(repoRoot, 'LICENSE'), 'utf8'));
  });

  test("the README's example runs as an ES module (import)", async () => {
    const example = readmeExample();
    writeFileSync(join(dir, 'example.mjs'), example);
    checkPrints(example, await node(join(dir, 'example.mjs')));
  });

  test("the README's example runs as CommonJS (require), on the CommonJS build", async () => {
    const example = readmeExample();
    writeFileSync(join(dir, 'example.cjs'), asCommonJS(example) + "console.log(`build ${require.resolve('@ticketing/client')}`);\n");
    const stdout = await node(join(dir, 'example.cjs'));
    checkPrints(example, stdout);
    assert.ok(stdout.includes(`build ${join(installed(), 'dist', 'cjs', 'index.js')}\n`), stdout);
  });

  test('TypeScript finds the types with import and with require (module nodenext, strict)', async () => {
    const uses = (req: boolean): string =>
      (req
        ? "import t = require('@ticketing/client');\nimport p = require('@ticketing/client/protocol');\nconst { createClient } = t;\n"
        : "import * as t from '@ticketing/client';\nimport * as p from '@ticketing/client/protocol';\nimport { createClient } from '@ticketing/client';\n") +
      [
        "const client: t.Client = createClient({ endpoints: '127.0.0.1:7070' });",
        'const op: number = p.Op.ACQUIRE;',
        'export async function f(): Promise<bigint> {',
        "  const lock: t.Lock = await client.acquire('k', { leaseMs: 1000 });",
        '  return lock.token + BigInt(op);',
        '}',
        '// @ts-expect-error: endpoints is a string or a list of strings (an error only if the types were found)',
        'createClient({ endpoints: 7070 });',
        '',
      ].join('\n');
    writeFileSync(join(dir, 'check.mts'), uses(false));
    writeFileSync(join(dir, 'check.cts'), uses(true));
    const tsc = join(packageDir, 'node_modules', 'typescript', 'bin', 'tsc');
    // --skipLibCheck as most projects have it (tsc --init's default); it keeps this test short.
    const args = ['--noEmit', '--strict', '--skipLibCheck', '--module', 'nodenext', '--target', 'es2022', '--types', 'node', '--typeRoots', join(packageDir, 'node_modules', '@types'), 'check.mts', 'check.cts'];
    await run(process.execPath, [tsc, ...args], { cwd: dir, timeout: 120_000 }).catch((err: { stdout?: string }) => {
      assert.fail(`tsc: ${err.stdout ?? err}`);
    });
  });
});
