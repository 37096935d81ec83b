// `npm run build`: a clean build of the package's dist/ (ESM in dist/esm, CommonJS in dist/cjs,
// each with its .d.ts), so that no file of an older build can end up in the published package.
const { rmSync, writeFileSync } = require('node:fs');
const { join } = require('node:path');
const { execFileSync } = require('node:child_process');

const dir = join(__dirname, '..');
const tsc = require.resolve('typescript/bin/tsc', { paths: [dir] });
for (const out of ['esm', 'cjs']) rmSync(join(dir, 'dist', out), { recursive: true, force: true });
for (const config of ['tsconfig.json', 'tsconfig.cjs.json']) {
  execFileSync(process.execPath, [tsc, '-p', join(dir, config)], { cwd: dir, stdio: 'inherit' });
}
// Marks dist/cjs as CommonJS so that Node loads the require() build there (the package is "type": "module").
writeFileSync(join(dir, 'dist', 'cjs', 'package.json'), '{ "type": "commonjs" }\n');
