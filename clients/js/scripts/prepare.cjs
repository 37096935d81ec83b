// npm's "prepare": builds dist/ when TypeScript is installed here (npm ci, npm install in this
// directory). When this package is installed from a folder without its dev dependencies, an
// existing build is used as is; without one, it says what to run.
const { existsSync } = require('node:fs');
const { join } = require('node:path');
const { execSync } = require('node:child_process');

const dir = join(__dirname, '..');
if (existsSync(join(dir, 'node_modules', 'typescript'))) {
  execSync('npm run build', { cwd: dir, stdio: 'inherit' });
} else if (!existsSync(join(dir, 'dist', 'esm', 'index.js'))) {
  console.error(`@ticketing/client is not built: run \`npm ci\` in ${dir} first (it installs TypeScript and builds dist/).`);
  process.exit(1);
}
