// The client against a scripted `ws` server, for what daphne cannot be made to do on demand:
// close 1011, never answer, time the client's frames. Behaviour under the real server is in
// live.test.mjs.

import assert from 'node:assert/strict';
import { once } from 'node:events';
import { afterEach, test } from 'node:test';
import WebSocket from 'ws';

import { ORIGIN_HEADER, RealtimeClient } from '../realtime/static/realtime/realtime.js';
import { Recorder, SUCCESS, Scripted, countingWebSocket, freePort, sleep } from './harness.mjs';

let cleanup = [];
afterEach(() => {
  for (const item of cleanup) item.close();
  cleanup = [];
});

async function scripted(answer) {
  const server = await new Scripted(answer).ready();
  cleanup.push(server);
  return server;
}

function client(options) {
  const made = new RealtimeClient({ token: 'token', WebSocket, ...options });
  cleanup.push(made);
  return made;
}

test('backoff doubles from backoffStart up to backoffMax while nothing answers', async () => {
  const port = await freePort(); // nothing listens there
  const times = [];
  const Timed = class extends WebSocket {
    constructor(...args) {
      super(...args);
      times.push(Date.now());
    }
  };
  const realtime = client({
    url: `ws://127.0.0.1:${port}/api/ws`,
    WebSocket: Timed,
    backoffStart: 20,
    backoffMax: 160,
    jitter: 0,
  });
  const recorder = new Recorder(realtime);
  realtime.connect();
  await recorder.until((r) => r.states.length >= 7, 5000, 'six retries');
  assert.deepEqual(
    recorder.states.map((d) => [d.state, d.delay]),
    [
      ['connecting', undefined],
      ['reconnecting', 20],
      ['reconnecting', 40],
      ['reconnecting', 80],
      ['reconnecting', 160],
      ['reconnecting', 160],
      ['reconnecting', 160],
    ],
  );
  const gaps = times.slice(1).map((time, i) => time - times[i]);
  for (const [i, expected] of [20, 40, 80, 160, 160].entries()) {
    assert.ok(gaps[i] >= expected - 2, `attempt ${i + 2} came ${gaps[i]} ms after the last`);
  }
});

test('jitter takes a random share of each backoff step off its delay', async () => {
  const port = await freePort(); // nothing listens there
  const draws = [0.5, 1, 0, 0.25, 0.75];
  const random = Math.random;
  const runs = [];
  for (const jitter of [undefined, 0.5]) {
    const realtime = client({
      url: `ws://127.0.0.1:${port}/api/ws`,
      backoffStart: 20,
      backoffMax: 160,
      ...(jitter === undefined ? {} : { jitter }),
    });
    const recorder = new Recorder(realtime);
    let drawn = 0;
    Math.random = () => draws[drawn++ % draws.length];
    try {
      realtime.connect();
      await recorder.until((r) => r.states.length >= 6, 5000, 'five retries');
    } finally {
      Math.random = random;
    }
    realtime.close();
    runs.push(recorder.states.slice(1, 6).map((d) => d.delay));
  }
  // Steps 20, 40, 80, 160, 160; by default (jitter 1) anywhere from 0 to the step.
  assert.deepEqual(runs, [
    [10, 0, 80, 120, 40],
    [15, 20, 80, 140, 100],
  ]);
});

test('clients that lose the same server come back spread over the first backoff step', async () => {
  const port = await freePort(); // nothing listens there
  const delays = [];
  for (let i = 0; i < 50; i += 1) {
    const realtime = client({ url: `ws://127.0.0.1:${port}/api/ws`, backoffStart: 1000 });
    const recorder = new Recorder(realtime);
    realtime.connect();
    await recorder.until((r) => r.states.length >= 2, 5000, 'a retry');
    delays.push(recorder.states[1].delay);
    realtime.close();
  }
  assert.ok(delays.every((delay) => delay >= 0 && delay <= 1000), String(delays));
  assert.ok(new Set(delays).size > 25, `delays drawn: ${delays}`);
});

