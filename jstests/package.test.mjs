// The client as an npm package: its generated CommonJS twins are current, its declarations
// name what realtime.js has, and a fresh `npm init` project that installs it the way
// docs/javascript-client.md says runs that page's examples against daphne.

import assert from 'node:assert/strict';
import { execFile, spawn } from 'node:child_process';
import { once } from 'node:events';
import {
  chmodSync,
  mkdirSync,
  mkdtempSync,
  readFileSync,
  readdirSync,
  rmSync,
  symlinkSync,
  writeFileSync,
} from 'node:fs';
import { tmpdir } from 'node:os';
import { join, relative } from 'node:path';
import { createInterface } from 'node:readline';
import { after, before, describe, test } from 'node:test';
import { promisify } from 'node:util';

import { CLIENT, stale } from '../scripts/build-js-client.mjs';
import { Live, PYTHON, ROOT, WAIT } from './harness.mjs';

const run = promisify(execFile);
const TSC = join(ROOT, 'node_modules', 'typescript', 'bin', 'tsc');
const DOCS = join(ROOT, 'docs', 'javascript-client.md');
/** The address the docs' examples name; the test's server replaces it. */
const DOCS_URL = 'ws://127.0.0.1:8000/api/ws';
/** The files the package ships, besides package.json. */
const SHIPPED = ['realtime.cjs', 'realtime.d.cts', 'realtime.d.ts', 'realtime.js'];

/** Run `tsc` with these arguments in `cwd`: its output; fail with it when it finds errors. */
async function tsc(cwd, ...args) {
  try {
    return (await run(process.execPath, [TSC, ...args], { cwd })).stdout;
  } catch (error) {
    assert.fail(`tsc ${args.join(' ')} failed in ${cwd}:\n${error.stdout}${error.stderr}`);
  }
}

/** The fenced blocks of `lang` under the heading `heading` of a markdown page. */
function fenced(markdown, heading, lang) {
  const start = markdown.indexOf(`\n${heading}\n`);
  assert.notEqual(start, -1, `no heading ${heading}`);
  const next = markdown.indexOf('\n## ', start + heading.length + 2);
  const section = markdown.slice(start, next === -1 ? undefined : next);
  const blocks = [];
  const pattern = new RegExp(`^\`\`\`${lang}\\n([\\s\\S]*?)^\`\`\`$`, 'gm');
  for (const match of section.matchAll(pattern)) blocks.push(match[1]);
  return blocks;
}

/** The block of the docs' section whose first line is the comment `// <name>`. */
function example(markdown, heading, lang, name) {
  const found = fenced(markdown, heading, lang).find((block) => block.startsWith(`// ${name}\n`));
  assert.ok(found, `no ${lang} block starting // ${name} under ${heading}`);
  return found;
}

/** A node process running `file` in `cwd`; `line(predicate)` waits for an output line. */
function node(cwd, file, env) {
  // Node.js 22 has a global WebSocket; Node.js 20 behind the flag the docs name.
  const old = Number(process.versions.node.split('.')[0]) < 22;
  const flags = old ? ['--experimental-websocket'] : [];
  const child = spawn(process.execPath, [...flags, file], {
    cwd,
    env: { ...process.env, ...env },
    stdio: ['ignore', 'pipe', 'pipe'],
  });
  const lines = [];
  const waiters = new Set();
  let stderr = '';
  child.stderr.on('data', (chunk) => {
    stderr += chunk;
  });
  createInterface({ input: child.stdout }).on('line', (text) => {
    lines.push(text);
    for (const waiter of waiters) waiter();
  });
  return {
    child,
    lines,
    line(predicate, what) {
      return new Promise((done, fail) => {
        const check = () => {
          const found = lines.find(predicate);
          if (found === undefined) return;
          finish();
          done(found);
        };
        const timer = setTimeout(() => {
          finish();
          const printed = `${JSON.stringify(lines)}${stderr}`;
          fail(new Error(`${file} never printed ${what}; it printed ${printed}`));
        }, WAIT);
        const finish = () => {
          clearTimeout(timer);
          waiters.delete(check);
        };
        waiters.add(check);
        check();
      });
    },
    async stop() {
      if (child.exitCode !== null || child.signalCode !== null) return;
      const exited = once(child, 'exit');
      child.kill('SIGTERM');
      await exited;
    },
  };
}

