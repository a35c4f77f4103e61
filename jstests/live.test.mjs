// The client against real daphne servers serving tests.asgi:application, with writes made
// by another process (jstests/fixtures.py).

import assert from 'node:assert/strict';
import { after, afterEach, before, describe, test } from 'node:test';
import WebSocket from 'ws';

import { RealtimeClient } from '../realtime/static/realtime/realtime.js';
import { Live, Recorder, WAIT, countingWebSocket, sleep } from './harness.mjs';

const TOKEN_REFUSAL = 'Invalid authentication token';

let live;
let main; // the server most tests share
let opened = [];

/** A client on `server` (ws as its WebSocket), closed after the test. */
function client(server, options = {}) {
  const made = new RealtimeClient({ url: server.url, WebSocket, ...options });
  opened.push(made);
  return made;
}

/** Wait until the server holds a socket of `userId` subscribed to `channel`. */
function subscribed(server, userId, channel) {
  return server.waitForState((state) =>
    state.sockets.some((socket) => socket.user_id === userId && socket.channels.includes(channel)),
  );
}

/**
 * A `ws` WebSocket that calls `hook()` just before the client reads `auth_success`: the socket
 * is open and `authenticate` has left, so what `hook` changes falls inside the handshake.
 */
function duringHandshake(hook) {
  return class extends WebSocket {
    get onmessage() {
      return super.onmessage;
    }

    set onmessage(handler) {
      super.onmessage = handler && ((event) => {
        if (JSON.parse(String(event.data)).type === 'auth_success') hook();
        handler(event);
      });
    }
  };
}

before(async () => {
  live = await new Live().start();
  main = await live.server();
});

after(async () => {
  await live?.stop();
});

afterEach(() => {
  for (const made of opened) made.close();
  opened = [];
});

