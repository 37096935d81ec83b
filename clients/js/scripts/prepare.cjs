// npm's "prepare" (npm ci, npm install in this directory, and `npm install <this folder>` from
// another project): builds dist/ when TypeScript is installed here and dist/ is missing or older
// than the sources; otherwise the existing build is used as is. Without TypeScript and without a
// build, it says what to run.
const { existsSync, readdirSync, statSync } = require('node:fs');
const { join } = require('node:path');
const { execSync } = require('node:child_process');

const dir = join(__dirname, '..');
const outputs = ['dist/esm/index.js', 'dist/esm/index.d.ts', 'dist/cjs/index.js', 'dist/cjs/package.json'].map((f) => join(dir, f));

function newestSource() {
  let newest = 0;
  const files = readdirSync(join(dir, 'src')).map((f) => join(dir, 'src', f));
  for (const f of [...files, ...['package.json', 'tsconfig.json', 'tsconfig.cjs.json'].map((f) => join(dir, f))]) {
    if (existsSync(f)) newest = Math.max(newest, statSync(f).mtimeMs);
  }
  return newest;
}

const built = outputs.every((f) => existsSync(f));
const fresh = built && Math.min(...outputs.map((f) => statSync(f).mtimeMs)) >= newestSource();
if (existsSync(join(dir, 'node_modules', 'typescript'))) {
  if (!fresh) execSync('npm run build', { cwd: dir, stdio: 'inherit' });
} else if (!built) {
  console.error(`@ticketing/client is not built: run \`npm ci\` in ${dir} first (it installs TypeScript and builds dist/).`);
  process.exit(1);
}
