// Live servers for the client's tests: a migrated SQLite database, daphne processes serving
// tests.asgi:application on it (as tests/live.py starts them), and jstests/fixtures.py to
// create accounts and write records from another process. Also a scripted `ws` server, for
// what daphne cannot be made to do on demand.

import { spawn, execFile } from 'node:child_process';
import { once } from 'node:events';
import { existsSync, mkdtempSync, openSync, closeSync, rmSync } from 'node:fs';
import { createServer, connect as tcpConnect } from 'node:net';
import { tmpdir } from 'node:os';
import { dirname, join, resolve } from 'node:path';
import { createInterface } from 'node:readline';
import { fileURLToPath } from 'node:url';
import { promisify } from 'node:util';
import { WebSocketServer } from 'ws';

export const ROOT = resolve(dirname(fileURLToPath(import.meta.url)), '..');
export const WAIT = 10000;
/** Timings every test server uses unless a test says otherwise (as tests/live.py's FAST). */
const FAST = { REALTIME_POLLING_INTERVAL: 0.02 };

const VENV_PYTHON = join(ROOT, '.venv', 'bin', 'python');
export const PYTHON = process.env.PYTHON || (existsSync(VENV_PYTHON) ? VENV_PYTHON : 'python3');

export async function freePort() {
  const server = createServer();
  server.listen(0, '127.0.0.1');
  await once(server, 'listening');
  const { port } = server.address();
  server.close();
  await once(server, 'close');
  return port;
}

const sleep = (ms) => new Promise((done) => setTimeout(done, ms));

function canConnect(port) {
  return new Promise((done) => {
    const socket = tcpConnect({ host: '127.0.0.1', port });
    socket.setTimeout(200);
    socket.once('connect', () => {
      socket.destroy();
      done(true);
    });
    socket.once('error', () => done(false));
    socket.once('timeout', () => {
      socket.destroy();
      done(false);
    });
  });
}

/** Children still running when the test process exits (a failed `before`, an interrupt). */
const children = new Set();
process.on('exit', () => {
  for (const child of children) child.kill('SIGKILL');
});

function track(child) {
  children.add(child);
  child.once('exit', () => children.delete(child));
  return child;
}

/** A test database and everything started on it; `stop()` ends all of it. */
export class Live {
  constructor() {
    this.dir = mkdtempSync(join(tmpdir(), 'realtime-js-'));
    this.database = join(this.dir, 'db.sqlite3');
    this.servers = [];
    this.fixtures = null;
  }

  env(settings = {}) {
    return {
      ...process.env,
      DJANGO_SETTINGS_MODULE: 'tests.settings',
      REALTIME_TEST_DATABASE: 'sqlite',
      REALTIME_TEST_DATABASE_NAME: this.database,
      PYTHONPATH: ROOT,
      REALTIME_TEST_SETTINGS: JSON.stringify({ ...FAST, ...settings }),
    };
  }

  /** Migrate the database and start the fixtures process. */
  async start() {
    await promisify(execFile)(PYTHON, ['-m', 'django', 'migrate', '--no-input'], {
      cwd: ROOT,
      env: this.env(),
    });
    const child = track(
      spawn(PYTHON, [join(ROOT, 'jstests', 'fixtures.py'), 'serve'], {
        cwd: ROOT,
        env: this.env(),
        stdio: ['pipe', 'pipe', 'inherit'],
      }),
    );
    const answers = [];
    createInterface({ input: child.stdout }).on('line', (line) => answers.shift()?.done(line));
    child.once('exit', (code) => {
      for (const { fail } of answers.splice(0)) fail(new Error(`fixtures.py exited (${code})`));
    });
    this.fixtures = { child, answers };
    return this;
  }

  /** Run a fixtures.py command in the fixtures process; its JSON answer. */
  async fixture(...argv) {
    const { child, answers } = this.fixtures;
    if (child.exitCode !== null) throw new Error('fixtures.py is not running');
    const line = new Promise((done, fail) => answers.push({ done, fail }));
    child.stdin.write(`${JSON.stringify(argv.map(String))}\n`);
    const answer = JSON.parse(await line);
    if (answer.error) throw new Error(`fixtures.py ${argv[0]}: ${answer.error}`);
    return answer;
  }

  /**
   * Start a daphne server with these setting overrides (on a given port, or a free one),
   * serving `application` (tests/asgi.py's bare route by default; `tests.asgi:guarded` sits
   * behind SocketOriginValidator, as the example project's does).
   */
  async server(settings = {}, port = undefined, application = 'tests.asgi:application') {
    const server = new Server(this, settings, port ?? (await freePort()), application);
    await server.start();
    this.servers.push(server);
    return server;
  }

  async stop() {
    await Promise.all(this.servers.map((server) => server.stop()));
    if (this.fixtures) {
      this.fixtures.child.stdin.end();
      await Promise.race([once(this.fixtures.child, 'exit'), sleep(5000)]);
      this.fixtures.child.kill('SIGKILL');
    }
    if (process.env.REALTIME_JS_KEEP) console.log(`database and daphne logs kept in ${this.dir}`);
    else rmSync(this.dir, { recursive: true, force: true });
  }
}

/** One daphne process; `kill()` and `start()` again to simulate a crash and a restart. */
export class Server {
  constructor(live, settings, port, application = 'tests.asgi:application') {
    this.live = live;
    this.application = application;
    this.settings = settings;
    this.port = port;
    this.process = null;
    this.starts = 0;
  }

  get url() {
    return `ws://127.0.0.1:${this.port}/api/ws`;
  }