describe('connecting', () => {
  test('authenticates, subscribes and hears a write made by another process', async () => {
    const ann = await live.fixture('user', 'ann', 'acme');
    const realtime = client(main, { token: ann.token, scope: 'acme' });
    const recorder = new Recorder(realtime);
    const named = [];
    realtime.addEventListener('contact.created', (event) => named.push(event.detail));
    realtime.subscribe('contact');
    realtime.connect();

    await recorder.state('open');
    const { cursor, ...session } = realtime.session;
    assert.deepEqual(session, { user_id: ann.id, scope: 'acme', scopes: ['acme'] });
    assert.equal(typeof cursor, 'string'); // the client resumes by default
    await subscribed(main, ann.id, 'contact');
    const { id } = await live.fixture('contact', 'acme', 'Zed');
    const frame = await recorder.event((f) => f.type === 'contact.created' && f.data.id === id);

    assert.deepEqual(frame, {
      type: 'contact.created',
      data: { model: 'contact', id, name: 'Zed', company: null, born: null, score: null },
      scope_id: ann.scopes.acme,
      cursor: realtime.cursor, // the cursor of the last frame handled
    });
    assert.notEqual(frame.cursor, cursor);
    assert.deepEqual(named, [frame]);
    assert.deepEqual(recorder.stateNames(), ['connecting', 'open']);
  });

  test('a watch moves to other scopes and says the channels again', async () => {
    const dan = await live.fixture('user', 'dan', 'acme', 'beta');
    const realtime = client(main, { token: dan.token, scopes: ['acme'] });
    const recorder = new Recorder(realtime);
    realtime.subscribe('contact', 'company');
    realtime.connect();
    await recorder.state('open');
    await subscribed(main, dan.id, 'company');

    realtime.watch({ scope: 'beta' });
    await main.waitForState((state) =>
      state.sockets.some(
        (socket) =>
          socket.user_id === dan.id &&
          socket.slugs.join() === 'beta' &&
          socket.channels.join() === 'company,contact',
      ),
    );
    const { id } = await live.fixture('contact', 'beta', 'In beta');
    const frame = await recorder.event((f) => f.data?.id === id);
    assert.equal(frame.scope_id, dan.scopes.beta);

    realtime.watch({ scopes: ['acme', 'beta'] });
    await main.waitForState((state) =>
      state.sockets.some(
        (socket) =>
          socket.user_id === dan.id &&
          socket.slugs.join() === 'acme,beta' &&
          socket.channels.join() === 'company,contact',
      ),
    );
    assert.deepEqual(realtime.watching, { scopes: ['acme', 'beta'] });
  });

  test('unsubscribing stops the events of that channel', async () => {
    const eve = await live.fixture('user', 'eve', 'acme');
    const realtime = client(main, { token: eve.token, scope: 'acme' });
    const recorder = new Recorder(realtime);
    realtime.subscribe(['contact', 'company']);
    realtime.connect();
    await recorder.state('open');
    await subscribed(main, eve.id, 'company');

    realtime.unsubscribe('contact');
    await main.waitForState((state) =>
      state.sockets.some((s) => s.user_id === eve.id && s.channels.join() === 'company'),
    );
    const { id } = await live.fixture('contact', 'acme', 'Unheard');
    await live.fixture('publish', 'acme', 'test.marker', '{}');
    await recorder.event((f) => f.type === 'test.marker');
    assert.equal(recorder.events.filter((f) => f.data?.id === id).length, 0);
    assert.deepEqual(realtime.channels, ['company']);
  });
  test('channels changed during the handshake are said once it succeeds', async () => {
    const fay = await live.fixture('user', 'fay', 'acme');
    const realtime = client(main, {
      token: fay.token,
      scope: 'acme',
      WebSocket: duringHandshake(() => realtime.subscribe('contact').unsubscribe('company')),
    });
    const recorder = new Recorder(realtime);
    realtime.subscribe('company');
    realtime.connect();
    await recorder.state('open');

    // authenticate carried `company`; the server hears it dropped and `contact` added.
    await main.waitForState((state) =>
      state.sockets.some((s) => s.user_id === fay.id && s.channels.join() === 'contact'),
    );
    const { id } = await live.fixture('contact', 'acme', 'Heard after the handshake');
    await recorder.event((f) => f.type === 'contact.created' && f.data.id === id);
  });

  test('a watch during the handshake is sent, with the channels, once it succeeds', async () => {
    const gus = await live.fixture('user', 'gus', 'acme', 'beta');
    const realtime = client(main, {
      token: gus.token,
      scope: 'acme',
      // A scope added, none left: a recheck its new memberships asked for may run beside the
      // watch, and could keep the scope it leaves.
      WebSocket: duringHandshake(() => realtime.watch({ scopes: ['acme', 'beta'] })),
    });
    const recorder = new Recorder(realtime);
    realtime.subscribe('contact');
    realtime.connect();
    await recorder.state('open');

    await main.waitForState((state) =>
      state.sockets.some(
        (s) =>
          s.user_id === gus.id &&
          s.slugs.toSorted().join() === 'acme,beta' &&
          s.channels.join() === 'contact',
      ),
    );
    const { id } = await live.fixture('contact', 'beta', 'In the scope watched');
    const frame = await recorder.event((f) => f.data?.id === id);
    assert.equal(frame.scope_id, gus.scopes.beta);
  });

  test('a watch right after auth_success is never undone by a recheck beside it', async () => {
    // The account's new memberships ask for a recheck of its sockets, which holds their
    // frames until it answers. One that read the socket's scopes while its watch was being
    // resolved gave back the scope the watch left, about one try in four: sixteen tries,
    // each looked at once the watch is applied and nothing is held any more.
    for (let attempt = 0; attempt < 16; attempt += 1) {
      const mover = await live.fixture('user', `mover${attempt}`, 'ra', 'rb');
      const realtime = client(main, { token: mover.token, scope: 'ra' });
      const recorder = new Recorder(realtime);
      realtime.addEventListener('auth_success', () => realtime.watch({ scope: 'rb' }));
      realtime.connect();
      await recorder.state('open');
      const state = await main.waitForState((now) =>
        now.sockets.some(
          (s) => s.user_id === mover.id && s.held === null && s.slugs.includes('rb'),
        ),
      );
      const socket = state.sockets.find((s) => s.user_id === mover.id);
      assert.equal(socket.slugs.join(), 'rb', `try ${attempt}`);
      realtime.close();
    }
  });

  test('an unsubscribe followed by a watch of the same scope in one task still leaves', async () => {
    const hub = await live.fixture('user', 'hub', 'acme');
    const realtime = client(main, { token: hub.token, scope: 'acme' });
    const recorder = new Recorder(realtime);
    realtime.subscribe('contact', 'company');
    realtime.connect();
    await recorder.state('open');
    await subscribed(main, hub.id, 'company');

    realtime.unsubscribe('contact');
    realtime.watch({ scope: 'acme' }); // the same scope: the server keeps its subscriptions
    await main.waitForState((state) =>
      state.sockets.some((s) => s.user_id === hub.id && s.channels.join() === 'company'),
    );
    const { id } = await live.fixture('contact', 'acme', 'Unheard after the watch');
    await live.fixture('publish', 'acme', 'test.marker', '{}');
    await recorder.event((f) => f.type === 'test.marker');
    assert.equal(recorder.events.filter((f) => f.data?.id === id).length, 0);
  });
});