describe('the package in the source tree', () => {
  test('realtime.cjs and realtime.d.cts are made from the current sources', () => {
    assert.deepEqual(
      stale().map(({ path }) => relative(ROOT, path)),
      [],
      'stale: run npm run build:client and commit what it writes',
    );
  });

  test("the package's version is the Python package's", () => {
    const pyproject = readFileSync(join(ROOT, 'pyproject.toml'), 'utf8');
    const [, version] = /^version = "([^"]+)"$/m.exec(pyproject);
    assert.equal(JSON.parse(readFileSync(join(CLIENT, 'package.json'), 'utf8')).version, version);
  });

  test('the declarations name each export and public member of realtime.js, no other', async () => {
    // tsc reads realtime.js alone (no realtime.d.ts beside it) and writes what it infers;
    // a check file then compares those names with the declared ones.
    const dir = mkdtempSync(join(tmpdir(), 'realtime-types-'));
    try {
      mkdirSync(join(dir, 'source'));
      writeFileSync(join(dir, 'package.json'), '{"type": "module"}\n');
      writeFileSync(join(dir, 'source', 'realtime.js'), readFileSync(join(CLIENT, 'realtime.js')));
      const strict = ['--target', 'es2022', '--module', 'nodenext', '--lib', 'es2022,dom'];
      strict.push('--types', '');
      const emit = ['--allowJs', '--declaration', '--emitDeclarationOnly', '--outDir', 'inferred'];
      await tsc(dir, ...strict, ...emit, 'source/realtime.js');
      const declared = relative(dir, join(CLIENT, 'realtime.js'));
      writeFileSync(
        join(dir, 'check.mts'),
        `import * as inferred from './inferred/realtime.js';
import * as declared from '${declared}';

/** Names of T's own public members: neither \`_private\` nor EventTarget's. */
type Public<T> = Exclude<keyof T, \`_\${string}\` | keyof EventTarget>;
/** Compiles only when T is never: the names one side has and the other lacks. */
type None<T extends never> = T;

export type UndeclaredExports = None<Exclude<keyof typeof inferred, keyof typeof declared>>;
export type UnknownExports = None<Exclude<keyof typeof declared, keyof typeof inferred>>;
type Inferred = Public<inferred.RealtimeClient>;
type Declared = Public<declared.RealtimeClient>;
export type UndeclaredMembers = None<Exclude<Inferred, Declared>>;
export type UnknownMembers = None<Exclude<Declared, Inferred>>;
type InferredQuery = Public<inferred.LiveQuery>;
type DeclaredQuery = Public<declared.LiveQuery>;
export type UndeclaredQueryMembers = None<Exclude<InferredQuery, DeclaredQuery>>;
export type UnknownQueryMembers = None<Exclude<DeclaredQuery, InferredQuery>>;
`,
      );
      await tsc(dir, ...strict, '--strict', '--noEmit', 'check.mts');
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  });
});

