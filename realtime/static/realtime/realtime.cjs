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
/** The frames that answer live queries: the live queries' own once the client has asked one. */
const QUERY_FRAMES = new Set(['query.rows', 'query.diff', 'query.error']);
/** The longest id the server takes for a live query. */
const MAX_QUERY_ID = 64;
/** The most digits of the counter that numbers the asks a client sends (2 ** 53 - 1). */
const MAX_ASK_DIGITS = String(Number.MAX_SAFE_INTEGER).length;
/** A decimal as Python writes it: `-12.50`, `1E-7`. */
const DECIMAL = /^([+-]?)(\d*)(?:\.(\d*))?(?:[eE]([+-]?\d+))?$/;

function noop() {}

/**
 * Whether `frame` has no top-level key but `type` and `keys`: the shape of the protocol's own
 * frames (`auth_success` and `auth_error` hold `data` alone, a heartbeat's `cursor` answer no
 * `data`). An application's event always has `data`, and `scope_id` or `cursor` beside it
 * when it reaches a scope or a socket that resumes.
 */
function onlyKeys(frame, ...keys) {
  return Object.keys(frame).every((key) => key === 'type' || keys.includes(key));
}

/** Whether `data` is an `auth_error`'s: `{message}` alone, a string. */
function isRefusal(data) {
  return (
    data !== null &&
    typeof data === 'object' &&
    typeof data.message === 'string' &&
    Object.keys(data).length === 1
  );
}

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
  return a !== undefined && a !== null && b !== undefined && b !== null && rowKey(a) === rowKey(b);
}

/** What a live query asks for, checked: `{model, where, orderBy, limit}` (null: left out). */
function queryAsk(query) {
  if (!query || typeof query.model !== 'string' || query.model === '') {
    throw new TypeError('liveQuery: `model` is required');
  }
  const { model, where = {}, orderBy = null, limit = null } = query;
  if (where === null || typeof where !== 'object' || Array.isArray(where)) {
    throw new TypeError('liveQuery: `where` is an object of lookups');
  }
  const order = orderBy === null ? null : Array.from(orderBy);
  if (typeof orderBy === 'string' || (order && !order.every((f) => typeof f === 'string'))) {
    throw new TypeError('liveQuery: `orderBy` is a list of field names');
  }
  if (limit !== null && !(Number.isInteger(limit) && limit > 0)) {
    throw new TypeError('liveQuery: `limit` is a positive whole number');
  }
  return { model, where: { ...where }, orderBy: order, limit };
}

/**
 * The id an ask goes under on the wire: `<n>:<id>` (`n` counting the client's asks), cut to
 * `MAX_QUERY_ID` characters and never inside a character. No two asks of a client share it,
 * so the frames of an older ask can never be taken for a newer one's.
 */
function wireId(n, id) {
  const wire = `${n}:${id}`.slice(0, MAX_QUERY_ID);
  return /[\uD800-\uDBFF]$/.test(wire) ? wire.slice(0, -1) : wire;
}

/** The `data` of a `query` frame: what was left out is the server's default. */
function queryData(id, ask) {
  const data = { id, model: ask.model, where: ask.where };
  if (ask.orderBy !== null) data.order_by = ask.orderBy;
  if (ask.limit !== null) data.limit = ask.limit;
  return data;
}

/**
 * A row's key in a map: its id as text (`7` and `"7"` are one row). A composite key is the JSON
 * list of its parts' keys (`[12, 3]` is `'["12","3"]'`), so text parts holding a comma stay
 * apart: `["a,b", "c"]` and `["a", "b,c"]` are two rows.
 */
function rowKey(id) {
  return Array.isArray(id) ? JSON.stringify(id.map(rowKey)) : String(id);
}

function isRow(row) {
  return row !== null && typeof row === 'object' && row.id !== undefined && row.id !== null;
}

/** Whether two JSON values hold the same content. */
function sameValue(a, b) {
  if (a === b) return true;
  if (a === null || b === null || typeof a !== 'object' || typeof b !== 'object') return false;
  if (Array.isArray(a) !== Array.isArray(b)) return false;
  const keys = Object.keys(a);
  if (keys.length !== Object.keys(b).length) return false;
  const own = (key) => Object.prototype.hasOwnProperty.call(b, key);
  return keys.every((key) => own(key) && sameValue(a[key], b[key]));
}