describe('reconnecting', () => {
  test('a restarted server gets the channels again; backoff starts over after', async () => {
    const fay = await live.fixture('user', 'fay', 'acme');
    const server = await live.server();
    const realtime = client(server, {
      token: fay.token,
      scope: 'acme',
      backoffStart: 50,
      backoffMax: 400,
      jitter: 0, // the exact doubling is what is checked
    });
    const recorder = new Recorder(realtime);
    realtime.subscribe('contact');
    realtime.connect();
    await recorder.state('open');
    await subscribed(server, fay.id, 'contact');

    const down = recorder.states.length;
    await server.kill();
    await recorder.until(
      () => recorder.states.slice(down).filter((d) => d.state === 'reconnecting').length >= 3,
      undefined,
      'three attempts',
    );
    const delays = recorder.states.slice(down).map((d) => d.delay);
    assert.deepEqual(delays.slice(0, 3), [50, 100, 200]);
    assert.equal(recorder.states[down].code, 1006);

    const back = recorder.states.length;
    await server.start();
    await recorder.state('open', { from: back });
    await subscribed(server, fay.id, 'contact');
    const { id } = await live.fixture('contact', 'acme', 'After the restart');
    await recorder.event((f) => f.type === 'contact.created' && f.data.id === id);

    const again = recorder.states.length;
    await server.kill();
    const first = await recorder.state('reconnecting', { from: again });
    assert.equal(first.delay, 50);
    assert.equal(first.attempt, 1);
    await server.start();
    await recorder.state('open', { from: again });
  });

  test('closed 1008 by the frame limit (no auth_error): reconnects', async () => {
    const gus = await live.fixture('user', 'gus', 'acme');
    const server = await live.server({ REALTIME_FRAME_LIMIT: 3 });
    const realtime = client(server, {
      token: gus.token,
      scope: 'acme',
      heartbeatInterval: 100, // the fourth heartbeat is one frame too many
      backoffStart: 50,
    });
    const recorder = new Recorder(realtime);
    realtime.connect();
    await recorder.state('open');
    const dropped = await recorder.state('reconnecting');
    assert.equal(dropped.code, 1008);
    assert.equal(dropped.reason, null);
    await recorder.state('open', { from: recorder.states.indexOf(dropped) });
    assert.ok(!recorder.stateNames().includes('refused'));
  });

  test('channels are split to fit the frame size; a frame too big is closed 1009', async () => {
    const hal = await live.fixture('user', 'hal', 'acme');
    const server = await live.server({ REALTIME_MAX_FRAME_SIZE: 300 });
    const channels = Array.from({ length: 60 }, (_, i) => `contact:${i + 1}`);

    const fitting = client(server, { token: hal.token, scope: 'acme', maxFrameSize: 300 });
    const fits = new Recorder(fitting);
    fitting.subscribe(channels);
    fitting.connect();
    await fits.state('open');
    await server.waitForState((state) =>
      state.sockets.some((s) => s.user_id === hal.id && s.channels.length === 60),
    );
    await sleep(100);
    assert.deepEqual(fits.stateNames(), ['connecting', 'open']);
    fitting.close();

    const options = { token: hal.token, scope: 'acme', backoffStart: 50, resume: false };
    const oversize = client(server, options);
    const over = new Recorder(oversize);
    oversize.subscribe(channels);
    oversize.connect();
    const dropped = await over.state('reconnecting');
    assert.equal(dropped.code, 1009);
    assert.deepEqual(over.stateNames().slice(0, 2), ['connecting', 'open']);

    // Resuming, the channels ride in authenticate: a first frame over the limit is refused.
    const resuming = client(server, { ...options, resume: true });
    const refused = new Recorder(resuming);
    resuming.subscribe(channels);
    resuming.connect();
    assert.equal((await refused.state('refused')).reason, 'Invalid authentication format');
  });
});