test('closed 1011 after authenticating: reconnects and says its channels again', async () => {
  const server = await scripted();
  const realtime = client({ url: server.url, backoffStart: 10 });
  const recorder = new Recorder(realtime);
  realtime.subscribe('contact', 'company:4');
  realtime.connect();
  await recorder.state('open');
  await server.until(() => server.connections[0].frames.length === 2);
  server.connections[0].socket.close(1011);
  const dropped = await recorder.state('reconnecting');
  assert.equal(dropped.code, 1011);
  await server.until(() => server.connections[1]?.frames.length === 2);
  // This server answers without a cursor (it does not resume): the channels follow again.
  for (const { frames } of server.connections) {
    assert.deepEqual(frames, [
      {
        type: 'authenticate',
        data: { token: 'token', scope: null, resume: null, channels: ['contact', 'company:4'] },
      },
      { type: 'subscribe', data: { channels: ['contact', 'company:4'] } },
    ]);
  }
  assert.deepEqual(recorder.stateNames(), ['connecting', 'open', 'reconnecting', 'open']);
});

test('the scope ask: scope, scopes, or null', async () => {
  const server = await scripted();
  const resuming = { resume: null, channels: [] };
  for (const [options, data] of [
    [{}, { token: 'token', scope: null, ...resuming }],
    [{ scope: 'acme' }, { token: 'token', scope: 'acme', ...resuming }],
    [{ scopes: ['a', 'b'] }, { token: 'token', scopes: ['a', 'b'], ...resuming }],
    [{ scopes: [] }, { token: 'token', scopes: [], ...resuming }],
    [{ scope: 'acme', resume: false }, { token: 'token', scope: 'acme' }],
  ]) {
    const realtime = client({ url: server.url, ...options });
    const recorder = new Recorder(realtime);
    realtime.connect();
    await recorder.state('open');
    const last = server.connections.at(-1);
    assert.deepEqual(last.frames[0], { type: 'authenticate', data });
    realtime.close();
  }
});

test('heartbeats every heartbeatInterval while open, and only then', async () => {
  const server = await scripted();
  const realtime = client({ url: server.url, heartbeatInterval: 40 });
  const recorder = new Recorder(realtime);
  realtime.connect();
  await recorder.state('open');
  const started = Date.now();
  await server.until(() => server.connections[0].frames.length >= 4);
  assert.ok(Date.now() - started >= 3 * 40 - 5);
  assert.deepEqual(server.connections[0].frames.slice(1), [
    { type: 'heartbeat', data: null },
    { type: 'heartbeat', data: null },
    { type: 'heartbeat', data: null },
  ]);
  realtime.close();
  const count = server.connections[0].frames.length;
  await sleep(120);
  assert.equal(server.connections[0].frames.length, count);
});

test('subscription changes of one task leave together, in order', async () => {
  const server = await scripted();
  const realtime = client({ url: server.url });
  const recorder = new Recorder(realtime);
  realtime.connect();
  await recorder.state('open');
  realtime.subscribe('a');
  realtime.subscribe('b', 'a');
  realtime.unsubscribe('a', 'never-held');
  realtime.subscribe(['c', 'd']);
  await server.until(() => server.connections[0].frames.length === 4);
  assert.deepEqual(server.connections[0].frames.slice(1), [
    { type: 'subscribe', data: { channels: ['a', 'b'] } },
    { type: 'unsubscribe', data: { channels: ['a'] } },
    { type: 'subscribe', data: { channels: ['c', 'd'] } },
  ]);
  assert.deepEqual(realtime.channels, ['b', 'c', 'd']);
});

test('a watch is followed by every channel held', async () => {
  const server = await scripted();
  const realtime = client({ url: server.url, scope: 'acme' });
  const recorder = new Recorder(realtime);
  realtime.subscribe('contact');
  realtime.connect();
  await recorder.state('open');
  realtime.watch({ scopes: ['beta'] });
  realtime.watch({ scope: null });
  await server.until(() => server.connections[0].frames.length === 6);
  assert.deepEqual(server.connections[0].frames.slice(2), [
    { type: 'watch', data: { scopes: ['beta'] } },
    { type: 'subscribe', data: { channels: ['contact'] } },
    { type: 'watch', data: { scope: null } },
    { type: 'subscribe', data: { channels: ['contact'] } },
  ]);
  // The next handshake asks for what was watched last.
  server.connections[0].socket.close(1011);
  await server.until(() => server.connections[1]?.frames.length >= 1);
  assert.deepEqual(server.connections[1].frames[0].data, {
    token: 'token',
    scope: null,
    resume: null,
    channels: ['contact'],
  });
});