/** Where a JSON value sorts among values of other kinds: null first, objects last. */
function kindRank(value) {
  if (value === null || value === undefined) return 0;
  if (typeof value === 'boolean') return 1;
  if (typeof value === 'number') return 2;
  if (typeof value === 'string') return 3;
  return Array.isArray(value) ? 4 : 5;
}

/**
 * Compare two JSON values, ascending: null (or missing) first, numbers as numbers, strings by
 * their UTF-16 code units, arrays (a composite key) item by item.
 */
function compareValues(a, b) {
  const rank = kindRank(a);
  if (rank !== kindRank(b)) return rank < kindRank(b) ? -1 : 1;
  if (rank === 4) {
    for (let i = 0; i < a.length && i < b.length; i += 1) {
      const order = compareValues(a[i], b[i]);
      if (order !== 0) return order;
    }
    return a.length === b.length ? 0 : a.length < b.length ? -1 : 1;
  }
  if (rank === 0 || rank === 5) return 0;
  return a < b ? -1 : a > b ? 1 : 0;
}

/**
 * A decimal's text (`"-12.50"`, `"1E-7"`, as Python writes a Decimal) as `[sign, point,
 * digits]`, its value being sign * 0.<digits> * 10^point; null for any other text.
 */
function decimalParts(text) {
  const match = DECIMAL.exec(text);
  if (!match || (match[2] === '' && !match[3])) return null;
  const [, sign, whole, fraction = '', exponent = '0'] = match;
  const all = whole + fraction;
  const significant = all.replace(/^0+/, '');
  const digits = significant.replace(/0+$/, '');
  if (digits === '') return [0, 0, ''];
  const point = whole.length - (all.length - significant.length) + Number(exponent);
  return [sign === '-' ? -1 : 1, point, digits];
}

/**
 * Compare two values of an ordered field, ascending, as the server does: null first, or last
 * when `nullsLargest` (PostgreSQL's order); decimals, which come as text, by their value. The
 * server orders by no text field, so other text is a date, a time or a UUID: compared as text.
 */
function compareField(a, b, nullsLargest) {
  const aNull = a === null || a === undefined;
  const bNull = b === null || b === undefined;
  if (aNull || bNull) {
    if (aNull && bNull) return 0;
    return (aNull ? -1 : 1) * (nullsLargest ? -1 : 1);
  }
  const x = typeof a === 'string' && typeof b === 'string' ? decimalParts(a) : null;
  const y = x ? decimalParts(b) : null;
  if (!x || !y) return compareValues(a, b);
  if (x[0] !== y[0]) return x[0] < y[0] ? -1 : 1;
  if (x[0] === 0) return 0;
  const [sign, point, digits] = x;
  const larger = point !== y[1] ? point > y[1] : digits > y[2];
  return digits === y[2] && point === y[1] ? 0 : sign * (larger ? 1 : -1);
}

/**
 * The order of `order_by`: each field ascending (`-field` descending), `pk`, `id` and any
 * name the rows do not carry naming the row's `id` (the server orders by filters, which every
 * row carries, or by the primary key under any of its names; numbers before text, as the
 * server orders keys), and the primary key ascending as the last tie-breaker.
 */
function rowOrder(orderBy, nullsLargest) {
  const fields = orderBy.map((field) =>
    field.startsWith('-') ? [field.slice(1), -1] : [field, 1],
  );
  return (a, b) => {
    for (const [field, sign] of fields) {
      const order =
        field === 'pk' || field === 'id' || !(field in a || field in b)
          ? compareValues(a.id, b.id)
          : compareField(a[field], b[field], nullsLargest);
      if (order !== 0) return sign * order;
    }
    return compareValues(a.id, b.id);
  };
}