describe('resuming', () => {
  /** A client of `user` reading acme's contacts; open, with one contact heard. */
  async function listening(server, user, options = {}) {
    const realtime = client(server, {
      token: user.token,
      scope: 'acme',
      backoffStart: 50,
      backoffMax: 200,
      ...options,
    });
    const recorder = new Recorder(realtime);
    realtime.subscribe('contact');
    realtime.connect();
    const opened = await recorder.state('open');
    assert.equal(opened.resumed, false); // nothing to resume the first time
    const { id } = await live.fixture('contact', 'acme', `${user.id} first`);
    await recorder.event((f) => f.type === 'contact.created' && f.data.id === id);
    return { realtime, recorder };
  }

  /** Stop the server, write two contacts while the client reconnects, start it again: the
   * state the client reports once it is open again. */
  async function missTwoWhileDown(server, recorder) {
    const down = recorder.states.length;
    await server.kill();
    await recorder.state('reconnecting', { from: down });
    await live.fixture('contact', 'acme', 'missed 1');
    await live.fixture('contact', 'acme', 'missed 2');
    await server.start();
    return recorder.state('open', { from: down });
  }

  const names = (recorder) =>
    recorder.events.filter((f) => f.type === 'contact.created').map((f) => f.data.name);

  test('writes made while the server was down are heard once after its restart', async () => {
    const hal = await live.fixture('user', 'hal', 'acme');
    const server = await live.server();
    const { realtime, recorder } = await listening(server, hal);

    const back = await missTwoWhileDown(server, recorder);
    assert.equal(back.resumed, true);
    assert.equal(realtime.resumed, true);
    const { id } = await live.fixture('contact', 'acme', 'live');
    await recorder.event((f) => f.data?.id === id);

    assert.deepEqual(names(recorder), [`${hal.id} first`, 'missed 1', 'missed 2', 'live']);
    const cursors = recorder.events.map((f) => f.cursor);
    assert.ok(cursors.every((c) => typeof c === 'string'));
    assert.equal(realtime.cursor, cursors.at(-1));
  });

  test('too much missed: told to read again, then hears the live stream', async () => {
    const ivy = await live.fixture('user', 'ivy', 'acme');
    const server = await live.server({ REALTIME_RESUME_MAX_FRAMES: 1 });
    const { realtime, recorder } = await listening(server, ivy);

    const back = await missTwoWhileDown(server, recorder);
    assert.equal(back.resumed, false);
    assert.equal(realtime.resumed, false);
    const { id } = await live.fixture('contact', 'acme', 'live');
    await recorder.event((f) => f.data?.id === id);

    assert.deepEqual(names(recorder), [`${ivy.id} first`, 'live']);
  });

  test('with resume off, the plain protocol: subscribes after auth_success, no cursor', async () => {
    const jay = await live.fixture('user', 'jay', 'acme');
    const server = await live.server();
    const { realtime, recorder } = await listening(server, jay, { resume: false });

    assert.equal(realtime.session.cursor, undefined);
    assert.ok(recorder.events.every((f) => !('cursor' in f)));
  });
});