test('close() from a state listener while reconnecting: no attempt follows', async () => {
  const server = await scripted();
  const Counting = countingWebSocket(WebSocket);
  const realtime = client({ url: server.url, WebSocket: Counting, backoffStart: 10 });
  const recorder = new Recorder(realtime);
  realtime.addEventListener('state', (event) => {
    if (event.detail.state === 'reconnecting') realtime.close();
  });
  realtime.connect();
  await recorder.state('open');
  server.connections[0].socket.close(1011);
  await recorder.state('closed');
  await sleep(100);
  assert.equal(Counting.opened, 1);
  assert.deepEqual(recorder.stateNames(), ['connecting', 'open', 'reconnecting', 'closed']);
});

test('no answer to authenticate within connectTimeout: tries again', async () => {
  const server = await scripted(() => null);
  const realtime = client({ url: server.url, connectTimeout: 50, backoffStart: 10 });
  const recorder = new Recorder(realtime);
  realtime.connect();
  const retry = await recorder.state('reconnecting');
  assert.match(retry.error.message, /no answer/);
  await server.until(() => server.connections.length >= 2);
});

test('close() stops everything; connect() starts again', async () => {
  const server = await scripted();
  const Counting = countingWebSocket(WebSocket);
  const realtime = client({ url: server.url, WebSocket: Counting, backoffStart: 10 });
  const recorder = new Recorder(realtime);
  realtime.connect();
  await recorder.state('open');
  const closed = once(server.connections[0].socket, 'close');
  realtime.close();
  const [code] = await closed;
  assert.equal(code, 1000);
  assert.equal(realtime.state, 'closed');
  await sleep(100);
  assert.equal(Counting.opened, 1);
  realtime.connect();
  await recorder.state('open', { from: 3 });
  assert.deepEqual(recorder.stateNames(), ['connecting', 'open', 'closed', 'connecting', 'open']);
});

test('getToken is asked before every attempt; refreshToken again after each success', async () => {
  const tokens = [];
  const server = await scripted((connection) => {
    const { token } = connection.frames[0].data;
    tokens.push(token);
    return token.startsWith('good')
      ? SUCCESS
      : { type: 'auth_error', data: { message: 'Invalid authentication token' } };
  });
  let current = 'stale-1';
  let refreshed = 0;
  const realtime = client({
    url: server.url,
    token: undefined,
    getToken: async () => current,
    refreshToken: async () => {
      refreshed += 1;
      current = `good-${refreshed}`;
    },
  });
  const recorder = new Recorder(realtime);
  realtime.connect();
  await recorder.state('open');
  // Later, the server refuses the token it holds (a recheck): refreshed once more.
  current = 'stale-2';
  server.send(server.connections.at(-1), {
    type: 'auth_error',
    data: { message: 'Invalid authentication token' },
  });
  await recorder.state('open', { from: 3 });
  assert.equal(refreshed, 2);
  assert.deepEqual(tokens, ['stale-1', 'good-1', 'good-2']);
  assert.deepEqual(recorder.stateNames(), [
    'connecting',
    'reconnecting',
    'open',
    'reconnecting',
    'open',
  ]);
});

test('a refreshToken that fails: refused', async () => {
  const server = await scripted(() => ({
    type: 'auth_error',
    data: { message: 'Invalid authentication token' },
  }));
  const realtime = client({
    url: server.url,
    refreshToken: async () => {
      throw new Error('signed out');
    },
  });
  const recorder = new Recorder(realtime);
  realtime.connect();
  const refused = await recorder.state('refused');
  assert.equal(refused.reason, 'Invalid authentication token');
  assert.equal(refused.error.message, 'signed out');
});

test('without refreshToken, getToken refreshes: asked again at once; when it fails, refused', async () => {
  const server = await scripted(() => ({
    type: 'auth_error',
    data: { message: 'Invalid authentication token' },
  }));
  let asked = 0;
  const realtime = client({
    url: server.url,
    token: undefined,
    getToken: async () => {
      asked += 1;
      if (asked > 1) throw new Error('signed out');
      return 'stale';
    },
  });
  const recorder = new Recorder(realtime);
  realtime.connect();
  const refused = await recorder.state('refused');
  assert.equal(refused.error.message, 'signed out');
  assert.deepEqual(recorder.stateNames(), ['connecting', 'reconnecting', 'refused']);
  assert.equal(server.connections.length, 1);
});

