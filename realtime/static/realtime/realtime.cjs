// Generated from realtime.js by scripts/build-js-client.mjs (npm run build:client): do not edit.
'use strict';
Object.defineProperty(exports, '__esModule', { value: true });

// The browser side of the realtime socket protocol (see docs/javascript-client.md).
//
// A dependency-free ES module: it runs as is in browsers and in Node.js 20 and later (given a
// WebSocket class where there is no global one). This folder is also the npm package
// django-realtime-models: realtime.cjs is generated from this file (`npm run build:client`),
// and realtime.d.ts declares its types.

const ORIGIN_HEADER = 'X-Origin-Id';

/** The states a client goes through, announced by a `state` event. */
const STATES = Object.freeze(['connecting', 'open', 'reconnecting', 'refused', 'closed']);

/** The refusal a fresh token can cure; every other refusal is final. */
const TOKEN_REFUSAL = 'Invalid authentication token';
/** Names of the client's own events: a frame of such a type only comes as `event`. */
const RESERVED = new Set(['state', 'event', 'auth_success']);
const OPEN = 1; // WebSocket.OPEN, the same in every implementation
const NORMAL_CLOSURE = 1000;
/** Stamps kept waiting for their echo, at most (the oldest are forgotten first). */
const MAX_STAMPS = 1000;

function noop() {}

function randomId() {
  const bytes = new Uint8Array(8);
  if (globalThis.crypto && typeof globalThis.crypto.getRandomValues === 'function') {
    globalThis.crypto.getRandomValues(bytes);
  } else {
    for (let i = 0; i < bytes.length; i += 1) bytes[i] = Math.floor(Math.random() * 256);
  }
  return Array.from(bytes, (byte) => byte.toString(16).padStart(2, '0')).join('');
}

/** What an `authenticate` or `watch` frame asks for: `{scopes: [...]}` or `{scope}`. */
function scopeAsk(options) {
  if (options && options.scopes !== undefined && options.scopes !== null) {
    return { scopes: Array.from(options.scopes) };
  }
  return { scope: options && options.scope !== undefined ? options.scope : null };
}

function channelList(args) {
  return args.flat(Infinity).filter((channel) => typeof channel === 'string' && channel !== '');
}

function sameId(a, b) {
  return a !== undefined && a !== null && b !== undefined && b !== null && String(a) === String(b);
}