describe('refusals', () => {
  test('a refused token is refreshed once, then the client gets in', async () => {
    const ivy = await live.fixture('user', 'ivy', 'acme');
    let refreshed = 0;
    const realtime = client(main, {
      token: 'not-a-token',
      scope: 'acme',
      refreshToken: async () => {
        refreshed += 1;
        return (await live.fixture('token', 'ivy')).token;
      },
    });
    const recorder = new Recorder(realtime);
    realtime.subscribe('contact');
    realtime.connect();
    await recorder.state('open');
    assert.equal(refreshed, 1);
    assert.deepEqual(recorder.stateNames(), ['connecting', 'reconnecting', 'open']);
    assert.equal(recorder.states[1].reason, TOKEN_REFUSAL);
    assert.equal(recorder.states[1].delay, 0);
    await subscribed(main, ivy.id, 'contact');
  });

  test('a token refused again after its refresh: refused, no more attempts', async () => {
    const Counting = countingWebSocket(WebSocket);
    let refreshed = 0;
    const realtime = client(main, {
      token: 'not-a-token',
      scope: 'acme',
      WebSocket: Counting,
      backoffStart: 20,
      refreshToken: () => {
        refreshed += 1;
        return 'still-not-a-token';
      },
    });
    const recorder = new Recorder(realtime);
    realtime.connect();
    const refused = await recorder.state('refused');
    assert.equal(refused.reason, TOKEN_REFUSAL);
    assert.equal(realtime.reason, TOKEN_REFUSAL);
    await sleep(300);
    assert.equal(refreshed, 1);
    assert.equal(Counting.opened, 2);
    assert.deepEqual(recorder.stateNames(), ['connecting', 'reconnecting', 'refused']);
  });

  test('Scope not found: refused at once, the token is not refreshed', async () => {
    const jim = await live.fixture('user', 'jim', 'acme');
    const Counting = countingWebSocket(WebSocket);
    let refreshed = 0;
    const realtime = client(main, {
      token: jim.token,
      scope: 'nowhere',
      WebSocket: Counting,
      backoffStart: 20,
      refreshToken: () => {
        refreshed += 1;
        return jim.token;
      },
    });
    const recorder = new Recorder(realtime);
    realtime.connect();
    const refused = await recorder.state('refused');
    assert.equal(refused.reason, 'Scope not found');
    await sleep(300);
    assert.equal(refreshed, 0);
    assert.equal(Counting.opened, 1);
    assert.deepEqual(recorder.stateNames(), ['connecting', 'refused']);
  });

  test('Too many connections: refused without retrying', async () => {
    const kim = await live.fixture('user', 'kim', 'acme');
    const server = await live.server({ REALTIME_MAX_SOCKETS_PER_USER: 1 });
    const first = client(server, { token: kim.token, scope: 'acme' });
    const firstRecorder = new Recorder(first);
    first.connect();
    await firstRecorder.state('open');

    const Counting = countingWebSocket(WebSocket);
    const second = client(server, {
      token: kim.token,
      scope: 'acme',
      WebSocket: Counting,
      backoffStart: 20,
    });
    const recorder = new Recorder(second);
    second.connect();
    assert.equal((await recorder.state('refused')).reason, 'Too many connections');
    await sleep(300);
    assert.equal(Counting.opened, 1);
    assert.equal(first.state, 'open');
  });

  test('a recheck refusing the token: refreshed, reconnected, resubscribed', async () => {
    const lea = await live.fixture('user', 'lea', 'acme');
    let refreshed = 0;
    const realtime = client(main, {
      token: lea.token,
      scope: 'acme',
      refreshToken: async () => {
        refreshed += 1;
        return (await live.fixture('token', 'lea2')).token;
      },
    });
    const recorder = new Recorder(realtime);
    realtime.subscribe('contact');
    realtime.connect();
    await recorder.state('open');
    await subscribed(main, lea.id, 'contact');

    await live.fixture('rename', 'lea', 'lea2'); // her tokens stop standing for her: rechecked
    const again = await recorder.state('reconnecting');
    assert.equal(again.reason, TOKEN_REFUSAL);
    await recorder.state('open', { from: recorder.states.indexOf(again) });
    assert.equal(refreshed, 1);
    await subscribed(main, lea.id, 'contact');
    const { id } = await live.fixture('contact', 'acme', 'Heard after the refresh');
    await recorder.event((f) => f.type === 'contact.created' && f.data.id === id);
  });
  test('a recheck refusing the token of a getToken client: it asks getToken again, and gets in', async () => {
    const max = await live.fixture('user', 'max', 'acme');
    let name = 'max';
    let asked = 0;
    // As {% realtime_script %} builds its client: getToken alone, no refreshToken.
    const realtime = client(main, {
      scope: 'acme',
      getToken: async () => {
        asked += 1;
        return (await live.fixture('token', name)).token;
      },
    });
    const recorder = new Recorder(realtime);
    realtime.subscribe('contact');
    realtime.connect();
    await recorder.state('open');
    await subscribed(main, max.id, 'contact');

    await live.fixture('rename', 'max', 'max2'); // his tokens stop standing for him: rechecked
    name = 'max2';
    const again = await recorder.state('reconnecting');
    assert.equal(again.reason, TOKEN_REFUSAL);
    await recorder.state('open', { from: recorder.states.indexOf(again) });
    assert.equal(asked, 2);
    await subscribed(main, max.id, 'contact');
    const { id } = await live.fixture('contact', 'acme', 'Heard with the fresh token');
    await recorder.event((f) => f.type === 'contact.created' && f.data.id === id);
  });
});