test("events: a named CustomEvent and a generic one; the client's names are kept", async () => {
  const server = await scripted();
  const realtime = client({ url: server.url });
  const recorder = new Recorder(realtime);
  const named = [];
  const states = [];
  realtime.addEventListener('contact.updated', (event) => {
    assert.ok(event instanceof CustomEvent);
    named.push(event.detail);
  });
  realtime.addEventListener('state', (event) => states.push(event.detail.state));
  realtime.connect();
  await recorder.state('open');
  const update = {
    type: 'contact.updated',
    data: { model: 'contact', id: 7 },
    origin: 'tab-1',
    changed: ['name'],
    scope_id: 3,
  };
  server.send(server.connections[0], update);
  server.send(server.connections[0], { type: 'state', data: { x: 1 } });
  server.send(server.connections[0], { type: 'report.ready', data: null, truncated: true });
  await recorder.until((r) => r.events.length === 3);
  assert.deepEqual(named, [update]);
  assert.deepEqual(
    recorder.events.map((f) => f.type),
    ['contact.updated', 'state', 'report.ready'],
  );
  assert.deepEqual(states, ['connecting', 'open']);
});

/** A stand-in `document` (Node.js has none) for as long as `body` runs. */
async function withDocument(body) {
  const document = new EventTarget();
  globalThis.document = document;
  try {
    await body(document);
  } finally {
    delete globalThis.document;
  }
}

test('each event frame and state change goes to document as realtime:<type>', async () => {
  await withDocument(async (document) => {
    const server = await scripted();
    const realtime = client({ url: server.url });
    const recorder = new Recorder(realtime);
    const heard = [];
    for (const name of ['realtime:contact.updated', 'realtime:report.ready', 'realtime:state']) {
      document.addEventListener(name, (event) => {
        assert.ok(event instanceof CustomEvent);
        heard.push([name, event.detail]);
      });
    }
    realtime.connect();
    await recorder.state('open');
    const update = { type: 'contact.updated', data: { model: 'contact', id: 7 }, scope_id: 3 };
    server.send(server.connections[0], update);
    // A frame of one of the client's own event names goes to document under no name.
    server.send(server.connections[0], { type: 'state', data: { x: 1 } });
    server.send(server.connections[0], { type: 'report.ready', data: null });
    await recorder.until((r) => r.events.length === 3);
    assert.deepEqual(heard, [
      ['realtime:state', { state: 'connecting', reason: null }],
      ['realtime:state', { state: 'open', reason: null, resumed: false }],
      ['realtime:contact.updated', update],
      ['realtime:report.ready', { type: 'report.ready', data: null }],
    ]);
  });
});

test('documentEvents: false keeps every event on the client', async () => {
  await withDocument(async (document) => {
    const server = await scripted();
    const realtime = client({ url: server.url, documentEvents: false });
    const recorder = new Recorder(realtime);
    let heard = 0;
    document.addEventListener('realtime:contact.updated', () => (heard += 1));
    document.addEventListener('realtime:state', () => (heard += 1));
    realtime.connect();
    await recorder.state('open');
    server.send(server.connections[0], { type: 'contact.updated', data: null });
    await recorder.until((r) => r.events.length === 1);
    assert.equal(heard, 0);
  });
});

test('stampedFetch sends X-Origin-Id; a failed write forgets its stamp', async () => {
  const server = await scripted();
  const sent = [];
  let status = 200;
  const realtime = client({
    url: server.url,
    fetch: async (url, init) => {
      sent.push([url, init.headers.get(ORIGIN_HEADER), init.headers.get('content-type')]);
      return new Response(null, { status });
    },
  });
  const recorder = new Recorder(realtime);
  realtime.connect();
  await recorder.state('open');

  await realtime.stampedFetch('/api/contacts/7', {
    method: 'PATCH',
    headers: { 'Content-Type': 'application/json' },
  });
  status = 400;
  await realtime.stampedFetch('/api/contacts/8', { method: 'PATCH' });
  const [[, ok], [, failed]] = sent;
  assert.equal(ok, `${realtime.origin}.1`);
  assert.equal(failed, `${realtime.origin}.2`);
  assert.equal(sent[0][2], 'application/json');
  assert.ok(realtime.nextOrigin().endsWith('.3'));

  for (const origin of [ok, ok, failed]) {
    server.send(server.connections[0], {
      type: 'contact.updated',
      data: { model: 'contact', id: 7 },
      origin,
    });
  }
  server.send(server.connections[0], { type: 'test.marker', data: null });
  await recorder.event((f) => f.type === 'test.marker');
  assert.deepEqual(
    recorder.events.map((f) => f.origin),
    [ok, failed, undefined],
  );
});

