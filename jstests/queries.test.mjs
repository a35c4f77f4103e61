// Live queries (client.liveQuery) against a scripted `ws` server that plays the server's part
// of the protocol: `query` answered by `query.rows`, then `query.diff`, `query.error`.

import assert from 'node:assert/strict';
import { afterEach, test } from 'node:test';
import WebSocket from 'ws';

import { LiveQuery, RealtimeClient } from '../realtime/static/realtime/realtime.js';
import { Recorder, Scripted, sleep } from './harness.mjs';

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
  const made = new RealtimeClient({ token: 'token', WebSocket, backoffStart: 10, ...options });
  cleanup.push(made);
  return made;
}

/** A client open on a fresh scripted server: `{server, realtime, recorder}`. */
async function opened(options = {}) {
  const server = await scripted();
  const realtime = client({ url: server.url, ...options });
  const recorder = new Recorder(realtime);
  realtime.connect();
  await recorder.state('open');
  return { server, realtime, recorder };
}

/** The frames of `type` the server received on its `index`-th connection. */
function received(server, type, index = 0) {
  return server.connections[index].frames.filter((frame) => frame.type === type);
}

/**
 * The wire ids the client sent `list`'s asks under on connection `index`, oldest first: each
 * ask goes as `<n>:<list.id>` (cut to 64 characters), never under the application's id.
 */
function wires(server, list, index = 0) {
  return received(server, 'query', index)
    .map((frame) => frame.data.id)
    .filter((id) => {
      const rest = /^\d+:/.test(id) ? id.slice(id.indexOf(':') + 1) : null;
      return rest === list.id || (id.length === 64 && rest !== null && list.id.startsWith(rest));
    });
}

/** The wire id of `list`'s last ask on connection `index` (the test waited for its frame). */
function wire(server, list, index = 0) {
  const sent = wires(server, list, index);
  assert.ok(sent.length > 0, `no query frame for ${list.id}`);
  return sent.at(-1);
}

/** Record a live query's `change` details and `error` messages. */
function heard(list) {
  const seen = { changes: [], errors: [] };
  list.addEventListener('change', (event) => seen.changes.push(event.detail));
  list.addEventListener('error', (event) => seen.errors.push(event.detail.message));
  return seen;
}