describe('recognising its own writes', () => {
  test('the echo of a stamped request is dropped once; other origins are delivered', async () => {
    const max = await live.fixture('user', 'max', 'acme');
    const realtime = client(main, { token: max.token, scope: 'acme' });
    const recorder = new Recorder(realtime);
    realtime.subscribe('contact');
    realtime.connect();
    await recorder.state('open');
    await subscribed(main, max.id, 'contact');

    const init = realtime.stamp({ method: 'POST' });
    const stamp = init.headers.get('X-Origin-Id');
    assert.match(stamp, new RegExp(`^${realtime.origin}\\.\\d+$`));

    const mine = await live.fixture('contact', 'acme', 'Mine', stamp);
    const theirs = await live.fixture('contact', 'acme', 'Theirs', 'another-tab.1');
    const plain = await live.fixture('contact', 'acme', 'Plain');
    await recorder.event((f) => f.data?.id === plain.id);
    assert.deepEqual(
      recorder.events.map((f) => [f.data.id, f.origin]),
      [
        [theirs.id, 'another-tab.1'],
        [plain.id, undefined],
      ],
    );
    assert.ok(!recorder.events.some((f) => f.data.id === mine.id));

    // The stamp was forgotten with its echo: the next frame carrying it is news.
    const again = await live.fixture('contact', 'acme', 'Mine again', stamp);
    const frame = await recorder.event((f) => f.data?.id === again.id);
    assert.equal(frame.origin, stamp);
  });

  test('broadcasts carrying a remembered origin: dropped once, then delivered', async () => {
    const ned = await live.fixture('user', 'ned', 'acme');
    const realtime = client(main, { token: ned.token, scope: 'acme' });
    const recorder = new Recorder(realtime);
    const named = [];
    realtime.addEventListener('report.ready', (event) => named.push(event.detail));
    realtime.connect();
    await recorder.state('open');
    await main.waitForState((state) => state.sockets.some((s) => s.user_id === ned.id));

    const stamp = realtime.remember(realtime.nextOrigin());
    await live.fixture('publish', 'acme', 'report.ready', '{"n": 1}', stamp);
    await live.fixture('publish', 'acme', 'report.ready', '{"n": 2}', stamp);
    await live.fixture('publish', 'acme', 'report.ready', '{"n": 3}', 'someone-else.4');
    await recorder.event((f) => f.data?.n === 3);
    assert.deepEqual(
      named.map((f) => [f.data.n, f.origin]),
      [
        [2, stamp],
        [3, 'someone-else.4'],
      ],
    );
  });

  test("a stamp remembered with its record lets the request's other writes through", async () => {
    const oz = await live.fixture('user', 'oz', 'acme');
    const realtime = client(main, { token: oz.token, scope: 'acme' });
    const recorder = new Recorder(realtime);
    realtime.subscribe('contact');
    realtime.connect();
    await recorder.state('open');
    await subscribed(main, oz.id, 'contact');

    const init = realtime.stamp({}, { model: 'contact' });
    const stamp = init.headers.get('X-Origin-Id');
    // The same request also announced something else first (a signal's write, say).
    await live.fixture('publish', 'acme', 'report.ready', '{"n": 1}', stamp);
    const mine = await live.fixture('contact', 'acme', 'Mine', stamp);
    await live.fixture('publish', 'acme', 'test.marker', '{}');
    await recorder.event((f) => f.type === 'test.marker');
    assert.deepEqual(
      recorder.events.map((f) => f.type),
      ['report.ready', 'test.marker'],
    );
    assert.ok(!recorder.events.some((f) => f.data?.id === mine.id));
  });
});

