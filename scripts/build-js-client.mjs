#!/usr/bin/env node
// Make the CommonJS twins of the JavaScript client from its one source:
//
//   realtime/static/realtime/realtime.js    -> realtime.cjs    (what `require()` loads)
//   realtime/static/realtime/realtime.d.ts  -> realtime.d.cts  (the types `require()` sees)
//
// realtime.js is an ES module that browsers load as is; Node.js's `require()` of the package
// loads realtime.cjs, made here by turning its `export`s into `exports.<name> = <name>`.
// Run `npm run build:client` after editing realtime.js or realtime.d.ts;
// `node scripts/build-js-client.mjs --check` (and jstests/package.test.mjs) fails while
// either twin is stale. No dependency: Node.js alone.

import { readFileSync, writeFileSync } from 'node:fs';
import { dirname, join, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';

const ROOT = resolve(dirname(fileURLToPath(import.meta.url)), '..');
/** The client's folder: the static files Django serves, and the npm package. */
export const CLIENT = join(ROOT, 'realtime', 'static', 'realtime');

const GENERATED = (from) =>
  `// Generated from ${from} by scripts/build-js-client.mjs (npm run build:client): do not edit.`;

/** `export const NAME`, `export class NAME`, ...: the declaration, kept, and its name. */
const NAMED = /^export (?=(?:const|let|var|class|function|async function)\s+([A-Za-z_$][\w$]*))/;
const DEFAULT = /^export default ([A-Za-z_$][\w$]*);\s*$/;

/** realtime.js as a CommonJS module: the same lines, its exports assigned at the end. */
export function commonjs(source, from = 'realtime.js') {
  const names = [];
  let defaultName = null;
  const body = source.split('\n').map((line, index) => {
    const named = NAMED.exec(line);
    if (named) {
      names.push(named[1]);
      return line.slice('export '.length);
    }
    const byDefault = DEFAULT.exec(line);
    if (byDefault) {
      defaultName = byDefault[1];
      return '';
    }
    if (/^\s*(export|import)\b/.test(line) || /\bimport\s*(\.\s*meta|\()/.test(line)) {
      // A form this script does not translate: fail rather than ship a broken twin.
      throw new Error(`${from}:${index + 1}: cannot make CommonJS of: ${line.trim()}`);
    }
    return line;
  });
  if (names.length === 0) throw new Error(`${from}: no exports found`);
  while (body.length && body[body.length - 1].trim() === '') body.pop();
  const assigned = names.map((name) => `exports.${name} = ${name};`);
  if (defaultName !== null) assigned.push(`exports.default = ${defaultName};`);
  return [
    GENERATED(from),
    "'use strict';",
    "Object.defineProperty(exports, '__esModule', { value: true });",
    '',
    ...body,
    '',
    ...assigned,
    '',
  ].join('\n');
}

/** realtime.d.ts for `require()`: the same declarations, read as a CommonJS module's. */
export function commonjsTypes(declarations, from = 'realtime.d.ts') {
  return `${GENERATED(from)}\n${declarations}`;
}

/** Each generated file: its path and the text it must hold. */
export function twins(dir = CLIENT) {
  const read = (name) => readFileSync(join(dir, name), 'utf8');
  return [
    { path: join(dir, 'realtime.cjs'), text: commonjs(read('realtime.js')) },
    { path: join(dir, 'realtime.d.cts'), text: commonjsTypes(read('realtime.d.ts')) },
  ];
}

/** The generated files whose text on disk is not what the sources make. */
export function stale(dir = CLIENT) {
  return twins(dir).filter(({ path, text }) => {
    try {
      return readFileSync(path, 'utf8') !== text;
    } catch {
      return true;
    }
  });
}

if (process.argv[1] && resolve(process.argv[1]) === fileURLToPath(import.meta.url)) {
  if (process.argv.includes('--check')) {
    const old = stale();
    for (const { path } of old) console.error(`stale: ${path} (run npm run build:client)`);
    process.exit(old.length ? 1 : 0);
  }
  for (const { path, text } of twins()) writeFileSync(path, text);
}
