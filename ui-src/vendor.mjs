// Copies the dashboard's third-party files from node_modules (installed from package-lock.json
// by `npm ci`) into crates/sessionbox-server/ui/vendor/, byte for byte, with each library's
// LICENSE. Nothing here edits a file. The output directory is emptied first, so a file that is
// no longer listed disappears. check.sh runs this into a temporary directory and compares.
//
//   node vendor.mjs [--modules DIR] [--out DIR]

import { copyFileSync, mkdirSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { dirname, join, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';
import { parseArgs } from 'node:util';

const here = dirname(fileURLToPath(import.meta.url));
const { values } = parseArgs({
  options: {
    modules: { type: 'string', default: join(here, 'node_modules') },
    out: { type: 'string', default: join(here, '..', 'crates', 'sessionbox-server', 'ui', 'vendor') },
  },
});
const modules = resolve(values.modules);
const out = resolve(values.out);

// Highlight.js languages shipped (its prebuilt ES modules, one file each); anything else
// previews as plain text.
const LANGUAGES = [
  'bash', 'c', 'cpp', 'css', 'diff', 'dockerfile', 'go', 'ini', 'java', 'javascript', 'json',
  'makefile', 'markdown', 'plaintext', 'python', 'rust', 'shell', 'sql', 'typescript', 'xml',
  'yaml',
];

// [package, directory under vendor/, [file in the package, file under that directory]...]
const LIBRARIES = [
  ['@xterm/xterm', 'xterm', [
    ['lib/xterm.mjs', 'xterm.js'],
    ['css/xterm.css', 'xterm.css'],
    ['LICENSE', 'LICENSE'],
  ]],
  ['@xterm/addon-fit', 'xterm-addon-fit', [
    ['lib/addon-fit.mjs', 'addon-fit.js'],
    ['LICENSE', 'LICENSE'],
  ]],
  ['@highlightjs/cdn-assets', 'highlight', [
    ['es/core.min.js', 'core.min.js'],
    ...LANGUAGES.map((name) => [`es/languages/${name}.min.js`, `languages/${name}.min.js`]),
    ['styles/github.min.css', 'github.min.css'],
    ['styles/github-dark.min.css', 'github-dark.min.css'],
    ['LICENSE', 'LICENSE'],
  ]],
  ['uplot', 'uplot', [
    ['dist/uPlot.esm.js', 'uPlot.esm.js'],
    ['dist/uPlot.min.css', 'uPlot.min.css'],
    ['LICENSE', 'LICENSE'],
  ]],
];

rmSync(out, { recursive: true, force: true });
const versions = [];
for (const [name, dir, files] of LIBRARIES) {
  const root = join(modules, ...name.split('/'));
  const manifest = JSON.parse(readFileSync(join(root, 'package.json'), 'utf8'));
  versions.push(`${name} ${manifest.version} ${manifest.license}`);
  for (const [from, to] of files) {
    const target = join(out, dir, to);
    mkdirSync(dirname(target), { recursive: true });
    copyFileSync(join(root, from), target);
  }
}
writeFileSync(join(out, 'VERSIONS.txt'),
  '# Written by ui-src/vendor.mjs from package-lock.json; do not edit\n' + versions.join('\n') + '\n');
console.log(`vendored into ${out}:\n  ${versions.join('\n  ')}`);