test('a stamp with a record is dropped only by a frame naming that record', async () => {
  const server = await scripted();
  const realtime = client({ url: server.url });
  const recorder = new Recorder(realtime);
  realtime.connect();
  await recorder.state('open');
  const stamp = realtime.remember(realtime.nextOrigin(), { model: 'contact', id: 7 });
  for (const data of [
    { model: 'company', id: 7 },
    { model: 'contact', id: 8 },
    { model: 'contact', id: '7' }, // a key may come as a string
    { model: 'contact', id: 7 },
  ]) {
    server.send(server.connections[0], { type: `${data.model}.updated`, data, origin: stamp });
  }
  await recorder.until((r) => r.events.length === 3);
  await sleep(50);
  assert.deepEqual(
    recorder.events.map((f) => [f.data.model, f.data.id]),
    [
      ['company', 7],
      ['contact', 8],
      ['contact', 7],
    ],
  );
  // A composite key names its own record only: its text parts may hold commas.
  const composite = realtime.remember(realtime.nextOrigin(), { model: 'stock', id: ['a,b', 'c'] });
  for (const id of [['a', 'b,c'], ['a,b', 'c']]) {
    const data = { model: 'stock', id };
    server.send(server.connections[0], { type: 'stock.updated', data, origin: composite });
  }
  await recorder.until((r) => r.events.length === 4);
  await sleep(50);
  assert.deepEqual(recorder.events.slice(3).map((f) => f.data.id), [['a', 'b,c']]);
});

test('the options it cannot do without', () => {
  const url = 'ws://x';
  assert.throws(() => new RealtimeClient({ token: 't', WebSocket }), /url/);
  assert.throws(() => new RealtimeClient({ url, WebSocket }), /token/);
  assert.throws(() => new RealtimeClient({ url, token: 't', WebSocket: null }), /WebSocket/);
  if (globalThis.WebSocket) {
    assert.equal(new RealtimeClient({ url, token: 't' })._WebSocket, globalThis.WebSocket);
  }
  const realtime = new RealtimeClient({ url, token: 't', WebSocket });
  assert.equal(realtime.state, 'closed');
  assert.match(realtime.origin, /^[0-9a-f]{16}$/);
  assert.notEqual(new RealtimeClient({ url, token: 't', WebSocket }).origin, realtime.origin);
});

// Resuming ---------------------------------------------------------------------------------

/** auth_success as a server that resumes answers it, with `cursor` (and `resumed`). */
function resumingSuccess(connection, count) {
  const asked = connection.frames[0].data.resume;
  const data = { user_id: 1, scope: 'acme', scopes: ['acme'], cursor: `c${count}` };
  if (typeof asked === 'string') data.resumed = asked !== 'stale';
  return { type: 'auth_success', data };
}

test('resuming: the cursor of the last frame handled goes back; resumed or not is told', async () => {
  const server = await scripted(resumingSuccess);
  const realtime = client({ url: server.url, backoffStart: 10 });
  const recorder = new Recorder(realtime);
  realtime.subscribe('contact');
  realtime.connect();
  const first = await recorder.state('open');
  assert.equal(first.resumed, false); // a first connection has nothing to keep
  assert.equal(realtime.cursor, 'c1');
  const frame = { type: 'contact.created', data: { model: 'contact', id: 1 }, cursor: 'after-1' };
  server.send(server.connections[0], frame);
  await recorder.until((r) => r.events.length === 1, 5000, 'the event');
  assert.equal(realtime.cursor, 'after-1');
  server.connections[0].socket.close(1011);
  await server.until(() => server.connections[1]?.frames.length >= 1);
  assert.deepEqual(server.connections[1].frames[0].data, {
    token: 'token',
    scope: null,
    resume: 'after-1',
    channels: ['contact'],
  });
  await recorder.until((r) => r.stateNames().at(-1) === 'open', 5000, 'open again');
  assert.equal(recorder.states.at(-1).resumed, true);
  assert.equal(realtime.resumed, true);
  // The server took the channels from authenticate: nothing else was sent.
  assert.deepEqual(
    server.connections.map(({ frames }) => frames.map((f) => f.type)),
    [['authenticate'], ['authenticate']],
  );
});