describe('live queries', () => {
  /** Wait until `predicate(list)` holds, checked at each change or refusal of the live query. */
  function settled(list, predicate, what) {
    return new Promise((done, fail) => {
      const check = () => {
        if (!predicate(list)) return;
        finish();
        done(list.rows);
      };
      const timer = setTimeout(() => {
        finish();
        fail(new Error(`timed out waiting for ${what}; rows ${JSON.stringify(list.rows)}`));
      }, WAIT);
      const finish = () => {
        clearTimeout(timer);
        list.removeEventListener('change', check);
        list.removeEventListener('error', check);
      };
      list.addEventListener('change', check);
      list.addEventListener('error', check);
      check();
    });
  }

  /** Wait until the list's ids are `expected`, in that order. */
  const showing = (list, expected) =>
    settled(
      list,
      (l) => JSON.stringify(l.rows.map((row) => row.id)) === JSON.stringify(expected),
      `ids ${JSON.stringify(expected)}`,
    );

  /** A case in workspace `slug` with these fields: its id. */
  async function makeCase(slug, fields) {
    return (await live.fixture('case', slug, JSON.stringify(fields))).id;
  }

  test('rows enter, change and leave as another process writes; a fresh query agrees', async () => {
    const gil = await live.fixture('user', 'gil', 'cases');
    const a = await makeCase('cases', { title: 'a', priority: 1 });
    const b = await makeCase('cases', { title: 'b', priority: 5 });
    const c = await makeCase('cases', { title: 'c', priority: 3, status: 'closed' });
    const realtime = client(main, { token: gil.token, scope: 'cases' });
    const ask = { model: 'case', where: { status: 'open' }, orderBy: ['-priority'], limit: 2 };
    const list = realtime.liveQuery(ask);
    realtime.connect();
    await settled(list, (l) => l.loaded, 'the rows');
    assert.deepEqual(list.rows, [
      {
        model: 'case',
        id: b,
        title: 'b',
        status: 'open',
        priority: 5,
        company: null,
        assignee: null,
        due: null,
        private: false,
      },
      { ...list.rows[1], id: a, title: 'a', priority: 1 },
    ]);
    const d = await makeCase('cases', { title: 'd', priority: 4 });
    await showing(list, [b, d]); // d enters at its place; a is pushed out
    await live.fixture('edit_case', a, '{"priority": 9}');
    await showing(list, [a, b]); // a comes back first; d is pushed out
    await live.fixture('edit_case', c, '{"status": "open", "priority": 10}');
    await showing(list, [c, a]);
    await live.fixture('delete_case', c);
    await showing(list, [a, b]); // the server reads the row after the window again
    const fresh = realtime.liveQuery(ask);
    await settled(fresh, (l) => l.loaded, 'the fresh rows');
    assert.deepEqual(fresh.rows, list.rows);
  });

  test('after a crash the queries are asked again; unchanged rows keep their objects', async () => {
    const hal = await live.fixture('user', 'hal', 'cases2');
    const x = await makeCase('cases2', { title: 'x', priority: 9 });
    const y = await makeCase('cases2', { title: 'y', priority: 8 });
    const server = await live.server();
    const realtime = client(server, { token: hal.token, scope: 'cases2', backoffStart: 50 });
    const recorder = new Recorder(realtime);
    const list = realtime.liveQuery({ model: 'case', orderBy: ['-priority'] });
    const changes = [];
    list.addEventListener('change', (event) => changes.push(event.detail));
    realtime.connect();
    await showing(list, [x, y]);
    const [kept, edited] = list.rows;
    const shown = list.rows;

    const down = recorder.states.length;
    await server.kill();
    await recorder.state('reconnecting', { from: down });
    await live.fixture('edit_case', y, '{"title": "y, edited while away"}');
    const z = await makeCase('cases2', { title: 'z', priority: 7 });
    assert.equal(list.rows, shown); // nothing changes while away
    await server.start();
    await showing(list, [x, y, z]);
    assert.equal(list.rows[0], kept);
    assert.notEqual(list.rows[1], edited);
    assert.equal(list.rows[1].title, 'y, edited while away');
    const last = changes.at(-1);
    assert.equal(last.type, 'rows');
    assert.deepEqual(
      [last.entered.map((row) => row.id), last.updated.map((row) => row.id), last.left],
      [[z], [y], []],
    );
  });

  test("a refusal is the server's reason; the socket and its other queries go on", async () => {
    const ivy = await live.fixture('user', 'ivy', 'cases3');
    const one = await makeCase('cases3', { title: 'one' });
    const realtime = client(main, { token: ivy.token, scope: 'cases3' });
    const recorder = new Recorder(realtime);
    const messages = [];
    const onError = (message) => messages.push(message);
    const byTitle = realtime.liveQuery({ model: 'case', where: { title: 'one' } }, { onError });
    const contacts = realtime.liveQuery({ model: 'contact' }, { onError });
    const cases = realtime.liveQuery({ model: 'case' }, { onError });
    realtime.connect();
    await showing(cases, [one]);
    await recorder.until(() => messages.length === 2, WAIT, 'two refusals');
    assert.deepEqual(messages, ['Field is not filterable: title', 'Model is not queryable']);
    assert.deepEqual([byTitle.active, contacts.active, cases.active], [false, false, true]);
    const two = await makeCase('cases3', { title: 'two' });
    await showing(cases, [one, two]);
    assert.equal(realtime.state, 'open');
  });
  test("a query started under an id already held shows its own rows first, not the old query's", async () => {
    const jo = await live.fixture('user', 'jo', 'cases4');
    await makeCase('cases4', { title: 'open one', status: 'open' });
    const closed = await makeCase('cases4', { title: 'closed one', status: 'closed' });
    const realtime = client(main, { token: jo.token, scope: 'cases4' });
    const recorder = new Recorder(realtime);
    realtime.connect();
    await recorder.state('open');

    // Both leave in this task: the server answers the open cases first, then the closed ones.
    realtime.liveQuery({ id: 'cases', model: 'case', where: { status: 'open' } });
    const list = realtime.liveQuery({ id: 'cases', model: 'case', where: { status: 'closed' } });
    const shown = [];
    list.addEventListener('change', (event) => shown.push(event.detail.rows.map((r) => r.id)));
    await showing(list, [closed]);
    assert.deepEqual(shown, [[closed]]);
  });

  test('a query stopped and asked again under its id shows its own rows, not the old ones', async () => {
    const mo = await live.fixture('user', 'mo', 'cases7');
    await makeCase('cases7', { title: 'open one', status: 'open' });
    const closed = await makeCase('cases7', { title: 'closed one', status: 'closed' });
    const realtime = client(main, { token: mo.token, scope: 'cases7' });
    const recorder = new Recorder(realtime);
    realtime.connect();
    await recorder.state('open');

    // A page toggling its filter: the old list stops, a new one starts under the same id.
    realtime.liveQuery({ id: 'cases', model: 'case', where: { status: 'open' } }).stop();
    const list = realtime.liveQuery({ id: 'cases', model: 'case', where: { status: 'closed' } });
    const shown = [];
    list.addEventListener('change', (event) => shown.push(event.detail.rows.map((r) => r.id)));
    await showing(list, [closed]);

    // The old query refused: its refusal does not stop the new one.
    realtime.liveQuery({ id: 'more', model: 'case', where: { title: 'x' } }).stop();
    const other = realtime.liveQuery({ id: 'more', model: 'case', where: { status: 'closed' } });
    await showing(other, [closed]);
    // A marker the server sends after both answers: nothing else came for either list.
    const marker = realtime.liveQuery({ id: 'marker', model: 'case', where: { status: 'closed' } });
    await showing(marker, [closed]);
    assert.deepEqual(shown, [[closed]]);
    assert.deepEqual([other.active, other.error, other.rows.map((r) => r.id)], [true, null, [closed]]);
  });

  test('a query started under a held id and refused: the server is told to stop the old one', async () => {
    const lia = await live.fixture('user', 'lia', 'cases6');
    const server = await live.server({ REALTIME_MAX_QUERIES: 2 });
    const realtime = client(server, { token: lia.token, scope: 'cases6' });
    const recorder = new Recorder(realtime);
    realtime.connect();
    await recorder.state('open');
    const first = realtime.liveQuery({ id: 'x', model: 'case' });
    await settled(first, (l) => l.loaded, 'its rows');
    const errors = [];
    const refused = realtime.liveQuery(
      { id: 'x', model: 'case', where: { title: 'a' } }, // title is not filterable
      { onError: (message) => errors.push(message) },
    );
    await settled(refused, (l) => l.error, 'the refusal');

    // The server holds at most 2 queries: two more fit only if it stopped serving `x`.
    const onError = (message) => errors.push(message);
    const more = [1, 2].map(() => realtime.liveQuery({ model: 'case' }, { onError }));
    await Promise.all(more.map((list) => settled(list, (l) => l.loaded || l.error, 'an answer')));
    assert.deepEqual(errors, ['Field is not filterable: title']);
  });

  test('a query refused, then replaced before the refusal came: the replacement takes over, the server holds one query', async () => {
    const kai = await live.fixture('user', 'kai', 'cases5');
    const open = await makeCase('cases5', { title: 'o', status: 'open' });
    const server = await live.server({ REALTIME_MAX_QUERIES: 2 });
    const realtime = client(server, { token: kai.token, scope: 'cases5' });
    const recorder = new Recorder(realtime);
    realtime.connect();
    await recorder.state('open');
    const errors = [];
    const onError = (message) => errors.push(message);
    const list = realtime.liveQuery(
      { id: 'x', model: 'case', where: { title: 'a' } }, // title is not filterable
      { onError },
    );
    list.replace({ where: { status: 'open' } }); // sent before the refusal arrives
    await settled(list, (l) => l.loaded, "the replacement's rows");
    // The refusal was of the ask replaced: dropped. The list shows the replacement's rows.
    assert.deepEqual([errors, list.active, list.error, list.rows.map((r) => r.id)], [[], true, null, [open]]);

    // The server holds at most 2 queries: one more fits beside `x`, a second does not.
    const more = [1, 2].map(() => realtime.liveQuery({ model: 'case' }, { onError }));
    await Promise.all(more.map((l) => settled(l, (q) => q.loaded || q.error, 'an answer')));
    assert.deepEqual(errors, ['Too many queries']);
  });
});

