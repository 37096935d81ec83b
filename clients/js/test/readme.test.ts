// Runs every example of the README, exactly as written (```js as is, ```ts transpiled), against
// real servers: plain, with a token, with TLS, with mutual TLS. Each block is a whole program;
// its `// prints: TEXT` lines must each start a line of its output. (package.test.ts installs the
// package file into a fresh project and runs the first example there.)
import assert from 'node:assert/strict';
import { execFile } from 'node:child_process';
import { readFileSync, rmSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { after, before, describe, test } from 'node:test';
import { promisify } from 'node:util';
import ts from 'typescript';
import { packageDir, startServer, testCerts, type RunningServer } from './helpers.js';

const run = promisify(execFile);

interface Block {
  lang: 'js' | 'ts';
  code: string;
  heading: string;
}

function readmeBlocks(): Block[] {
  const readme = readFileSync(join(packageDir, 'README.md'), 'utf8');
  const blocks: Block[] = [];
  let heading = '';
  const re = /^(#+ .*)$|^```(js|ts)\n([\s\S]*?)^```$/gm;
  for (let m = re.exec(readme); m; m = re.exec(readme)) {
    if (m[1]) heading = m[1].replace(/^#+ /, '');
    else blocks.push({ lang: m[2] as 'js' | 'ts', code: m[3]!, heading });
  }
  return blocks;
}

const servers: Record<string, RunningServer> = {};
const token = 'readme-token';

/** The environment a block needs: the server its variables point at. */
function envFor(code: string): Record<string, string> {
  const c = testCerts();
  if (code.includes('TICKETING_CLIENT_CERT')) {
    return { TICKETING_ADDR: servers.mtls!.addr, TICKETING_CA: c.ca, TICKETING_CLIENT_CERT: c.clientCert, TICKETING_CLIENT_KEY: c.clientKey };
  }
  if (code.includes('TICKETING_CA')) return { TICKETING_ADDR: servers.tls!.addr, TICKETING_CA: c.ca };
  if (code.includes('TICKETING_TOKEN')) return { TICKETING_ADDR: servers.token!.addr, TICKETING_TOKEN: token };
  return { TICKETING_ADDR: servers.plain!.addr };
}

async function runProgram(dir: string, block: Block): Promise<string> {
  const source = block.lang === 'ts' ? ts.transpileModule(block.code, { compilerOptions: { target: ts.ScriptTarget.ES2022, module: ts.ModuleKind.ESNext } }).outputText : block.code;
  const file = join(dir, `readme-example-${process.pid}-${Math.random().toString(36).slice(2)}.mjs`);
  writeFileSync(file, source);
  try {
    const { stdout } = await run(process.execPath, [file], { env: { ...process.env, ...envFor(block.code) }, timeout: 20_000, cwd: dir });
    return stdout;
  } finally {
    rmSync(file, { force: true });
  }
}

function checkOutput(block: Block, stdout: string): void {
  const want = [...block.code.matchAll(/^\/\/ prints: (.*)$/gm)].map((m) => m[1]!);
  assert.ok(want.length > 0, 'every example says what it prints');
  const lines = stdout.split('\n');
  for (const w of want) assert.ok(lines.some((l) => l.startsWith(w)), `output has a line starting ${JSON.stringify(w)}; got:\n${stdout}`);
}

describe('README', () => {
  before(async () => {
    [servers.plain, servers.token, servers.tls, servers.mtls] = await Promise.all([
      startServer(),
      startServer({ token }),
      startServer({ tls: true }),
      startServer({ mtls: true }),
    ]);
  });
  after(async () => {
    await Promise.all(Object.values(servers).map((s) => s.stop()));
  });

  const blocks = readmeBlocks();
  test('has runnable examples in every section that matters', () => {
    const headings = new Set(blocks.map((b) => b.heading));
    for (const h of ['Example', 'Fencing', 'Authentication, TLS and mutual TLS', 'Failure semantics', 'Cancellation and self-deadlock']) assert.ok(headings.has(h), h);
    assert.ok(blocks.length >= 7);
  });

  blocks.forEach((block, i) => {
    test(`example ${i + 1} (${block.heading}, ${block.lang}) runs as written`, async () => {
      // Inside the package directory, so that `import ... from '@ticketing/client'` resolves to this package.
      const stdout = await runProgram(join(packageDir, 'dist', 'test'), block);
      checkOutput(block, stdout);
    });
  });
});