class RealtimeClient extends EventTarget {
  /**
   * @param {object} options
   * @param {string} options.url  the socket's address, e.g. `wss://example.com/api/ws`
   * @param {string} [options.token]  the bearer sent in `authenticate`
   * @param {() => string | Promise<string>} [options.getToken]  called before every attempt
   * @param {string | null} [options.scope]  one scope slug to read
   * @param {string[]} [options.scopes]  several scope slugs to read
   * @param {() => string | void | Promise<string | void>} [options.refreshToken]  called once
   *   when the server refuses the token; may return the new token
   * @param {typeof WebSocket} [options.WebSocket]  defaults to `globalThis.WebSocket`
   * @param {boolean} [options.resume]  resume after a reconnection, hearing what was missed
   *   (default true)
   * @param {number} [options.jitter]  the share (0 to 1) of each backoff delay drawn at random
   *   (default 1: anywhere between 0 and the delay), so that the clients of a restarted server
   *   do not all come back at the same instant
   * @param {boolean} [options.documentEvents]  also dispatch each event frame on `document` as
   *   `realtime:<type>`, and each state change as `realtime:state` (default true; nothing
   *   where there is no `document`): what htmx's `hx-trigger="... from:document"` listens to
   */
  constructor(options = {}) {
    super();
    const {
      url,
      token,
      getToken,
      refreshToken,
      WebSocket: WebSocketImpl = globalThis.WebSocket,
      fetch: fetchImpl,
      heartbeatInterval = 30000,
      backoffStart = 1000,
      backoffMax = 30000,
      jitter = 1,
      connectTimeout = 10000,
      maxFrameSize = 65536,
      stampTtl = 300000,
      resume = true,
      documentEvents = true,
    } = options;
    if (!url) throw new TypeError('RealtimeClient: `url` is required');
    if (typeof WebSocketImpl !== 'function') {
      throw new TypeError('RealtimeClient: no WebSocket implementation; pass `WebSocket`');
    }
    if (typeof getToken !== 'function' && (typeof token !== 'string' || token === '')) {
      throw new TypeError('RealtimeClient: pass `token` or `getToken`');
    }
    this.url = url;
    this.heartbeatInterval = heartbeatInterval;
    this.backoffStart = backoffStart;
    this.backoffMax = backoffMax;
    this.jitter = Math.min(Math.max(Number(jitter) || 0, 0), 1);
    this.connectTimeout = connectTimeout;
    this.maxFrameSize = maxFrameSize;
    this.stampTtl = stampTtl;
    this.resume = Boolean(resume);
    this.documentEvents = Boolean(documentEvents);
    /** A random id of this client instance; writes are stamped `<origin>.<n>`. */
    this.origin = randomId();
    /** The `data` of the last `auth_success` (`user_id`, `scope`, `scopes`), or null. */
    this.session = null;

    this._WebSocket = WebSocketImpl;
    this._fetch = fetchImpl;
    this._token = token;
    this._getToken = getToken;
    this._refreshToken = refreshToken;
    this._nextToken = null;
    this._ask = scopeAsk(options);
    this._channels = new Set();
    this._state = 'closed';
    this._reason = null;
    this._socket = null;
    this._generation = 0; // bumped whenever what is under way must be abandoned
    this._attempt = 0; // failed attempts since the last auth_success
    this._refreshed = false; // refreshToken was called since the last auth_success
    this._retryTimer = null;
    this._connectTimer = null;
    this._heartbeatTimer = null;
    this._queue = []; // [type, channels] sent at the end of the current task
    this._flushScheduled = false;
    this._counter = 0;
    this._stamps = new Map(); // stamp -> {record, at}
    this._cursor = null; // the cursor of the last frame handled (resume)
    this._resumed = false;
    this._afterAuth = []; // channels that did not fit in authenticate, subscribed after
  }

  /** `connecting`, `open`, `reconnecting`, `refused` or `closed`. */
  get state() {
    return this._state;
  }

  /** The server's reason behind the current state (a refusal), or null. */
  get reason() {
    return this._reason;
  }

  /** The channels this client is subscribed to (it says them again after each reconnect). */
  get channels() {
    return Array.from(this._channels);
  }

  /**
   * Whether the last handshake resumed: true when the frames missed while away follow (what
   * the page shows stays right); false on a first connection or when the server could not
   * resume (read your data again).
   */
  get resumed() {
    return this._resumed;
  }

  /** The cursor of the last frame handled (or of the last answer to a heartbeat), sent back
   * to resume; null before any. */
  get cursor() {
    return this._cursor;
  }

  /** What the client asks to read: `{scope}` or `{scopes}`. */
  get watching() {
    return 'scopes' in this._ask ? { scopes: [...this._ask.scopes] } : { ...this._ask };
  }

  // Connection -------------------------------------------------------------------------------

  /** Open the socket (again after `close()` or a refusal); nothing while already at it. */
  connect() {
    if (this._state === 'connecting' || this._state === 'open' || this._state === 'reconnecting') {
      return this;
    }
    this._attempt = 0;
    this._refreshed = false;
    this._setState('connecting');
    this._dial();
    return this;
  }

  /** Close the socket for good: no reconnection until `connect()` is called again. */
  close() {
    this._generation += 1;
    this._drop();
    this._setState('closed');
    return this;
  }