const platform = { skip: !globalThis.WebSocket && 'no global WebSocket in this Node.js' };

describe('with the WebSocket of the platform (the browser API)', platform, () => {
  /** A client using `globalThis.WebSocket`, as in a browser (no `WebSocket` option). */
  function platformClient(server, options) {
    const made = new RealtimeClient({ url: server.url, ...options });
    opened.push(made);
    return made;
  }

  test('hears writes, comes back after a crash, and is refused like the ws one', async () => {
    const pat = await live.fixture('user', 'pat', 'acme');
    const server = await live.server();
    const realtime = platformClient(server, { token: pat.token, scope: 'acme', backoffStart: 50 });
    const recorder = new Recorder(realtime);
    realtime.subscribe('contact');
    realtime.connect();
    await recorder.state('open');
    await subscribed(server, pat.id, 'contact');
    const first = await live.fixture('contact', 'acme', 'Seen by the platform socket');
    await recorder.event((f) => f.type === 'contact.created' && f.data.id === first.id);

    const down = recorder.states.length;
    await server.kill();
    assert.equal((await recorder.state('reconnecting', { from: down })).code, 1006);
    await server.start();
    await recorder.state('open', { from: down });
    await subscribed(server, pat.id, 'contact');
    const second = await live.fixture('contact', 'acme', 'Seen after the restart');
    await recorder.event((f) => f.type === 'contact.created' && f.data.id === second.id);

    const refused = platformClient(server, { token: pat.token, scope: 'nowhere' });
    const refusals = new Recorder(refused);
    refused.connect();
    assert.equal((await refusals.state('refused')).reason, 'Scope not found');
  });
});