test('resuming refused: the client is told to read its data again', async () => {
  const server = await scripted(resumingSuccess);
  const realtime = client({ url: server.url, backoffStart: 10 });
  const recorder = new Recorder(realtime);
  realtime.connect();
  await recorder.state('open');
  server.send(server.connections[0], { type: 'x.updated', data: null, cursor: 'stale' });
  await recorder.until((r) => r.events.length === 1, 5000, 'the event');
  server.connections[0].socket.close(1011);
  await recorder.until((r) => r.stateNames().length === 4, 5000, 'open again');
  assert.equal(recorder.states.at(-1).resumed, false);
  assert.equal(realtime.resumed, false);
  assert.equal(realtime.cursor, 'c2'); // the new position it starts from
});

test("a cursor frame answering a heartbeat is kept like an event frame's and told to nobody", async () => {
  const server = await scripted(resumingSuccess);
  const realtime = client({ url: server.url, backoffStart: 10, heartbeatInterval: 20 });
  const recorder = new Recorder(realtime);
  const named = [];
  realtime.addEventListener('cursor', (event) => named.push(event.detail));
  realtime.connect();
  await recorder.state('open');
  await server.until(() => server.connections[0].frames.some((f) => f.type === 'heartbeat'));
  server.send(server.connections[0], { type: 'cursor', cursor: 'fresh' });
  server.send(server.connections[0], { type: 'marker', data: null }); // no cursor of its own
  await recorder.until((r) => r.events.length === 1, 5000, 'the marker');
  assert.deepEqual(recorder.events.map((f) => f.type), ['marker']);
  assert.deepEqual(named, []);
  assert.equal(realtime.cursor, 'fresh');
  server.connections[0].socket.close(1011);
  await server.until(() => server.connections[1]?.frames.length >= 1);
  assert.equal(server.connections[1].frames[0].data.resume, 'fresh');
});

test("application events named like the protocol's frames are events, not the protocol's", async () => {
  const server = await scripted(resumingSuccess);
  const realtime = client({ url: server.url });
  const recorder = new Recorder(realtime);
  const named = { cursor: [], auth_success: [] };
  for (const type of Object.keys(named)) {
    realtime.addEventListener(type, (event) => named[type].push(event.detail));
  }
  realtime.connect();
  await recorder.state('open');
  const session = realtime.session;
  const frames = [
    // A collaborator's caret, broadcast to the scope: heard, its cursor kept like any event's.
    { type: 'cursor', data: { user: 5, line: 12 }, scope_id: 3, cursor: 'c7' },
    { type: 'auth_success', data: { user_id: 9, scope: 'evil', scopes: ['evil'] }, cursor: 'c8' },
    // Once open, even in the handshake's shape: the handshake is over.
    { type: 'auth_success', data: { user_id: 9, scope: 'evil', scopes: ['evil'] } },
    { type: 'auth_error', data: { message: 'note' }, scope_id: 3, cursor: 'c9' },
    { type: 'auth_error', data: { message: 'note', level: 'info' } },
  ];
  for (const frame of frames) server.send(server.connections[0], frame);
  await recorder.until((r) => r.events.length === frames.length, 5000, 'the events');
  assert.deepEqual(recorder.events, frames);
  assert.deepEqual(named.cursor, [frames[0]]);
  assert.equal(named.auth_success.length, 1); // the handshake's, not the events'
  assert.equal(realtime.session, session);
  assert.equal(realtime.cursor, 'c9');
  assert.deepEqual([realtime.state, recorder.stateNames()], ['open', ['connecting', 'open']]);

  // A recheck's refusal after the handshake is still one: `{message}` alone.
  server.send(server.connections[0], { type: 'auth_error', data: { message: 'Scope not found' } });
  await recorder.state('refused');
  assert.equal(realtime.reason, 'Scope not found');
});

test('without resume, a frame of type cursor is an ordinary event', async () => {
  const server = await scripted();
  const realtime = client({ url: server.url, resume: false });
  const recorder = new Recorder(realtime);
  realtime.connect();
  await recorder.state('open');
  const frame = { type: 'cursor', data: { x: 1 } };
  server.send(server.connections[0], frame);
  await recorder.until((r) => r.events.length === 1, 5000, 'the event');
  assert.deepEqual(recorder.events, [frame]);
  assert.equal(realtime.cursor, null);
});
