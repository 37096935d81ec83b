// Marks dist/cjs as CommonJS so that Node loads the require() build there (the package is "type": "module").
const { writeFileSync } = require('node:fs');
const { join } = require('node:path');

writeFileSync(join(__dirname, '..', 'dist', 'cjs', 'package.json'), '{ "type": "commonjs" }\n');