  async _dial() {
    const generation = ++this._generation;
    let token;
    try {
      token = await this._currentToken();
    } catch (error) {
      if (generation === this._generation) this._retry({ error });
      return;
    }
    if (generation !== this._generation) return;
    let socket;
    try {
      socket = new this._WebSocket(this.url);
    } catch (error) {
      this._refuse(error.message, { error }); // a URL the implementation rejects stays so
      return;
    }
    this._socket = socket;
    const mine = (handler) => (event) => {
      if (socket === this._socket) handler.call(this, event);
    };
    socket.onerror = noop; // a close event always follows
    socket.onopen = mine(() => {
      const data = { token, ...this._ask };
      this._afterAuth = [];
      if (this.resume) {
        // The channels come with the handshake, so nothing is missed before they are said;
        // those that do not fit in its frame are subscribed after auth_success.
        data.resume = this._cursor;
        [data.channels, this._afterAuth] = this._fit({ type: 'authenticate', data }, this.channels);
      }
      this._sendFrame('authenticate', data);
    });
    socket.onmessage = mine(this._onMessage);
    socket.onclose = mine((event) => {
      this._drop();
      this._retry({ code: event.code });
    });
    if (this.connectTimeout > 0) {
      this._connectTimer = setTimeout(
        mine(() => {
          this._drop();
          this._retry({ error: new Error('no answer to authenticate in time') });
        }),
        this.connectTimeout,
      );
    }
  }

  async _currentToken() {
    if (this._nextToken !== null) {
      const token = this._nextToken;
      this._nextToken = null;
      return token;
    }
    return this._getToken ? this._getToken() : this._token;
  }

  /** Forget the socket (closing it if need be) and every timer. */
  _drop() {
    clearTimeout(this._retryTimer);
    clearTimeout(this._connectTimer);
    clearInterval(this._heartbeatTimer);
    this._retryTimer = this._connectTimer = this._heartbeatTimer = null;
    this._queue = [];
    const socket = this._socket;
    this._socket = null;
    if (socket) {
      socket.onopen = socket.onmessage = socket.onclose = null;
      socket.onerror = noop;
      try {
        socket.close(NORMAL_CLOSURE);
      } catch {
        // already closing
      }
    }
  }

  /**
   * Try again after the next backoff step (1 s, 2 s, 4 s, ... up to `backoffMax`), less a
   * random share of it of at most `jitter`: clients that lost the same server spread out.
   */
  _retry({ code = null, error = null } = {}) {
    const step = Math.min(this.backoffStart * 2 ** Math.min(this._attempt, 52), this.backoffMax);
    const wait = Math.round(step * (1 - this.jitter * Math.random()));
    this._attempt += 1;
    const generation = this._generation;
    this._retryTimer = setTimeout(() => {
      if (generation === this._generation) this._dial();
    }, wait);
    // Last: a listener may close() the client, which clears the timer.
    this._setState('reconnecting', null, { code, error, delay: wait, attempt: this._attempt });
  }

  async _onRefusal(reason) {
    this._drop();
    if (reason === TOKEN_REFUSAL && this._refreshToken && !this._refreshed) {
      this._refreshed = true;
      const generation = ++this._generation;
      this._setState('reconnecting', reason, { code: null, delay: 0, attempt: this._attempt });
      if (generation !== this._generation) return; // closed by a listener
      let token;
      try {
        token = await this._refreshToken();
      } catch (error) {
        if (generation === this._generation) this._refuse(reason, { error });
        return;
      }
      if (generation !== this._generation) return;
      if (typeof token === 'string' && token !== '') {
        if (this._getToken) this._nextToken = token;
        else this._token = token;
      }
      this._dial();
      return;
    }
    this._refuse(reason);
  }

  _refuse(reason, extra) {
    this._generation += 1;
    this._drop();
    this._setState('refused', reason, extra);
  }

  _setState(state, reason = null, extra = {}) {
    if (state === this._state && reason === this._reason && state !== 'reconnecting') return;
    this._state = state;
    this._reason = reason;
    if (state === 'refused' || state === 'closed') this.session = null;
    const detail = { state, reason, ...extra };
    this.dispatchEvent(new CustomEvent('state', { detail }));
    this._toDocument('state', detail);
  }

