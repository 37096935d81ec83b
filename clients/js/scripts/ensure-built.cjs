// npm's "prepack" (npm pack, npm publish) and the first step of `npm run build:test`: runs
// `npm run build` unless dist/ is complete and newer than the sources and the build settings.
// (Not "prepare": that would also run on every `npm ci`/`npm install` here.)
const { existsSync, readdirSync, statSync } = require('node:fs');
const { join } = require('node:path');
const { execSync } = require('node:child_process');

const dir = join(__dirname, '..');
const sources = readdirSync(join(dir, 'src')).filter((f) => f.endsWith('.ts'));
const outputs = ['dist/cjs/package.json'];
for (const f of sources) {
  const base = f.slice(0, -3);
  for (const out of ['esm', 'cjs']) outputs.push(`dist/${out}/${base}.js`, `dist/${out}/${base}.d.ts`);
}
const inputs = [...sources.map((f) => join('src', f)), 'package.json', 'tsconfig.json', 'tsconfig.cjs.json', 'scripts/build.cjs'];
const mtime = (f) => statSync(join(dir, f)).mtimeMs;

function upToDate() {
  if (!outputs.every((f) => existsSync(join(dir, f)))) return false;
  // A file left from an older build (its source since removed or renamed) means: rebuild clean.
  for (const out of ['esm', 'cjs']) {
    const js = readdirSync(join(dir, 'dist', out)).filter((f) => f.endsWith('.js'));
    if (js.length !== sources.length) return false;
  }
  return Math.min(...outputs.map(mtime)) >= Math.max(...inputs.filter((f) => existsSync(join(dir, f))).map(mtime));
}

if (!upToDate()) {
  if (!existsSync(join(dir, 'node_modules', 'typescript'))) {
    console.error(`@ticketing/client: run \`npm ci\` in ${dir} first (it installs TypeScript, which builds dist/).`);
    process.exit(1);
  }
  execSync('npm run build', { cwd: dir, stdio: 'inherit' });
}