describe('installed in a fresh npm project as the docs say', () => {
  let live;
  let root; // the temporary folder: the project, npm's cache, a `python` for the docs' commands
  let project;
  const markdown = readFileSync(DOCS, 'utf8');

  before(async () => {
    root = mkdtempSync(join(tmpdir(), 'realtime-npm-'));
    // `python` on PATH is the harness's (the source tree's realtime); npm stays offline.
    const bin = join(root, 'bin');
    mkdirSync(bin);
    writeFileSync(join(bin, 'python'), `#!/bin/sh\nexec '${PYTHON}' "$@"\n`);
    chmodSync(join(bin, 'python'), 0o755);
    const env = {
      ...process.env,
      PATH: `${bin}:${process.env.PATH}`,
      PYTHONPATH: ROOT,
      npm_config_offline: 'true',
      npm_config_audit: 'false',
      npm_config_fund: 'false',
      npm_config_update_notifier: 'false',
      npm_config_cache: join(root, 'npm-cache'),
    };
    project = join(root, 'app');
    mkdirSync(project);
    await run('npm', ['init', '-y'], { cwd: project, env });
    const [install] = fenced(markdown, '## With npm', 'sh');
    await run('bash', ['-euo', 'pipefail', '-c', install], { cwd: project, env });
    live = await new Live().start();
  });

  after(async () => {
    await live?.stop();
    if (root) rmSync(root, { recursive: true, force: true });
  });

  test('npm installs the package with its four files and no dependency', () => {
    const installed = join(project, 'node_modules', 'django-realtime-models');
    assert.deepEqual(readdirSync(installed).sort(), ['package.json', ...SHIPPED]);
    for (const name of SHIPPED) {
      const text = readFileSync(join(installed, name), 'utf8');
      assert.equal(text, readFileSync(join(CLIENT, name), 'utf8'), name);
    }
    const manifest = JSON.parse(readFileSync(join(project, 'package.json'), 'utf8'));
    assert.deepEqual(Object.keys(manifest.dependencies), ['django-realtime-models']);
    const modules = readdirSync(join(project, 'node_modules'));
    assert.deepEqual(
      modules.filter((name) => !name.startsWith('.')),
      ['django-realtime-models'],
    );
  });

  test("the docs' ESM and CommonJS scripts hear a write through the origin check", async () => {
    const server = await live.server({}, undefined, 'tests.asgi:guarded');
    const ann = await live.fixture('user', 'ann', 'acme');
    const heading = '## In Node.js';
    const scripts = ['listen.mjs', 'listen.cjs'].map((name) => {
      const text = example(markdown, heading, 'js', name);
      assert.ok(text.includes(DOCS_URL), `${name} names ${DOCS_URL}`);
      writeFileSync(join(project, name), text.replace(DOCS_URL, server.url));
      return node(project, name, { REALTIME_TOKEN: ann.token });
    });
    try {
      const [esm, cjs] = scripts;
      await esm.line((text) => text.startsWith('state open'), 'state open');
      await server.waitForState(
        (state) =>
          state.sockets.filter(
            (socket) => socket.user_id === ann.id && socket.channels.includes('contact'),
          ).length === 2,
      );
      const { id } = await live.fixture('contact', 'acme', 'Zed');
      for (const script of scripts) {
        const line = await script.line(
          (text) => text.startsWith('contact.created '),
          'contact.created',
        );
        assert.deepEqual(JSON.parse(line.slice('contact.created '.length)), {
          model: 'contact',
          id,
          name: 'Zed',
          company: null,
          born: null,
          score: null,
        });
      }
      assert.deepEqual(esm.lines.slice(0, 2), ['state connecting', 'state open']);
      assert.equal(cjs.lines.length, 1);
    } finally {
      await Promise.all(scripts.map((script) => script.stop()));
    }
  });

  test("TypeScript sees the installed package's types, for import and for require", async () => {
    const text = example(markdown, '## With TypeScript', 'ts', 'live.ts');
    // npm init makes a CommonJS package: live.ts is a CommonJS module (require's types),
    // live.mts an ES module (import's).
    writeFileSync(join(project, 'live.ts'), text);
    writeFileSync(join(project, 'live.mts'), text);
    const options = ['--noEmit', '--strict', '--module', 'nodenext', '--target', 'es2022'];
    options.push('--lib', 'es2022,dom');
    const explained = await tsc(project, ...options, '--explainFiles', 'live.ts', 'live.mts');
    const from = 'node_modules/django-realtime-models/';
    const seen = (types, file) =>
      new RegExp(`${from}${types}\\n\\s+Imported via [^\\n]+ from file '${file}'`);
    assert.match(explained, seen('realtime\\.d\\.cts', 'live\\.ts'));
    assert.match(explained, seen('realtime\\.d\\.ts', 'live\\.mts'));
    // A Node.js-only project (no DOM in lib, @types/node installed) compiles it with the
    // docs' tsconfig.json.
    const nodeOnly = join(project, 'node-only');
    mkdirSync(nodeOnly, { recursive: true });
    const config = example(markdown, '## With TypeScript', 'jsonc', 'tsconfig.json');
    assert.doesNotMatch(config, /dom/i);
    writeFileSync(join(nodeOnly, 'tsconfig.json'), config);
    writeFileSync(join(nodeOnly, 'live.mts'), text);
    writeFileSync(join(nodeOnly, 'live.ts'), text);
    const types = join(project, 'node_modules', '@types');
    mkdirSync(types, { recursive: true });
    symlinkSync(join(ROOT, 'node_modules', '@types', 'node'), join(types, 'node'), 'dir');
    await tsc(nodeOnly, '-p', '.');
    // The types bite: a client without a token does not compile.
    writeFileSync(join(project, 'wrong.mts'), `${text}\nnew RealtimeClient({ url: "ws://x" });\n`);
    await assert.rejects(
      run(process.execPath, [TSC, ...options, 'wrong.mts'], { cwd: project }),
      (error) => /wrong\.mts\(\d+,\d+\): error TS/.test(error.stdout),
    );
  });
});