  /** The same news on `document`, as `realtime:<name>`, for pages that listen there. */
  _toDocument(name, detail) {
    const target = this.documentEvents ? globalThis.document : undefined;
    if (target && typeof target.dispatchEvent === 'function') {
      target.dispatchEvent(new CustomEvent(`realtime:${name}`, { detail }));
    }
  }

  // Frames -----------------------------------------------------------------------------------

  _onMessage(event) {
    if (typeof event.data !== 'string') return;
    let frame;
    try {
      frame = JSON.parse(event.data);
    } catch {
      return;
    }
    if (frame === null || typeof frame !== 'object' || typeof frame.type !== 'string') return;
    if (frame.type === 'auth_success') {
      this._onAuthSuccess(frame);
    } else if (frame.type === 'auth_error') {
      const message = frame.data && frame.data.message;
      this._onRefusal(typeof message === 'string' ? message : 'Authentication refused');
    } else if (frame.type === 'cursor' && this.resume) {
      // A fresh cursor answering a heartbeat (a quiet socket stays resumable): kept like an
      // event frame's, told to nobody.
      if (this._state === 'open' && typeof frame.cursor === 'string') this._cursor = frame.cursor;
    } else if (this._state === 'open') {
      this._deliver(frame);
    }
  }

  _onAuthSuccess(frame) {
    clearTimeout(this._connectTimer);
    this._connectTimer = null;
    this._attempt = 0;
    this._refreshed = false;
    this.session = frame.data && typeof frame.data === 'object' ? frame.data : null;
    this._queue = [];
    const data = this.session || {};
    this._resumed = data.resumed === true;
    if (typeof data.cursor === 'string') this._cursor = data.cursor;
    // A server that answers with a cursor took the channels from authenticate; any other
    // (one that does not resume) hears them now.
    const said = this.resume && typeof data.cursor === 'string';
    this._sendChannels('subscribe', said ? this._afterAuth : this.channels);
    this._afterAuth = [];
    clearInterval(this._heartbeatTimer);
    if (this.heartbeatInterval > 0) {
      this._heartbeatTimer = setInterval(
        () => this._sendFrame('heartbeat', null),
        this.heartbeatInterval,
      );
    }
    this._setState('open', null, { resumed: this._resumed });
    this.dispatchEvent(new CustomEvent('auth_success', { detail: frame }));
  }

  _deliver(frame) {
    if (typeof frame.cursor === 'string') this._cursor = frame.cursor;
    if (typeof frame.origin === 'string' && this._isEcho(frame)) return;
    if (!RESERVED.has(frame.type)) {
      this.dispatchEvent(new CustomEvent(frame.type, { detail: frame }));
      this._toDocument(frame.type, frame);
    }
    this.dispatchEvent(new CustomEvent('event', { detail: frame }));
  }

  _sendFrame(type, data) {
    const socket = this._socket;
    if (!socket || socket.readyState !== OPEN) return false;
    try {
      socket.send(JSON.stringify({ type, data }));
      return true;
    } catch {
      return false; // the close event follows
    }
  }

  /** Send channels in as many frames as `maxFrameSize` requires. */
  _sendChannels(type, channels) {
    const empty = { type, data: { channels: [] } };
    // A channel too long for a frame of its own could never be sent.
    let rest = channels.filter((channel) => this._fit(empty, [channel])[0].length);
    while (rest.length) {
      const [batch, left] = this._fit(empty, rest);
      this._sendFrame(type, { channels: batch });
      rest = left;
    }
  }

  /** Split `channels` into the first that fit in `frame`'s `data.channels`, and the rest. */
  _fit(frame, channels) {
    let size = JSON.stringify({ ...frame, data: { ...frame.data, channels: [] } }).length;
    let count = 0;
    for (const channel of channels) {
      const cost = JSON.stringify(channel).length + 1;
      if (size + cost > this.maxFrameSize) break;
      size += cost;
      count += 1;
    }
    return [channels.slice(0, count), channels.slice(count)];
  }