/** Wait until `predicate()` holds (the client's frames are read in other tasks). */
async function eventually(predicate, what = 'a condition', timeout = 5000) {
  const deadline = Date.now() + timeout;
  while (!predicate()) {
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`);
    await sleep(2);
  }
}

/** Send `frames` to connection `index`, then a marker, and wait for the client to read them. */
async function deliver(server, recorder, frames, index = 0) {
  const marker = `test.marker.${Math.random()}`;
  for (const frame of [...frames, { type: marker, data: null }]) {
    server.send(server.connections[index], frame);
  }
  await recorder.event((frame) => frame.type === marker);
}

const rows = (id, data) => ({ type: 'query.rows', data: { id, rows: data } });
const diff = (id, { enter = [], leave = [], update = [] }) => ({
  type: 'query.diff',
  data: { id, enter, leave, update },
});
const ids = (list) => list.rows.map((row) => row.id);

test('a live query is asked once open, and its rows come as the server orders them', async () => {
  const server = await scripted();
  const realtime = client({ url: server.url });
  const recorder = new Recorder(realtime);
  const calls = [];
  const list = realtime.liveQuery(
    { model: 'ticket', where: { status: 'open', company: 42 }, orderBy: ['-priority'], limit: 3 },
    {
      onChange(current, change) {
        calls.push([this, current, change]);
      },
    },
  );
  const plain = realtime.liveQuery({ model: 'company' });
  assert.ok(list instanceof LiveQuery);
  assert.deepEqual([list.id, plain.id], ['q1', 'q2']);
  assert.deepEqual(realtime.liveQueries, [list, plain]);
  assert.equal(list.loaded, false);
  assert.deepEqual(list.rows, []);
  realtime.connect(); // asked at auth_success, not before
  await recorder.state('open');
  await server.until(() => received(server, 'query').length === 2);
  assert.deepEqual(received(server, 'query'), [
    {
      type: 'query',
      data: {
        id: '1:q1', // the ask's own id on the wire: <n>:<id>
        model: 'ticket',
        where: { status: 'open', company: 42 },
        order_by: ['-priority'],
        limit: 3,
      },
    },
    // Left out: the server's defaults.
    { type: 'query', data: { id: '2:q2', model: 'company', where: {} } },
  ]);
  const answer = [
    { id: 1, priority: 5, title: 'a' },
    { id: 2, priority: 3, title: 'b' },
  ];
  // Frames under the application's ids are no ask's: dropped.
  await deliver(server, recorder, [rows('q1', [{ id: 9 }]), rows('q2', [{ id: 9 }])]);
  assert.deepEqual([list.loaded, plain.loaded, calls.length], [false, false, 0]);
  await deliver(server, recorder, [rows('1:q1', answer), rows('2:q2', [])]);
  assert.deepEqual(list.rows, answer);
  assert.equal(list.loaded, true);
  assert.equal(calls.length, 1);
  const [[self, current, change]] = calls;
  assert.equal(self, list);
  assert.equal(current, list.rows);
  assert.deepEqual(change, { rows: answer, type: 'rows', entered: answer, updated: [], left: [] });
  // An empty first answer is an answer too.
  assert.equal(plain.loaded, true);
  assert.deepEqual(plain.rows, []);
  // The query frames are the live queries': none came as an event.
  assert.ok(recorder.events.every((frame) => frame.type.startsWith('test.marker.')));
  assert.deepEqual(list.query, {
    id: 'q1',
    model: 'ticket',
    where: { status: 'open', company: 42 },
    orderBy: ['-priority'],
    limit: 3,
  });
});

test('a diff: rows leave, enter at their place in the order, and the limit holds', async () => {
  const { server, realtime, recorder } = await opened();
  const list = realtime.liveQuery({ model: 'ticket', orderBy: ['-priority'], limit: 3 });
  const seen = heard(list);
  await server.until(() => received(server, 'query').length === 1);
  await deliver(server, recorder, [
    rows(wire(server, list), [
      { id: 1, priority: 5 },
      { id: 2, priority: 3 },
      { id: 3, priority: 1 },
    ]),
  ]);
  const [first, second] = list.rows;
  await deliver(server, recorder, [
    diff(wire(server, list), { enter: [{ id: 4, priority: 4 }], leave: [3] }),
  ]);
  assert.deepEqual(ids(list), [1, 4, 2]);
  assert.equal(list.rows[0], first); // rows that did not change stay the same objects
  assert.equal(list.rows[2], second);
  assert.deepEqual(seen.changes.at(-1), {
    rows: list.rows,
    type: 'diff',
    entered: [{ id: 4, priority: 4 }],
    updated: [],
    left: [{ id: 3, priority: 1 }],
  });
  // Ties go by the primary key, ascending; a new first row; two entering rows at once.
  await deliver(server, recorder, [
    diff(wire(server, list), {
      enter: [
        { id: 9, priority: 4 },
        { id: 0, priority: 4 },
      ],
      leave: [2, 1],
    }),
  ]);
  assert.deepEqual(ids(list), [0, 4, 9]);
  // Rows beyond the limit are dropped, and told as left.
  await deliver(server, recorder, [diff(wire(server, list), { enter: [{ id: 7, priority: 8 }] })]);
  assert.deepEqual(ids(list), [7, 0, 4]);
  assert.deepEqual(seen.changes.at(-1).left, [{ id: 9, priority: 4 }]);
  // An entering row that falls beyond the limit never shows.
  await deliver(server, recorder, [diff(wire(server, list), { enter: [{ id: 8, priority: 0 }] })]);
  assert.deepEqual(ids(list), [7, 0, 4]);
  assert.equal(seen.changes.length, 4); // nothing changed: no change event
});

test("the order: by field, '-' descending; nulls smallest, or largest (nullsLargest)", async () => {
  const { server, realtime, recorder } = await opened();
  const list = realtime.liveQuery({ model: 'contact', orderBy: ['company', '-score', 'name'] });
  await server.until(() => received(server, 'query').length === 1);
  await deliver(server, recorder, [rows(wire(server, list), [])]);
  const entering = [
    { id: 1, company: 2, score: 10, name: 'b' },
    { id: 2, company: null, score: 1, name: 'z' },
    { id: 3, company: 2, score: null, name: 'a' },
    { id: 4, company: 10, score: 5, name: 'a' }, // 10 after 2: numbers compare as numbers
    { id: 5, company: 2, score: 10, name: 'B' }, // 'B' before 'b': by code unit
    { id: 6, company: 2, score: 10, name: 'b' }, // the same as 1: by primary key
    { id: 7, company: null, score: 3, name: 'z' },
    { id: 8, company: 2, score: 12, name: null },
  ];
  await deliver(server, recorder, [diff(wire(server, list), { enter: entering })]);
  assert.deepEqual(ids(list), [7, 2, 8, 5, 1, 6, 3, 4]);
  // nullsLargest (a PostgreSQL server): nulls last ascending, first descending.
  realtime.nullsLargest = true;
  await deliver(server, recorder, [rows(wire(server, list), [])]);
  await deliver(server, recorder, [diff(wire(server, list), { enter: entering })]);
  assert.deepEqual(ids(list), [3, 8, 5, 1, 6, 4, 7, 2]);
  realtime.nullsLargest = false;
  // Without orderBy the server orders by primary key, and so does the client.
  const plain = realtime.liveQuery({ model: 'contact' });
  await server.until(() => received(server, 'query').length === 2);
  await deliver(server, recorder, [rows(wire(server, plain), [{ id: 'b' }, { id: 'd' }])]);
  await deliver(server, recorder, [
    diff(wire(server, plain), { enter: [{ id: 'c' }, { id: 'a' }] }),
  ]);
  assert.deepEqual(ids(plain), ['a', 'b', 'c', 'd']);
});

test('an update moves its row to where its new values put it; the others keep theirs', async () => {
  const { server, realtime, recorder } = await opened();
  const list = realtime.liveQuery({ model: 'ticket', orderBy: ['priority'] });
  const seen = heard(list);
  await server.until(() => received(server, 'query').length === 1);
  await deliver(server, recorder, [
    rows(wire(server, list), [
      { id: 1, priority: 1, title: 'a' },
      { id: 2, priority: 2, title: 'b' },
      { id: 3, priority: 3, title: 'c' },
      { id: 4, priority: 4, title: 'd' },
    ]),
  ]);
  const [, two, three, four] = list.rows;
  const moved = { id: 1, priority: 3, title: 'a' };
  await deliver(server, recorder, [diff(wire(server, list), { update: [moved] })]);
  assert.deepEqual(ids(list), [2, 1, 3, 4]); // after 2, and before 3 by primary key
  assert.deepEqual(list.rows[1], moved);
  assert.ok(list.rows[0] === two && list.rows[2] === three && list.rows[3] === four);
  assert.deepEqual(seen.changes.at(-1), {
    rows: list.rows,
    type: 'diff',
    entered: [],
    updated: [list.rows[1]],
    left: [],
  });
  assert.equal(seen.changes.at(-1).updated[0], list.rows[1]);
  // A field that is not ordered on: the row stays in place.
  const renamed = { id: 3, priority: 3, title: 'C' };
  await deliver(server, recorder, [diff(wire(server, list), { update: [renamed] })]);
  assert.deepEqual(ids(list), [2, 1, 3, 4]);
  assert.equal(list.rows[2].title, 'C');
  // An update that changes nothing keeps the row object, the array, and says nothing.
  const shown = list.rows;
  const changes = seen.changes.length;
  const same = { id: 4, priority: 4, title: 'd' };
  await deliver(server, recorder, [diff(wire(server, list), { update: [same] })]);
  assert.equal(list.rows, shown);
  assert.equal(seen.changes.length, changes);
});

test('leave and enter in one frame, a row leaving and entering again among them', async () => {
  const { server, realtime, recorder } = await opened();
  const list = realtime.liveQuery({ model: 'ticket', orderBy: ['-priority'], limit: 2 });
  const seen = heard(list);
  await server.until(() => received(server, 'query').length === 1);
  await deliver(server, recorder, [
    rows(wire(server, list), [
      { id: 1, priority: 5 },
      { id: 2, priority: 3 },
    ]),
  ]);
  const [kept] = list.rows;
  await deliver(server, recorder, [
    diff(wire(server, list), { leave: [2], enter: [{ id: 3, priority: 9 }] }),
  ]);
  assert.deepEqual(list.rows, [
    { id: 3, priority: 9 },
    { id: 1, priority: 5 },
  ]);
  assert.equal(list.rows[1], kept);
  // A key in both leave and enter: gone, then back with its new values.
  await deliver(server, recorder, [
    diff(wire(server, list), {
      leave: [3, 1],
      enter: [
        { id: 1, priority: 10 },
        { id: 4, priority: 2 },
      ],
    }),
  ]);
  assert.deepEqual(list.rows, [
    { id: 1, priority: 10 },
    { id: 4, priority: 2 },
  ]);
  const change = seen.changes.at(-1);
  assert.deepEqual(change.entered, [{ id: 4, priority: 2 }]);
  assert.deepEqual(change.updated, [{ id: 1, priority: 10 }]);
  assert.deepEqual(change.left, [{ id: 3, priority: 9 }]);
});

test('composite keys: an array id, left by its array, ordered item by item', async () => {
  const { server, realtime, recorder } = await opened();
  const list = realtime.liveQuery({ model: 'line' });
  await server.until(() => received(server, 'query').length === 1);
  await deliver(server, recorder, [
    rows(wire(server, list), [
      { id: [1, 2], qty: 1 },
      { id: [2, 1], qty: 1 },
    ]),
  ]);
  await deliver(server, recorder, [
    diff(wire(server, list), {
      leave: [[2, 1]],
      enter: [
        { id: [1, 10], qty: 3 },
        { id: [1, 3], qty: 2 },
      ],
    }),
  ]);
  assert.deepEqual(ids(list), [
    [1, 2],
    [1, 3],
    [1, 10],
  ]);
});

test('composite keys whose text parts hold a comma are two rows', async () => {
  const { server, realtime, recorder } = await opened();
  const list = realtime.liveQuery({ model: 'stock' });
  await server.until(() => received(server, 'query').length === 1);
  await deliver(server, recorder, [
    rows(wire(server, list), [
      { id: ['a', 'b,c'], qty: 1 },
      { id: ['a,b', 'c'], qty: 2 },
    ]),
  ]);
  assert.deepEqual(ids(list), [
    ['a', 'b,c'],
    ['a,b', 'c'],
  ]);
  await deliver(server, recorder, [
    diff(wire(server, list), { leave: [['a,b', 'c']], update: [{ id: ['a', 'b,c'], qty: 5 }] }),
  ]);
  assert.deepEqual(list.rows, [{ id: ['a', 'b,c'], qty: 5 }]);
});

test('decimals come as text and sort by value; keys sort as the server sorts them', async () => {
  const { server, realtime, recorder } = await opened();
  const list = realtime.liveQuery({ model: 'invoice', orderBy: ['-total'] });
  await server.until(() => received(server, 'query').length === 1);
  await deliver(server, recorder, [rows(wire(server, list), [{ id: 1, total: '100.00' }])]);
  const totals = ['9.50', '-3', '0E-10', '1E-7', '100.000', '99.99', '-0.5'];
  const enter = [...totals, '12345678901234567.01'].map((total, i) => ({ id: i + 2, total }));
  await deliver(server, recorder, [diff(wire(server, list), { enter })]);
  assert.deepEqual(
    list.rows.map((row) => row.total),
    ['12345678901234567.01', '100.00', '100.000', '99.99', '9.50', '1E-7', '0E-10', '-0.5', '-3'],
  );
  // Keys: numbers before text, text by its characters, whatever it looks like.
  const keys = realtime.liveQuery({ model: 'code', orderBy: ['pk'] });
  await server.until(() => received(server, 'query').length === 2);
  await deliver(server, recorder, [rows(wire(server, keys), [])]);
  const codes = [{ id: '9' }, { id: '10' }, { id: 3 }];
  await deliver(server, recorder, [diff(wire(server, keys), { enter: codes })]);
  assert.deepEqual(ids(keys), [3, '10', '9']);
  // The primary key by its field's name (a `code` key): the rows carry it as `id` alone.
  const named = realtime.liveQuery({ model: 'bin', orderBy: ['-code'] });
  await server.until(() => received(server, 'query').length === 3);
  await deliver(server, recorder, [rows(wire(server, named), [])]);
  await deliver(server, recorder, [
    diff(wire(server, named), { enter: [{ id: 'c' }, { id: 'b' }, { id: 'd' }] }),
  ]);
  assert.deepEqual(ids(named), ['d', 'c', 'b']);
});

test('compare: where rows go, for values the client cannot order (durations in ISO 8601)', async () => {
  const { server, realtime, recorder } = await opened();
  // As docs/javascript-client.md writes it.
  function seconds(duration) {
    const [, sign, days, hours, minutes, secs] = duration.match(/^(-?)P(\d+)DT(\d+)H(\d+)M([\d.]+)S$/);
    const total = Number(days) * 86400 + Number(hours) * 3600 + Number(minutes) * 60 + Number(secs);
    return sign ? -total : total;
  }
  const list = realtime.liveQuery(
    { model: 'call', orderBy: ['length'] },
    { compare: (a, b) => seconds(a.length) - seconds(b.length) || a.id - b.id },
  );
  await server.until(() => received(server, 'query').length === 1);
  const asked = wire(server, list);
  await deliver(server, recorder, [rows(asked, [{ id: 1, length: 'P0DT02H00M00S' }])]);
  const enter = [
    { id: 2, length: 'P10DT00H00M00S' },
    { id: 3, length: 'P2DT00H00M00S' },
    { id: 4, length: '-P0DT01H00M00.500000S' },
  ];
  await deliver(server, recorder, [diff(wire(server, list), { enter })]);
  assert.deepEqual(ids(list), [4, 1, 3, 2]); // as text, 'P10D...' would come before 'P2D...'
});

test('replace(): asked under a fresh wire id; the old rows stay until the new ones come', async () => {
  const { server, realtime, recorder } = await opened();
  const list = realtime.liveQuery({ model: 'ticket', where: { status: 'open' }, orderBy: ['n'] });
  const seen = heard(list);
  await server.until(() => received(server, 'query').length === 1);
  const first = wire(server, list);
  await deliver(server, recorder, [
    rows(first, [
      { id: 1, n: 1, status: 'open' },
      { id: 2, n: 2, status: 'open' },
    ]),
  ]);
  const [one] = list.rows;
  assert.equal(list.replace({ where: { status: 'any' }, orderBy: ['-n'] }), list);
  await server.until(() => received(server, 'query').length === 2);
  const second = wire(server, list);
  assert.deepEqual([first, second], ['1:q1', '2:q1']);
  // The server is told to stop the old ask first (its room among the socket's queries is
  // free before the new one is read), then hears the new one under an id of its own.
  assert.deepEqual(server.connections[0].frames.slice(-2), [
    { type: 'unquery', data: { id: first } },
    {
      type: 'query',
      data: { id: second, model: 'ticket', where: { status: 'any' }, order_by: ['-n'] },
    },
  ]);
  assert.equal(list.id, 'q1'); // the application's id
  assert.deepEqual(list.query, {
    id: 'q1',
    model: 'ticket',
    where: { status: 'any' },
    orderBy: ['-n'],
  });
  // A diff the server sent before it read the replacement follows the old order.
  await deliver(server, recorder, [diff(first, { enter: [{ id: 3, n: 3, status: 'open' }] })]);
  assert.deepEqual(ids(list), [1, 2, 3]);
  const changes = seen.changes.length;
  await deliver(server, recorder, [
    rows(second, [
      { id: 3, n: 3, status: 'open' },
      { id: 4, n: 2, status: 'closed' },
      { id: 1, n: 1, status: 'open' },
    ]),
  ]);
  assert.equal(seen.changes.length, changes + 1); // one change, when the answer came
  assert.deepEqual(ids(list), [3, 4, 1]);
  assert.equal(list.rows[2], one);
  // Now diffs follow the new order; the old ask's wire id is forgotten.
  await deliver(server, recorder, [
    diff(first, { enter: [{ id: 6, n: 0, status: 'open' }] }),
    diff(second, { enter: [{ id: 5, n: 9, status: 'open' }] }),
  ]);
  assert.deepEqual(ids(list), [5, 3, 4, 1]);

  // liveQuery() under an id the client holds replaces that query: the server is told to stop
  // the old one's ask, then hears the new one; the old object is done.
  const again = realtime.liveQuery({ id: list.id, model: 'ticket', limit: 1 });
  await server.until(() => received(server, 'query').length === 3);
  const third = wire(server, again);
  assert.equal(list.active, false);
  assert.equal(again.active, true);
  assert.deepEqual(realtime.liveQueries, [again]);
  assert.deepEqual(
    server.connections[0].frames.slice(-2).map((frame) => [frame.type, frame.data.id]),
    [
      ['unquery', second],
      ['query', third],
    ],
  );
  list.stop(); // the old one says nothing more: it is stopped already
  await deliver(server, recorder, [rows(second, [{ id: 7 }]), rows(third, [{ id: 8 }])]);
  assert.equal(received(server, 'unquery').length, 2);
  assert.deepEqual(ids(again), [8]);
  assert.deepEqual(ids(list), [5, 3, 4, 1]);
});

test("replace(): rows sent unasked for the old ask are not the new ask's answer", async () => {
  const { server, realtime, recorder } = await opened();
  const list = realtime.liveQuery({ model: 'ticket', orderBy: ['n'], limit: 3 });
  const seen = heard(list);
  await server.until(() => received(server, 'query').length === 1);
  const old = wire(server, list);
  await deliver(server, recorder, [
    rows(old, [
      { id: 1, n: 1 },
      { id: 2, n: 2 },
    ]),
  ]);
  const [one, two] = list.rows;
  list.replace({ orderBy: ['-n'], limit: 2 });
  await server.until(() => received(server, 'query').length === 2);
  const fresh = wire(server, list);
  assert.notEqual(fresh, old);
  // Before the server reads the new ask, a bulk write folds the old query into a fresh
  // `query.rows`, then a diff of it follows: both are the old query's, reconciled into the
  // rows shown in its order (n ascending) and within its limit (3).
  await deliver(server, recorder, [
    rows(old, [
      { id: 1, n: 1 },
      { id: 2, n: 2 },
      { id: 3, n: 3 },
    ]),
  ]);
  assert.deepEqual(ids(list), [1, 2, 3]);
  assert.ok(list.rows[0] === one && list.rows[1] === two);
  assert.deepEqual(seen.changes.at(-1).entered, [{ id: 3, n: 3 }]);
  await deliver(server, recorder, [diff(old, { enter: [{ id: 0, n: 0 }], leave: [3] })]);
  assert.deepEqual(ids(list), [0, 1, 2]); // not [2, 1]: the new order and limit are not in force
  await deliver(server, recorder, [diff(old, { enter: [{ id: 9, n: 9 }], leave: [0] })]);
  assert.deepEqual(ids(list), [1, 2, 9]);
  assert.equal(list.loaded, true);
  const changes = seen.changes.length;
  // The answer: the new rows, once; from then on the new order and limit.
  await deliver(server, recorder, [
    rows(fresh, [
      { id: 9, n: 9 },
      { id: 2, n: 2 },
    ]),
  ]);
  assert.equal(seen.changes.length, changes + 1);
  assert.deepEqual(seen.changes.at(-1), {
    rows: list.rows,
    type: 'rows',
    entered: [],
    updated: [],
    left: [{ id: 1, n: 1 }],
  });
  assert.deepEqual(ids(list), [9, 2]);
  assert.equal(list.rows[1], two);
  await deliver(server, recorder, [diff(fresh, { enter: [{ id: 5, n: 5 }] })]);
  assert.deepEqual(ids(list), [9, 5]); // -n, and 2 cut by the limit of 2
  // Frames under the old ask's id after that: dropped.
  await deliver(server, recorder, [rows(old, [{ id: 1, n: 1 }]), diff(old, { leave: [9] })]);
  assert.deepEqual(ids(list), [9, 5]);

  // Replaced twice before any answer: the first replacement's frames are no one's either.
  list.replace({ limit: 1 });
  list.replace({ limit: 2, where: { status: 'open' } });
  await server.until(() => received(server, 'query').length === 4);
  const [skipped, last] = wires(server, list).slice(-2);
  assert.deepEqual(
    server.connections[0].frames.slice(-4).map((frame) => [frame.type, frame.data.id]),
    [
      ['unquery', fresh],
      ['query', skipped],
      ['unquery', skipped],
      ['query', last],
    ],
  );
  await deliver(server, recorder, [
    rows(skipped, [{ id: 4, n: 4 }]),
    diff(fresh, { enter: [{ id: 7, n: 7 }] }), // the shown query's, before the server read it
  ]);
  assert.deepEqual(ids(list), [9, 7]);
  await deliver(server, recorder, [rows(last, [{ id: 8, n: 8 }])]);
  assert.deepEqual(ids(list), [8]);
  assert.deepEqual(list.query, {
    id: 'q1',
    model: 'ticket',
    where: { status: 'open' },
    orderBy: ['-n'],
    limit: 2,
  });
});

test("stopped, then asked again under its id: the old query's frames never reach it", async () => {
  const { server, realtime, recorder } = await opened();
  const stopped = realtime.liveQuery({ id: 't', model: 'ticket', orderBy: ['n'] });
  await server.until(() => received(server, 'query').length === 1);
  const old = wire(server, stopped);
  await deliver(server, recorder, [rows(old, [{ id: 1, n: 1 }])]);
  stopped.stop(); // answered before: the server owes it no answer, but may still send rows
  const list = realtime.liveQuery({ id: 't', model: 'ticket', orderBy: ['-n'], limit: 1 });
  const seen = heard(list);
  await server.until(() => received(server, 'query').length === 2);
  const fresh = wire(server, list);
  assert.deepEqual(
    server.connections[0].frames.slice(-2).map((frame) => [frame.type, frame.data.id]),
    [
      ['unquery', old],
      ['query', fresh],
    ],
  );
  // Before the server reads them: a fold of the old query, then a diff of it.
  await deliver(server, recorder, [
    rows(old, [
      { id: 1, n: 1 },
      { id: 2, n: 2 },
    ]),
    diff(old, { enter: [{ id: 3, n: 3 }] }),
  ]);
  assert.deepEqual([list.loaded, list.rows, seen.changes.length], [false, [], 0]);
  assert.deepEqual(ids(stopped), [1]);
  await deliver(server, recorder, [
    rows(fresh, [{ id: 7, n: 7 }]),
    diff(fresh, { enter: [{ id: 8, n: 8 }] }),
  ]);
  assert.equal(list.loaded, true);
  assert.deepEqual(ids(list), [8]); // -n, limit 1
  assert.deepEqual(seen.changes.map((change) => change.rows.map((row) => row.id)), [[7], [8]]);

  // The same when the new query is started under the held id, the old one never stopped.
  const held = realtime.liveQuery({ id: 'u', model: 'ticket', orderBy: ['n'] });
  await server.until(() => received(server, 'query').length === 3);
  const heldWire = wire(server, held);
  await deliver(server, recorder, [rows(heldWire, [{ id: 1, n: 1 }])]);
  const next = realtime.liveQuery({ id: 'u', model: 'ticket', orderBy: ['-n'], limit: 1 });
  const nextSeen = heard(next);
  await server.until(() => received(server, 'query').length === 4);
  const nextWire = wire(server, next);
  assert.deepEqual(received(server, 'unquery').at(-1), { type: 'unquery', data: { id: heldWire } });
  await deliver(server, recorder, [
    rows(heldWire, [
      { id: 1, n: 1 },
      { id: 2, n: 2 },
    ]),
    diff(heldWire, { enter: [{ id: 3, n: 3 }] }),
    { type: 'query.error', data: { id: heldWire, message: 'Too many queries' } },
  ]);
  assert.deepEqual(
    [next.loaded, next.active, next.error, nextSeen.changes.length],
    [false, true, null, 0],
  );
  assert.deepEqual([held.active, ids(held)], [false, [1]]);
  await deliver(server, recorder, [rows(nextWire, [{ id: 5, n: 5 }])]);
  assert.deepEqual([next.loaded, ids(next)], [true, [5]]);
});

test('rows the server sends unasked (a bulk write) are reconciled into the list', async () => {
  const { server, realtime, recorder } = await opened();
  const list = realtime.liveQuery({ model: 'ticket', orderBy: ['-n'], limit: 3 });
  const seen = heard(list);
  await server.until(() => received(server, 'query').length === 1);
  const asked = wire(server, list);
  await deliver(server, recorder, [
    rows(asked, [
      { id: 1, n: 3 },
      { id: 2, n: 2, title: 'b' },
      { id: 3, n: 1 },
    ]),
  ]);
  const [one] = list.rows;
  // A write past REALTIME_BULK_LIMIT: the server sends the whole list again, unasked.
  await deliver(server, recorder, [
    rows(asked, [
      { id: 4, n: 4 },
      { id: 1, n: 3 },
      { id: 2, n: 2, title: 'B' },
    ]),
  ]);
  assert.deepEqual(ids(list), [4, 1, 2]);
  assert.equal(list.rows[1], one);
  assert.deepEqual(seen.changes.at(-1), {
    rows: list.rows,
    type: 'rows',
    entered: [{ id: 4, n: 4 }],
    updated: [{ id: 2, n: 2, title: 'B' }],
    left: [{ id: 3, n: 1 }],
  });
  // Its diffs follow, in the query's order and limit; nothing was asked again.
  await deliver(server, recorder, [diff(asked, { enter: [{ id: 5, n: 3.5 }] })]);
  assert.deepEqual(ids(list), [4, 5, 1]);
  assert.deepEqual(seen.changes.at(-1).left, [{ id: 2, n: 2, title: 'B' }]);
  assert.equal(received(server, 'query').length, 1);
  assert.deepEqual(received(server, 'unquery'), []);
});

test('a refused query: onError and the error event; it stops and is not asked again', async () => {
  const { server, realtime, recorder } = await opened();
  const messages = [];
  const list = realtime.liveQuery(
    { model: 'ticket', where: { secret__icontains: 'x' } },
    { onError: (message) => messages.push(message) },
  );
  const seen = heard(list);
  await server.until(() => received(server, 'query').length === 1);
  const asked = wire(server, list);
  await deliver(server, recorder, [
    { type: 'query.error', data: { id: asked, message: 'Field is not filterable: secret' } },
    rows(asked, [{ id: 1 }]), // after the refusal: dropped
  ]);
  assert.deepEqual(messages, ['Field is not filterable: secret']);
  assert.deepEqual(seen.errors, messages);
  assert.equal(list.error, 'Field is not filterable: secret');
  assert.equal(list.active, false);
  assert.equal(list.loaded, false);
  assert.deepEqual(seen.changes, []);
  assert.deepEqual(realtime.liveQueries, []);
  assert.deepEqual(received(server, 'unquery'), []); // the server holds nothing to stop
  assert.throws(() => list.replace({ where: {} }), /stopped/);

  // A replacement refused: the rows stay. The server was told to stop the query it had before
  // the replacement was sent, so it holds nothing of it after the refusal.
  const other = realtime.liveQuery({ model: 'ticket' });
  await server.until(() => received(server, 'query').length === 2);
  const kept = wire(server, other);
  await deliver(server, recorder, [rows(kept, [{ id: 1 }])]);
  other.replace({ where: { nope__regex: '.' } });
  await server.until(() => received(server, 'query').length === 3);
  assert.deepEqual(received(server, 'unquery'), [{ type: 'unquery', data: { id: kept } }]);
  await deliver(server, recorder, [
    {
      type: 'query.error',
      data: { id: wire(server, other), message: 'Unsupported lookup: regex' },
    },
  ]);
  assert.equal(other.error, 'Unsupported lookup: regex');
  assert.deepEqual(ids(other), [1]);
  await sleep(30);
  assert.deepEqual(received(server, 'unquery'), [{ type: 'unquery', data: { id: kept } }]);

  // Neither is asked on the next connection; the socket itself went on as before.
  server.connections[0].socket.close(1011);
  await recorder.state('open', { from: 2 });
  await sleep(30);
  assert.deepEqual(received(server, 'query', 1), []);
  assert.deepEqual(recorder.stateNames(), ['connecting', 'open', 'reconnecting', 'open']);
});

test('stop() sends unquery once; what the server sends after is dropped', async () => {
  const { server, realtime, recorder } = await opened();
  const list = realtime.liveQuery({ model: 'ticket' });
  const seen = heard(list);
  await server.until(() => received(server, 'query').length === 1);
  const asked = wire(server, list);
  await deliver(server, recorder, [rows(asked, [{ id: 1 }])]);
  const shown = list.rows;
  assert.equal(list.stop(), list);
  list.stop();
  await server.until(() => received(server, 'unquery').length === 1);
  await deliver(server, recorder, [
    diff(asked, { enter: [{ id: 2 }] }),
    rows(asked, [{ id: 3 }]),
    { type: 'query.error', data: { id: asked, message: 'Too many queries' } },
  ]);
  assert.equal(list.rows, shown);
  assert.equal(seen.changes.length, 1);
  assert.deepEqual(seen.errors, []);
  assert.equal(list.active, false);
  assert.equal(list.error, null);
  assert.deepEqual(realtime.liveQueries, []);
  assert.deepEqual(received(server, 'unquery'), [{ type: 'unquery', data: { id: asked } }]);
  // Stopped while away: nothing is sent, and the next socket does not hear of it.
  const away = realtime.liveQuery({ model: 'ticket' });
  await server.until(() => received(server, 'query').length === 2);
  realtime.close();
  away.stop();
  realtime.connect();
  await recorder.state('open', { from: 3 });
  await sleep(30);
  assert.deepEqual(
    server.connections.map((connection) => connection.frames.map((frame) => frame.type)),
    [
      ['authenticate', 'query', 'unquery', 'query'],
      ['authenticate'],
    ],
  );
});

test("a query asked under the id of a stopped one takes none of the old one's frames", async () => {
  const { server, realtime, recorder } = await opened();
  // Stopped before its answer came: the answer, and the diffs after it, are not the next one's.
  const stopped = realtime.liveQuery({ id: 't', model: 'ticket', where: { status: 'open' } });
  stopped.stop();
  const list = realtime.liveQuery({ id: 't', model: 'ticket', where: { status: 'closed' } });
  const seen = heard(list);
  await server.until(() => received(server, 'query').length === 2);
  const [old, asked] = received(server, 'query').map((frame) => frame.data.id);
  assert.deepEqual([old, asked], ['1:t', '2:t']);
  assert.deepEqual(received(server, 'unquery'), [{ type: 'unquery', data: { id: old } }]);
  await deliver(server, recorder, [
    rows(old, [{ id: 1, status: 'open' }]),
    diff(old, { enter: [{ id: 2, status: 'open' }] }),
    rows('t', [{ id: 1, status: 'open' }]), // the application's id is no ask's
  ]);
  assert.deepEqual([list.loaded, seen.changes.length], [false, 0]);
  await deliver(server, recorder, [rows(asked, [{ id: 3, status: 'closed' }])]);
  assert.deepEqual(ids(list), [3]);
  assert.deepEqual(seen.changes.map((change) => change.rows.map((row) => row.id)), [[3]]);

  // Its refusal, the stopped one's, does not stop the next.
  const refused = realtime.liveQuery({ id: 'u', model: 'ticket', where: { title: 'x' } });
  refused.stop();
  const next = realtime.liveQuery({ id: 'u', model: 'ticket' });
  await server.until(() => received(server, 'query').length === 4);
  const [refusedAsk, nextAsk] = wires(server, next); // both under the id 'u'
  await deliver(server, recorder, [
    { type: 'query.error', data: { id: refusedAsk, message: 'Field is not filterable: title' } },
    rows(nextAsk, [{ id: 4 }]),
  ]);
  assert.deepEqual([next.active, next.error, ids(next)], [true, null, [4]]);
  assert.equal(refused.error, null);

  // Refused after a replace() of it was sent: the refusal is of an ask replaced, dropped; the
  // replacement's answer is not the answer of a query started under the id after it.
  const replaced = realtime.liveQuery({ id: 'v', model: 'ticket', where: { title: 'x' } });
  replaced.replace({ where: { status: 'open' } });
  await server.until(() => received(server, 'query').length === 6);
  const [replacedAsk, replacement] = wires(server, replaced);
  await deliver(server, recorder, [
    { type: 'query.error', data: { id: replacedAsk, message: 'Field is not filterable: title' } },
  ]);
  assert.deepEqual([replaced.active, replaced.error], [true, null]);
  const after = realtime.liveQuery({ id: 'v', model: 'ticket', where: { status: 'closed' } });
  const afterSeen = heard(after);
  await server.until(() => received(server, 'query').length === 7);
  assert.equal(replaced.active, false);
  await deliver(server, recorder, [
    rows(replacement, [{ id: 5, status: 'open' }]),
    rows(wire(server, after), [{ id: 6, status: 'closed' }]),
  ]);
  assert.deepEqual(afterSeen.changes.map((change) => change.rows.map((row) => row.id)), [[6]]);
});

test('the asks of a socket gone are not awaited on the next socket', async () => {
  const { server, realtime, recorder } = await opened();
  const stopped = realtime.liveQuery({ id: 't', model: 'ticket' });
  await server.until(() => received(server, 'query').length === 1);
  stopped.stop(); // its answer never comes: the socket drops first
  server.connections[0].socket.close(1011);
  await recorder.state('open', { from: 2 });
  const list = realtime.liveQuery({ id: 't', model: 'ticket' });
  await server.until(() => received(server, 'query', 1).length === 1);
  await deliver(server, recorder, [rows(wire(server, list, 1), [{ id: 1 }])], 1);
  assert.deepEqual([list.loaded, ids(list)], [true, [1]]);
});

test('after a reconnect each query is asked again; unchanged rows keep their objects', async () => {
  const { server, realtime, recorder } = await opened();
  realtime.subscribe('ticket');
  const tickets = realtime.liveQuery({ id: 'tickets', model: 'ticket', orderBy: ['-n'] });
  const companies = realtime.liveQuery({ id: 'companies', model: 'company' });
  const seen = heard(tickets);
  const quiet = heard(companies);
  await server.until(() => received(server, 'query').length === 2);
  await deliver(server, recorder, [
    rows('1:tickets', [
      { id: 1, n: 9, title: 'kept' },
      { id: 2, n: 8, title: 'changes' },
      { id: 3, n: 7, title: 'goes' },
    ]),
    rows('2:companies', [{ id: 1, name: 'Acme' }]),
  ]);
  const [kept, changes] = tickets.rows;
  const shown = tickets.rows;
  const companyRows = companies.rows;
  server.connections[0].socket.close(1011);
  await recorder.state('open', { from: 2 });
  await server.until(() => received(server, 'query', 1).length === 2);
  // The channels first, then each query as it was asked, under fresh ids: no unquery, as the
  // new socket holds nothing.
  assert.deepEqual(server.connections[1].frames.slice(1), [
    { type: 'subscribe', data: { channels: ['ticket'] } },
    { type: 'query', data: { id: '3:tickets', model: 'ticket', where: {}, order_by: ['-n'] } },
    { type: 'query', data: { id: '4:companies', model: 'company', where: {} } },
  ]);
  // Until the new rows come, the old ones are shown; the old socket's ids are dead.
  await deliver(server, recorder, [diff('1:tickets', { enter: [{ id: 9, n: 1 }] })], 1);
  assert.equal(tickets.rows, shown);
  assert.equal(seen.changes.length, 1);
  await deliver(
    server,
    recorder,
    [
      rows('3:tickets', [
        { id: 4, n: 10, title: 'new' },
        { id: 1, n: 9, title: 'kept' },
        { id: 2, n: 8, title: 'changed' },
      ]),
      rows('4:companies', [{ id: 1, name: 'Acme' }]),
    ],
    1,
  );
  assert.deepEqual(ids(tickets), [4, 1, 2]);
  assert.equal(tickets.rows[1], kept);
  assert.notEqual(tickets.rows[2], changes);
  assert.deepEqual(seen.changes.at(-1), {
    rows: tickets.rows,
    type: 'rows',
    entered: [{ id: 4, n: 10, title: 'new' }],
    updated: [{ id: 2, n: 8, title: 'changed' }],
    left: [{ id: 3, n: 7, title: 'goes' }],
  });
  assert.equal(seen.changes.length, 2);
  // Nothing changed: the same array, the same rows, no change event.
  assert.equal(companies.rows, companyRows);
  assert.equal(quiet.changes.length, 1);
  // Frames of the new socket's diffs apply as before.
  await deliver(server, recorder, [diff('3:tickets', { enter: [{ id: 5, n: 8.5 }] })], 1);
  assert.deepEqual(ids(tickets), [4, 1, 5, 2]);
});

test('after a resumed handshake the queries are asked again too', async () => {
  const server = await scripted((connection, count) => ({
    type: 'auth_success',
    data: { user_id: 1, scope: null, scopes: [], cursor: `c${count}`, resumed: count > 1 },
  }));
  const realtime = client({ url: server.url });
  const recorder = new Recorder(realtime);
  realtime.subscribe('ticket');
  const list = realtime.liveQuery({ id: 'open', model: 'ticket' });
  realtime.connect();
  await recorder.state('open');
  server.connections[0].socket.close(1011);
  await recorder.state('open', { from: 2 });
  await server.until(() => server.connections[1].frames.length === 2);
  server.connections.forEach(({ frames }, index) => {
    assert.deepEqual(frames, [
      {
        type: 'authenticate',
        data: { token: 'token', scope: null, resume: frames[0].data.resume, channels: ['ticket'] },
      },
      { type: 'query', data: { id: `${index + 1}:${list.id}`, model: 'ticket', where: {} } },
    ]);
  });
});

test('a watch sends no query: the rows the server sends again are reconciled', async () => {
  const { server, realtime, recorder } = await opened({ scope: 'acme' });
  realtime.subscribe('ticket');
  const list = realtime.liveQuery({ model: 'ticket' });
  const seen = heard(list);
  await server.until(() => received(server, 'query').length === 1);
  await deliver(server, recorder, [rows(wire(server, list), [{ id: 1 }, { id: 2, n: 1 }])]);
  const [one] = list.rows;
  realtime.watch({ scope: 'beta' });
  await server.until(() => received(server, 'watch').length === 1);
  // The server reads the queries again itself, and sends their rows unasked.
  await deliver(server, recorder, [rows(wire(server, list), [{ id: 1 }, { id: 3 }])]);
  assert.deepEqual(ids(list), [1, 3]);
  assert.equal(list.rows[0], one);
  assert.deepEqual(seen.changes.at(-1).left, [{ id: 2, n: 1 }]);
  assert.deepEqual(received(server, 'query').length, 1);
  assert.deepEqual(server.connections[0].frames.slice(-2), [
    { type: 'watch', data: { scope: 'beta' } },
    { type: 'subscribe', data: { channels: ['ticket'] } },
  ]);
});

test('a client that asks no live query sends nothing new; query.* frames are events', async () => {
  const { server, realtime, recorder } = await opened({ scope: 'acme' });
  realtime.subscribe('ticket');
  await server.until(() => server.connections[0].frames.length === 2);
  realtime.watch({ scope: 'beta' });
  await server.until(() => server.connections[0].frames.length === 4);
  const frame = { type: 'query.rows', data: { id: 'q1', rows: [] } };
  await deliver(server, recorder, [frame]);
  assert.deepEqual(recorder.events[0], frame); // an application's event, as before
  server.connections[0].socket.close(1011);
  await recorder.state('open', { from: 2 });
  await sleep(30);
  assert.deepEqual(
    server.connections.map((connection) => connection.frames.map((f) => f.type)),
    [['authenticate', 'subscribe', 'watch', 'subscribe'], ['authenticate', 'subscribe']],
  );
  assert.deepEqual(realtime.liveQueries, []);
});

test('what liveQuery() checks before sending anything', async () => {
  const { server, realtime } = await opened({ maxFrameSize: 200 });
  assert.throws(() => realtime.liveQuery({}), { name: 'TypeError', message: /model/ });
  assert.throws(() => realtime.liveQuery({ model: '' }), /model/);
  assert.throws(() => realtime.liveQuery({ model: 't', id: '' }), /id/);
  assert.throws(() => realtime.liveQuery({ model: 't', id: 'x'.repeat(65) }), /id/);
  assert.throws(() => realtime.liveQuery({ model: 't', id: 7 }), /id/);
  assert.throws(() => realtime.liveQuery({ model: 't', where: [] }), /where/);
  assert.throws(() => realtime.liveQuery({ model: 't', orderBy: 'name' }), /orderBy/);
  assert.throws(() => realtime.liveQuery({ model: 't', limit: 2.5 }), /limit/);
  assert.throws(() => realtime.liveQuery({ model: 't', limit: 0 }), /limit/);
  assert.throws(() => realtime.liveQuery({ model: 't', where: { name: 'x'.repeat(200) } }), {
    name: 'RangeError',
    message: /maxFrameSize/,
  });
  // An id up to 64 characters; made ids skip those given.
  const long = realtime.liveQuery({ model: 't', id: 'x'.repeat(64) });
  const given = realtime.liveQuery({ model: 't', id: 'q1' });
  const made = realtime.liveQuery({ model: 't' });
  assert.deepEqual([long.id.length, given.id, made.id], [64, 'q1', 'q2']);
  assert.throws(() => made.replace({ limit: -1 }), /limit/);
  assert.deepEqual(made.replace({ limit: 5 }).replace({ limit: null }).query, {
    id: 'q2',
    model: 't',
    where: {},
  });
  await server.until(() => received(server, 'query').length === 5);
  // On the wire each ask has an id of its own, `<n>:<id>`, cut to 64 characters.
  assert.deepEqual(
    received(server, 'query').map((frame) => frame.data.id),
    [`1:${'x'.repeat(62)}`, '2:q1', '3:q2', '4:q2', '5:q2'],
  );
  // The frame's size is measured under the longest wire id the query may go under.
  const frame = (id, name) =>
    JSON.stringify({ type: 'query', data: { id, model: 't', where: { name } } }).length;
  const fits = 200 - frame('q9', ''); // under the application's id alone, it would fit
  const named = (length) => ({ model: 't', id: 'q9', where: { name: 'x'.repeat(length) } });
  assert.throws(() => realtime.liveQuery(named(fits)), { name: 'RangeError' });
  realtime.liveQuery(named(200 - frame(`${Number.MAX_SAFE_INTEGER}:q9`, '')));
  // An id cut to 64 characters is never cut inside a character.
  realtime.liveQuery({ model: 't', id: `${'y'.repeat(61)}\u{1F600}` });
  await server.until(() => received(server, 'query').length === 7);
  assert.equal(received(server, 'query').at(-1).data.id, `7:${'y'.repeat(61)}`);
});