  async start() {
    this.starts += 1;
    const log = openSync(join(this.live.dir, `daphne-${this.port}-${this.starts}.log`), 'w');
    const child = track(
      spawn(
        PYTHON,
        ['-m', 'daphne', '-b', '127.0.0.1', '-p', String(this.port), this.application],
        { cwd: ROOT, env: this.live.env(this.settings), stdio: ['ignore', log, log] },
      ),
    );
    closeSync(log);
    this.process = child;
    const deadline = Date.now() + 30000;
    while (Date.now() < deadline) {
      if (child.exitCode !== null) throw new Error(`daphne exited with ${child.exitCode}`);
      if (await canConnect(this.port)) return this;
      await sleep(50);
    }
    child.kill('SIGKILL');
    throw new Error('daphne did not listen within 30 s');
  }

  /** End the process: SIGKILL by default (a crash), or SIGTERM then SIGKILL. */
  async stop(signal = 'SIGTERM') {
    const child = this.process;
    if (!child || child.exitCode !== null || child.signalCode !== null) return;
    const exited = once(child, 'exit');
    child.kill(signal);
    if (await Promise.race([exited.then(() => true), sleep(10000).then(() => false)])) return;
    child.kill('SIGKILL');
    await exited;
  }

  kill() {
    return this.stop('SIGKILL');
  }

  /** What this worker's manager holds (tests/urls.py's `_realtime/state`). */
  async state() {
    const response = await fetch(`http://127.0.0.1:${this.port}/_realtime/state`);
    return response.json();
  }

  /** Poll the manager's state until `predicate` holds; return that state. */
  async waitForState(predicate, timeout = WAIT) {
    const deadline = Date.now() + timeout;
    let state;
    while (Date.now() < deadline) {
      state = await this.state();
      if (predicate(state)) return state;
      await sleep(20);
    }
    throw new Error(`server state never matched: ${JSON.stringify(state)}`);
  }
}

/** Record a client's `state` and `event` events, and wait for them with a bound. */
export class Recorder {
  constructor(client) {
    this.states = [];
    this.events = [];
    this.waiters = new Set();
    client.addEventListener('state', (event) => this.push(this.states, event.detail));
    client.addEventListener('event', (event) => this.push(this.events, event.detail));
  }

  push(list, item) {
    list.push(item);
    for (const waiter of this.waiters) waiter();
  }

  /** Wait until `predicate(this)` holds (checked on every new state or event). */
  until(predicate, timeout = WAIT, what = 'a condition') {
    return new Promise((done, fail) => {
      const check = () => {
        let result;
        try {
          result = predicate(this);
        } catch (error) {
          finish();
          fail(error);
          return;
        }
        if (result) {
          finish();
          done(result);
        }
      };
      const timer = setTimeout(() => {
        finish();
        const states = JSON.stringify(this.stateNames());
        fail(new Error(`timed out waiting for ${what}; states ${states}`));
      }, timeout);
      const finish = () => {
        clearTimeout(timer);
        this.waiters.delete(check);
      };
      this.waiters.add(check);
      check();
    });
  }

  stateNames() {
    return this.states.map((detail) => detail.state);
  }

  /** Wait for the `n`-th (1-based, counting from `from`) state `name`; its detail. */
  state(name, { from = 0, timeout = WAIT } = {}) {
    return this.until(
      () => this.states.slice(from).find((detail) => detail.state === name),
      timeout,
      `state ${name}`,
    );
  }

  /** Wait for an event frame matching `predicate`; the frame. */
  event(predicate, timeout = WAIT) {
    return this.until(() => this.events.find(predicate), timeout, 'an event');
  }
}

/** The scripted server's answer to `authenticate` unless a test gives another. */
export const SUCCESS = {
  type: 'auth_success',
  data: { user_id: 1, scope: 'acme', scopes: ['acme'] },
};

/** A server that answers `authenticate` with `answer(connection)` (auth_success by default). */
export class Scripted {
  constructor(answer = () => SUCCESS) {
    this.connections = [];
    this.waiters = new Set();
    this.server = new WebSocketServer({ host: '127.0.0.1', port: 0 });
    this.server.on('connection', (socket) => {
      const connection = { socket, frames: [] };
      this.connections.push(connection);
      socket.on('message', (raw) => {
        const frame = JSON.parse(String(raw));
        connection.frames.push(frame);
        if (frame.type === 'authenticate') {
          const reply = answer(connection, this.connections.length);
          if (reply) this.send(connection, reply);
          if (reply?.type === 'auth_error') socket.close(1008);
        }
        for (const waiter of this.waiters) waiter();
      });
    });
  }

  async ready() {
    await once(this.server, 'listening');
    return this;
  }

  get url() {
    return `ws://127.0.0.1:${this.server.address().port}/api/ws`;
  }

  send(connection, frame) {
    connection.socket.send(JSON.stringify(frame));
  }

  /** Wait until `predicate()` holds, checked on every frame received. */
  until(predicate, timeout = 5000) {
    return new Promise((done, fail) => {
      const check = () => {
        const result = predicate();
        if (result) {
          clearTimeout(timer);
          this.waiters.delete(check);
          done(result);
        }
      };
      const timer = setTimeout(() => {
        this.waiters.delete(check);
        fail(new Error('the scripted server never saw what it waited for'));
      }, timeout);
      this.waiters.add(check);
      check();
    });
  }

  close() {
    for (const client of this.server.clients) client.terminate();
    this.server.close();
  }
}

/** A WebSocket class that counts the sockets it opens (to prove a client stopped retrying). */
export function countingWebSocket(Base) {
  const Counting = class extends Base {
    constructor(...args) {
      super(...args);
      Counting.opened += 1;
    }
  };
  Counting.opened = 0;
  return Counting;
}

export { sleep };