  /** Queue a subscription change; the changes of one task leave together. */
  _enqueue(type, channels) {
    if (this._state !== 'open' || channels.length === 0) return;
    const last = this._queue[this._queue.length - 1];
    if (last && last[0] === type) last[1].push(...channels);
    else this._queue.push([type, channels]);
    if (this._flushScheduled) return;
    this._flushScheduled = true;
    queueMicrotask(() => {
      this._flushScheduled = false;
      const queue = this._queue;
      this._queue = [];
      for (const [kind, names] of queue) this._sendChannels(kind, names);
    });
  }

  // Scopes and channels ------------------------------------------------------------------------

  /** Read other scopes: `watch({scope: 'acme'})`, `watch({scopes: ['a', 'b']})`. */
  watch(ask = {}) {
    this._ask = scopeAsk(ask);
    if (this._state === 'open') {
      this._queue = [];
      this._sendFrame('watch', this._ask);
      this._sendChannels('subscribe', this.channels); // a watch drops every subscription
    }
    return this;
  }

  /** Hear these channels (`'contact'`, `'contact:7'`), now and after every reconnect. */
  subscribe(...channels) {
    const added = channelList(channels).filter((channel) => !this._channels.has(channel));
    for (const channel of added) this._channels.add(channel);
    this._enqueue('subscribe', added);
    return this;
  }

  /** Stop hearing these channels. */
  unsubscribe(...channels) {
    const removed = channelList(channels).filter((channel) => this._channels.has(channel));
    for (const channel of removed) this._channels.delete(channel);
    this._enqueue('unsubscribe', removed);
    return this;
  }

  // Recognising its own writes -----------------------------------------------------------------

  /** A fresh origin for one write: `<origin>.<n>`. */
  nextOrigin() {
    this._counter += 1;
    return `${this.origin}.${this._counter}`;
  }

  /**
   * Expect the echo of a write stamped `stamp`: the first event frame carrying it as its
   * `origin` (and, when `record` is given, naming that `{model, id}`) is dropped, once.
   */
  remember(stamp, record) {
    const now = Date.now();
    for (const [key, entry] of this._stamps) {
      if (now - entry.at < this.stampTtl && this._stamps.size < MAX_STAMPS) break;
      this._stamps.delete(key);
    }
    this._stamps.set(stamp, { record: record || null, at: now });
    return stamp;
  }

  /** Stop expecting the echo of `stamp` (the write failed, say). */
  forget(stamp) {
    return this._stamps.delete(stamp);
  }

  /** A copy of fetch's `init` whose headers carry a fresh, remembered `X-Origin-Id`. */
  stamp(init = {}, record) {
    const stamp = this.remember(this.nextOrigin(), record);
    const headers = new Headers(init.headers);
    headers.set(ORIGIN_HEADER, stamp);
    return { ...init, headers };
  }

  /** `fetch` with a stamped write; a failed request forgets its stamp. */
  async stampedFetch(input, init = {}, record) {
    const stamped = this.stamp(init, record);
    const stamp = stamped.headers.get(ORIGIN_HEADER);
    const fetchImpl = this._fetch || globalThis.fetch;
    let response;
    try {
      response = await fetchImpl.call(globalThis, input, stamped);
    } catch (error) {
      this.forget(stamp);
      throw error;
    }
    if (!response.ok) this.forget(stamp);
    return response;
  }

  _isEcho(frame) {
    const entry = this._stamps.get(frame.origin);
    if (!entry) return false;
    const { record } = entry;
    if (record) {
      const data = frame.data && typeof frame.data === 'object' ? frame.data : {};
      if (record.model !== undefined && record.model !== data.model) return false;
      if (record.id !== undefined && !sameId(record.id, data.id)) return false;
    }
    this._stamps.delete(frame.origin);
    return true;
  }
}

exports.ORIGIN_HEADER = ORIGIN_HEADER;
exports.STATES = STATES;
exports.RealtimeClient = RealtimeClient;
exports.default = RealtimeClient;