/** The index at which `row` goes in `rows`, sorted by `order`: after the rows equal to it. */
function insertionPoint(rows, row, order) {
  let low = 0;
  let high = rows.length;
  while (low < high) {
    const middle = (low + high) >> 1;
    if (order(rows[middle], row) > 0) high = middle;
    else low = middle + 1;
  }
  return low;
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
   *   when the server refuses the token; may return the new token (by default `getToken`)
   * @param {typeof WebSocket} [options.WebSocket]  defaults to `globalThis.WebSocket`
   * @param {boolean} [options.resume]  resume after a reconnection, hearing what was missed
   *   (default true)
   * @param {number} [options.jitter]  the share (0 to 1) of each backoff delay drawn at random
   *   (default 1: anywhere between 0 and the delay), so that the clients of a restarted server
   *   do not all come back at the same instant
   * @param {boolean} [options.documentEvents]  also dispatch each event frame on `document` as
   *   `realtime:<type>`, and each state change as `realtime:state` (default true; nothing
   *   where there is no `document`): what htmx's `hx-trigger="... from:document"` listens to
   * @param {boolean} [options.nullsLargest]  live queries place nulls as the largest values,
   *   last in ascending order, as PostgreSQL sorts them (default false: first, as SQLite and
   *   MySQL/MariaDB do); say what the server's database does
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
      nullsLargest = false,
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
    this.nullsLargest = Boolean(nullsLargest);
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
    this._handshake = null; // what the last authenticate said: {ask, channels}
    this._queries = new Map(); // id -> LiveQuery, asked again after each auth_success
    this._wires = new Map(); // wire id -> LiveQuery: the asks whose frames this socket routes
    this._queried = false; // liveQuery() was called: query.* frames are the live queries'
    this._queryCounter = 0;
    this._askCounter = 0; // numbers every ask sent: its wire id is `<n>:<id>`
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

  /** The live queries this client holds (it asks them again after each reconnect). */
  get liveQueries() {
    return Array.from(this._queries.values());
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
      if (this.resume) {
        // The channels come with the handshake, so nothing is missed before they are said;
        // those that do not fit in its frame are subscribed after auth_success.
        data.resume = this._cursor;
        [data.channels] = this._fit({ type: 'authenticate', data }, this.channels);
      }
      this._handshake = { ask: this._ask, channels: new Set(data.channels) };
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

  /** What cures a refused token: `refreshToken`, or else `getToken`, asked once more. */
  _refresher() {
    return this._refreshToken || this._getToken || null;
  }

  async _onRefusal(reason) {
    this._drop();
    const refresh = this._refresher();
    if (reason === TOKEN_REFUSAL && refresh && !this._refreshed) {
      this._refreshed = true;
      const generation = ++this._generation;
      this._setState('reconnecting', reason, { code: null, delay: 0, attempt: this._attempt });
      if (generation !== this._generation) return; // closed by a listener
      let token;
      try {
        token = await refresh();
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
    // The protocol's own frames, told from an application's events of the same type by when
    // they come and by their shape: those events are dispatched like any other.
    const handshake = this._state !== 'open';
    if (frame.type === 'auth_success' && handshake && onlyKeys(frame, 'data')) {
      this._onAuthSuccess(frame);
    } else if (
      frame.type === 'auth_error' &&
      onlyKeys(frame, 'data') &&
      (handshake || isRefusal(frame.data)) // later, a recheck's: `{message}`, then close 1008
    ) {
      const message = frame.data && frame.data.message;
      this._onRefusal(typeof message === 'string' ? message : 'Authentication refused');
    } else if (frame.type === 'cursor' && this.resume && onlyKeys(frame, 'cursor')) {
      // A fresh cursor answering a heartbeat (a quiet socket stays resumable), or sent after a
      // recheck changed the scopes: kept like an event frame's, told to nobody.
      if (this._state === 'open' && typeof frame.cursor === 'string') this._cursor = frame.cursor;
    } else if (this._state === 'open') {
      if (this._queried && QUERY_FRAMES.has(frame.type)) this._onQueryFrame(frame);
      else this._deliver(frame);
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
    // (one that does not resume) took none.
    const said = this.resume && typeof data.cursor === 'string';
    this._afterHandshake(said ? this._handshake.channels : new Set());
    // Queries belong to the socket: the wire ids of the last one are dead. A new one hears
    // each query again under a fresh id (its rows shown meanwhile, until the answer).
    this._wires.clear();
    for (const list of this._queries.values()) {
      list._pending = null;
      list._live = null;
      list._held = null;
      this._sendQuery(list);
    }
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

  /**
   * Tell the server what changed while the handshake was under way, which nothing sent: the
   * channels `carried` by authenticate that are dropped since, the others held now (those
   * that did not fit in its frame among them), and a watch when the ask changed.
   */
  _afterHandshake(carried) {
    const dropped = [...carried].filter((channel) => !this._channels.has(channel));
    if (!sameValue(this._handshake.ask, this._ask)) {
      this._sayWatch(dropped);
      return;
    }
    this._sendChannels('unsubscribe', dropped);
    this._sendChannels('subscribe', this.channels.filter((channel) => !carried.has(channel)));
  }

  /**
   * Send a watch of what is asked now, then every channel held: a watch that changes the
   * scopes drops every subscription. One that does not keeps them, so the channels `dropped`
   * since they were said are unsubscribed first.
   */
  _sayWatch(dropped) {
    this._sendChannels('unsubscribe', dropped);
    this._sendFrame('watch', this._ask);
    this._sendChannels('subscribe', this.channels);
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

  /**
   * Queue a subscription change; the changes of one task leave together. Before `open` nothing
   * is queued: the next handshake says the channels held then.
   */
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
      // The watch says this task's queued changes: its subscribe names every channel held,
      // and the channels unsubscribed meanwhile leave before it.
      const queued = this._queue.filter(([type]) => type === 'unsubscribe');
      this._queue = [];
      const dropped = new Set(queued.flatMap(([, channels]) => channels));
      this._sayWatch([...dropped].filter((channel) => !this._channels.has(channel)));
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

  // Live queries -------------------------------------------------------------------------------

  /**
   * Keep a list of rows in step with the server: `liveQuery({model: 'ticket', where: {status:
   * 'open'}, orderBy: ['-priority'], limit: 50}, {onChange(rows, change) {...}})`. The query
   * is asked now when open, else at the next `auth_success`, and again after every reconnect;
   * an `id` the client holds already replaces that query. Returns its LiveQuery.
   *
   * @param {object} query
   * @param {string} [query.id]  1 to 64 characters, unique on the socket (made when left out)
   * @param {string} query.model  the model's name, as in its channel
   * @param {object} [query.where]  lookups and their values, e.g. `{status: 'open'}`
   * @param {string[]} [query.orderBy]  fields, `-field` for descending (the server's default:
   *   `['pk']`)
   * @param {number} [query.limit]  the most rows, at least 1 (the server's default and most:
   *   its `REALTIME_QUERY_MAX_ROWS`)
   * @param {object} [options]
   * @param {(rows: object[], change: object) => void} [options.onChange]  a `change` listener
   * @param {(message: string) => void} [options.onError]  an `error` listener
   * @param {(a: object, b: object) => number} [options.compare]  where an entering or updated
   *   row goes, instead of the client's reading of `orderBy`
   */
  liveQuery(query, options = {}) {
    const ask = queryAsk(query);
    const given = query.id !== undefined && query.id !== null;
    if (given && (typeof query.id !== 'string' || !query.id || query.id.length > MAX_QUERY_ID)) {
      throw new TypeError(`liveQuery: \`id\` is a string of 1 to ${MAX_QUERY_ID} characters`);
    }
    const id = given ? query.id : this._nextQueryId();
    this._checkQuery(id, ask);
    const held = this._queries.get(id);
    const list = new LiveQuery(this, id, ask, options);
    this._queries.set(id, list); // in the place of the one it replaces, if any
    if (held) {
      held._active = false; // replaced: the server is told to stop it, before the new ask
      this._stopQuery(held, true);
    }
    this._queried = true;
    if (this._state === 'open') this._sendQuery(list);
    return list;
  }

  _nextQueryId() {
    let id;
    do {
      this._queryCounter += 1;
      id = `q${this._queryCounter}`;
    } while (this._queries.has(id));
    return id;
  }

  /**
   * A query whose frame exceeds `maxFrameSize` would cost the socket (close 1009): measured
   * under the longest wire id it may be sent under.
   */
  _checkQuery(id, ask) {
    const wire = wireId('9'.repeat(MAX_ASK_DIGITS), id);
    const frame = JSON.stringify({ type: 'query', data: queryData(wire, ask) });
    if (frame.length > this.maxFrameSize) {
      throw new RangeError(`liveQuery: the query is longer than maxFrameSize (${frame.length})`);
    }
  }

  /** Tell the server to stop the ask of `list` it may still hold (sent before a new one). */
  _unquery(list) {
    const held = list._held;
    list._held = null;
    if (held !== null && this._state === 'open') this._sendFrame('unquery', { id: held });
  }

  /**
   * Ask `list`'s query on the socket under a fresh wire id: its pending ask. The asks the
   * server may hold for it are stopped first (freeing their room among the socket's queries);
   * one that was pending is forgotten, and the diffs of the one shown still apply until the
   * answer comes (they keep the rows exact).
   */
  _sendQuery(list) {
    this._unquery(list);
    if (list._pending) this._wires.delete(list._pending.wire);
    list._pending = null;
    this._askCounter += 1;
    const wire = wireId(this._askCounter, list.id);
    if (!this._sendFrame('query', queryData(wire, list._ask))) return;
    list._pending = { wire, ask: list._ask };
    list._held = wire;
    this._wires.set(wire, list);
  }

  /**
   * Forget `list` (when it is still the one under its id) and its wire ids, telling the
   * server to stop what it holds of it if asked to: what it sends for them after is dropped.
   */
  _stopQuery(list, tell) {
    if (this._queries.get(list.id) === list) this._queries.delete(list.id);
    for (const ask of [list._pending, list._live]) {
      if (ask && this._wires.get(ask.wire) === list) this._wires.delete(ask.wire);
    }
    list._pending = null;
    list._live = null;
    if (tell) this._unquery(list);
    list._held = null;
  }

  /** A frame of a live query: routed by its wire id (one of another ask's is dropped). */
  _onQueryFrame(frame) {
    const data = frame.data && typeof frame.data === 'object' ? frame.data : {};
    const wire = typeof data.id === 'string' ? data.id : null;
    const list = wire === null ? undefined : this._wires.get(wire);
    if (list) list._onFrame(frame.type, wire, data);
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

/**
 * A list of rows the server keeps in step with the database (`client.liveQuery(...)`): `rows`
 * in the query's order, a `change` event each time they change, an `error` event when the
 * server refuses the query (which stops it), and `stop()`.
 */
class LiveQuery extends EventTarget {
  constructor(client, id, ask, options = {}) {
    super();
    /** The query's id: the application's (each ask goes on the wire as `<n>:<id>`). */
    this.id = id;
    /** The server's reason when it refused the query, or null. */
    this.error = null;
    this._client = client;
    this._ask = ask; // what is asked now
    this._shown = ask; // what `rows` follow: the ask the last answer was to
    this._pending = null; // {wire, ask}: sent on this socket, not answered yet
    this._live = null; // {wire, ask}: answered on this socket; its rows are shown
    this._held = null; // the wire id of its last ask, until unqueried: the server may hold it
    this._rows = [];
    this._loaded = false;
    this._active = true;
    this._compare = typeof options.compare === 'function' ? options.compare : null;
    this._order = null; // [ask, nullsLargest, compare function] of the last order used
    const { onChange, onError } = options;
    if (typeof onChange === 'function') {
      this.addEventListener('change', (event) => {
        onChange.call(this, event.detail.rows, event.detail);
      });
    }
    if (typeof onError === 'function') {
      this.addEventListener('error', (event) => onError.call(this, event.detail.message));
    }
  }

  /**
   * The rows, in the query's order: a new array after each change, the same row objects for
   * the rows whose content did not change. Read them; do not modify them.
   */
  get rows() {
    return this._rows;
  }

  /** Whether the server has answered with rows yet (an empty list is an answer). */
  get loaded() {
    return this._loaded;
  }

  /** False once stopped: by `stop()`, by a refusal, or by a query asked under the same id. */
  get active() {
    return this._active;
  }

  /** What is asked now: `{id, model, where}`, and `orderBy` and `limit` when given. */
  get query() {
    const { model, where, orderBy, limit } = this._ask;
    const query = { id: this.id, model, where: { ...where } };
    if (orderBy !== null) query.orderBy = [...orderBy];
    if (limit !== null) query.limit = limit;
    return query;
  }

  /**
   * Ask for other rows under the same id: `replace({where: {status: 'closed'}})`. What
   * `changes` leaves out stays as it was (`null` leaves `orderBy` or `limit` to the server).
   * The rows stay until the server answers, then change once, keeping the unchanged rows.
   */
  replace(changes = {}) {
    if (!this._active) throw new Error('LiveQuery: stopped; ask again with client.liveQuery()');
    const ask = queryAsk({ ...this.query, ...changes }); // an id in `changes` is not read
    this._client._checkQuery(this.id, ask);
    this._ask = ask;
    if (this._client.state === 'open') this._client._sendQuery(this);
    return this;
  }

  /** Stop the query: the server is told (`unquery`), and what it sends after is dropped. */
  stop() {
    if (!this._active) return this;
    this._active = false;
    this._client._stopQuery(this, true);
    return this;
  }

  /** The order of the ask the rows follow. */
  _sorter() {
    if (this._compare) return this._compare;
    const nulls = this._client.nullsLargest;
    if (!this._order || this._order[0] !== this._shown || this._order[1] !== nulls) {
      this._order = [this._shown, nulls, rowOrder(this._shown.orderBy || ['pk'], nulls)];
    }
    return this._order[2];
  }

  /**
   * A frame under one of its wire ids. The pending ask's `query.rows` answers it: that ask is
   * shown from then on, and the one shown before forgotten. The shown ask's frames keep its
   * rows exact: `query.rows` sent unasked (a bulk write, a read again), then its diffs.
   */
  _onFrame(type, wire, data) {
    const pending = this._pending;
    if (pending && wire === pending.wire) {
      if (type === 'query.rows' && Array.isArray(data.rows)) {
        const live = this._live;
        if (live && live.wire !== wire) this._client._wires.delete(live.wire);
        this._live = pending;
        this._pending = null;
        this._shown = pending.ask;
        this._onRows(data.rows);
      } else if (type === 'query.error') {
        this._onError(typeof data.message === 'string' ? data.message : 'Query refused');
      }
    } else if (this._live && wire === this._live.wire) {
      if (type === 'query.rows') this._onRows(data.rows);
      else if (type === 'query.diff') this._onDiff(data);
    }
  }

  /** The whole list (an answer, or sent again): taken as the server orders it, reconciled. */
  _onRows(rows) {
    if (!Array.isArray(rows)) return;
    const before = new Map(this._rows.map((row) => [rowKey(row.id), row]));
    const next = [];
    const seen = new Set();
    const entered = [];
    const updated = [];
    for (const row of rows) {
      const key = isRow(row) ? rowKey(row.id) : null;
      if (key === null || seen.has(key)) continue;
      seen.add(key);
      const old = before.get(key);
      if (old && sameValue(old, row)) {
        next.push(old);
      } else {
        next.push(row);
        (old ? updated : entered).push(row);
      }
    }
    const left = this._rows.filter((row) => !seen.has(rowKey(row.id)));
    const first = !this._loaded;
    this._loaded = true;
    this._show(next, { type: 'rows', entered, updated, left }, first);
  }

  /** Rows leave (by id), change and enter; each placed where the query's order puts it. */
  _onDiff(data) {
    const list = (value) => (Array.isArray(value) ? value : []);
    const leaving = new Set(list(data.leave).map(rowKey));
    const coming = new Map();
    for (const row of [...list(data.update), ...list(data.enter)]) {
      if (isRow(row)) coming.set(rowKey(row.id), row);
    }
    const before = new Map(this._rows.map((row) => [rowKey(row.id), row]));
    const next = [];
    const left = [];
    for (const row of this._rows) {
      const key = rowKey(row.id);
      if (coming.has(key)) continue;
      if (leaving.has(key)) left.push(row);
      else next.push(row);
    }
    const order = this._sorter();
    let entered = [];
    let updated = [];
    for (const [key, row] of coming) {
      const old = before.get(key);
      const placed = old && sameValue(old, row) ? old : row;
      if (!old) entered.push(row);
      else if (placed !== old) updated.push(row);
      next.splice(insertionPoint(next, placed, order), 0, placed);
    }
    const { limit } = this._shown;
    if (limit !== null && next.length > limit) {
      const cut = new Set(next.splice(limit));
      entered = entered.filter((row) => !cut.has(row));
      updated = updated.filter((row) => !cut.has(row));
      for (const row of cut) {
        const old = before.get(rowKey(row.id));
        if (old) left.push(old);
      }
    }
    this._show(next, { type: 'diff', entered, updated, left }, false);
  }

  /**
   * Its pending ask refused: it stops, its rows as they were. The server holds nothing of it:
   * the asks sent before the refused one were unqueried before it.
   */
  _onError(message) {
    this.error = message;
    this._active = false;
    this._client._stopQuery(this, false);
    this.dispatchEvent(new CustomEvent('error', { detail: { message } }));
  }

  /** Show `rows`, and say so, unless nothing changed (`always`: the first answer). */
  _show(rows, change, always) {
    const shown = this._rows;
    const same = rows.length === shown.length && rows.every((row, i) => row === shown[i]);
    if (same && !always) return;
    if (!same) this._rows = rows;
    this.dispatchEvent(new CustomEvent('change', { detail: { rows: this._rows, ...change } }));
  }
}

exports.ORIGIN_HEADER = ORIGIN_HEADER;
exports.STATES = STATES;
exports.RealtimeClient = RealtimeClient;
exports.LiveQuery = LiveQuery;
exports.default = RealtimeClient;
