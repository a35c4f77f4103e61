// Generated from realtime.d.ts by scripts/build-js-client.mjs (npm run build:client): do not edit.
// The types of realtime.js, the JavaScript client of django-realtime-models
// (docs/javascript-client.md). They use EventTarget, Event, CustomEvent, AbortSignal, Headers,
// RequestInit and Response, which the DOM's `lib` and @types/node (with no DOM) both declare;
// the listener types below are the client's own, since the two name theirs differently.

/** The request header that carries a write's stamp; the server returns it as `origin`. */
export declare const ORIGIN_HEADER: 'X-Origin-Id';

/** A listener `addEventListener` takes: a function, or an object with `handleEvent`. */
export type RealtimeListener = ((event: Event) => void) | { handleEvent(event: Event): void };

/** The options of `removeEventListener`. */
export interface RealtimeListenerOptions {
  capture?: boolean;
}

/** The options of `addEventListener`. */
export interface RealtimeAddListenerOptions extends RealtimeListenerOptions {
  once?: boolean;
  passive?: boolean;
  signal?: AbortSignal;
}

/** The states a client goes through, in the order of a first connection. */
export declare const STATES: readonly ['connecting', 'open', 'reconnecting', 'refused', 'closed'];

/** `connecting`, `open`, `reconnecting`, `refused` or `closed`. */
export type RealtimeState = (typeof STATES)[number];

/** What the client uses of a WebSocket: the browser's, Node.js 22's global one, `ws`'s. */
export interface RealtimeSocket {
  readonly readyState: number;
  onopen: ((event: any) => void) | null;
  onmessage: ((event: any) => void) | null;
  onclose: ((event: any) => void) | null;
  onerror: ((event: any) => void) | null;
  send(data: string): void;
  close(code?: number): void;
}

/** A WebSocket class: `new WebSocket(url)`. */
export type RealtimeSocketClass = new (url: string) => RealtimeSocket;

/** The scopes a client reads: one slug (or `null` for none), or several. */
export type ScopeAsk = { scope?: string | null; scopes?: undefined } | { scopes: Iterable<string> };

/** A channel name (`'contact'`, `'contact:7'`) or a list of them, nested as you like. */
export type ChannelList = string | readonly ChannelList[];

/** The record a stamped write names: only its echo is dropped. */
export interface RecordRef {
  model?: string;
  /** The primary key as the frames carry it (an array for a composite key). */
  id?: QueryRowId;
}

interface CommonOptions {
  /** The socket's address, e.g. `wss://example.com/api/ws`. */
  url: string;
  /** Called once when the server refuses the token; may return the new token (or `getToken`). */
  refreshToken?: () => string | null | undefined | void | Promise<string | null | undefined | void>;
  /** The WebSocket class to use; `globalThis.WebSocket` by default. */
  WebSocket?: RealtimeSocketClass;
  /** What `stampedFetch` calls; `globalThis.fetch` by default. */
  fetch?: (input: any, init: RequestInit & { headers: Headers }) => Promise<Response>;
  /** Milliseconds between `heartbeat` frames while open; `0` for none (default 30000). */
  heartbeatInterval?: number;
  /** Milliseconds before the first reconnection attempt (default 1000). */
  backoffStart?: number;
  /** The longest wait between attempts, in milliseconds (default 30000). */
  backoffMax?: number;
  /** The share (0 to 1) of each wait drawn at random (default 1). */
  jitter?: number;
  /** Milliseconds an attempt may take to be answered; `0` for no limit (default 10000). */
  connectTimeout?: number;
  /** The longest frame the client sends (default 65536: `REALTIME_MAX_FRAME_SIZE`'s). */
  maxFrameSize?: number;
  /** Milliseconds a stamp waits for its echo before it is forgotten (default 300000). */
  stampTtl?: number;
  /** Resume after a reconnection, hearing what was missed (default true). */
  resume?: boolean;
  /**
   * Also dispatch each event frame on `document` as `realtime:<type>` (`detail`: the frame),
   * and each state change as `realtime:state` (default true; nothing without a `document`).
   */
  documentEvents?: boolean;
  /**
   * Live queries place nulls as the largest values: last in ascending order, as PostgreSQL
   * sorts them (default false: first, as SQLite and MySQL/MariaDB do).
   */
  nullsLargest?: boolean;
  /** One scope slug to read (or `null`). */
  scope?: string | null;
  /** Several scope slugs to read; wins over `scope`. */
  scopes?: Iterable<string>;
}

/** The bearer: a `token`, or a `getToken` called before every attempt (one is required). */
type TokenOptions =
  | { token: string; getToken?: () => string | Promise<string> }
  | { token?: string; getToken: () => string | Promise<string> };

/** What `new RealtimeClient(options)` takes; `url` and a token or `getToken` are required. */
export type RealtimeClientOptions = CommonOptions & TokenOptions;

/** The `data` of `auth_success`: who the socket is, what it reads, and how it resumed. */
export interface RealtimeSession {
  user_id: number | string;
  scope: string | null;
  scopes: string[];
  cursor?: string;
  resumed?: boolean;
  [key: string]: unknown;
}

/** A frame from the server: `<model>.<action>` for model writes, or an application event. */
export interface EventFrame<Data = any> {
  type: string;
  /** `{model, id, ...fields}` for a model write (`null` when truncated); the broadcast's data. */
  data: Data;
  origin?: string;
  changed?: string[];
  truncated?: boolean;
  scope_id?: number | string;
  moved?: boolean;
  cursor?: string;
}

/** The `auth_success` frame, as the `auth_success` event's `detail`. */
export interface AuthSuccessFrame {
  type: 'auth_success';
  data: RealtimeSession;
}

/** The `detail` of a `state` event. */
export type StateDetail =
  | { state: 'connecting'; reason: null }
  | { state: 'open'; reason: null; resumed: boolean }
  | {
      state: 'reconnecting';
      /** `'Invalid authentication token'` while a refused token is being refreshed. */
      reason: string | null;
      /** The close code when the socket closed. */
      code: number | null;
      error?: unknown;
      /** The wait before the attempt, in milliseconds. */
      delay: number;
      /** Attempts since the last success. */
      attempt: number;
    }
  | { state: 'refused'; reason: string; error?: unknown }
  | { state: 'closed'; reason: null };

/** A row's primary key, in JSON form: an array of values for a composite key. */
export type QueryRowId = string | number | (string | number | boolean | null)[];

/** What a live query's rows must have: the primary key as `id`. */
export interface QueryRowBase {
  id: QueryRowId;
}

/** A row of a live query: `id` and the fields the server sends (name your own type instead). */
export interface QueryRow extends QueryRowBase {
  [field: string]: any;
}

/** What `liveQuery` asks for; `model` is required. */
export interface LiveQueryAsk {
  /** 1 to 64 characters, unique among the client's queries; made by the client when left out. */
  id?: string;
  /** The model's name, as in its channel. */
  model: string;
  /** Lookups and their values, e.g. `{ status: 'open', company: 42 }` (default none). */
  where?: Record<string, unknown>;
  /** Fields, `-field` for descending; the server's default is `['pk']`. */
  orderBy?: Iterable<string> | null;
  /** The most rows, at least 1; the server's default and most: `REALTIME_QUERY_MAX_ROWS`. */
  limit?: number | null;
}

/** What a live query asks now (`LiveQuery.query`). */
export interface LiveQueryState {
  id: string;
  model: string;
  where: Record<string, unknown>;
  orderBy?: string[];
  limit?: number;
}

/** A change of a live query's rows: the `change` event's `detail`, `onChange`'s second argument. */
export interface LiveQueryChange<Row extends QueryRowBase = QueryRow> {
  /** `rows` for a whole list from the server (the answer, or sent again), `diff` for a diff. */
  type: 'rows' | 'diff';
  /** The rows now, in the query's order. */
  rows: Row[];
  /** Rows that were not in the list before. */
  entered: Row[];
  /** Rows whose content changed (the new objects; the old ones are gone from `rows`). */
  updated: Row[];
  /** Rows no longer in the list (the objects `rows` held). */
  left: Row[];
}

/** What `liveQuery` takes besides the query. */
export interface LiveQueryOptions<Row extends QueryRowBase = QueryRow> {
  /** Called on every change of the rows, and on the first answer even when it is empty. */
  onChange?: (this: LiveQuery<Row>, rows: Row[], change: LiveQueryChange<Row>) => void;
  /** Called when the server refuses the query (which stops it), with its reason. */
  onError?: (this: LiveQuery<Row>, message: string) => void;
  /** Where entering and updated rows go, instead of the client's reading of `orderBy`. */
  compare?: (a: Row, b: Row) => number;
}

/** A live query's events. */
export interface LiveQueryEventMap<Row extends QueryRowBase = QueryRow> {
  change: CustomEvent<LiveQueryChange<Row>>;
  error: CustomEvent<{ message: string }>;
}

/** A list of rows the server keeps in step with the database; made by `client.liveQuery()`. */
export declare class LiveQuery<Row extends QueryRowBase = QueryRow> extends EventTarget {
  private constructor();

  /** The query's id: the application's (each ask goes on the wire as `<n>:<id>`). */
  readonly id: string;
  /** The server's reason when it refused the query, or null. */
  readonly error: string | null;
  /** The rows in the query's order: a new array after each change; do not modify it. */
  get rows(): Row[];
  /** Whether the server has answered with rows yet. */
  get loaded(): boolean;
  /** False once stopped: by `stop()`, by a refusal, or by a query asked under the same id. */
  get active(): boolean;
  /** What is asked now. */
  get query(): LiveQueryState;

  /** Ask for other rows under the same id; what `changes` leaves out stays (all, when none). */
  replace(changes?: Partial<Omit<LiveQueryAsk, 'id'>>): this;
  /** Stop the query (`unquery`); what the server sends after is dropped. */
  stop(): this;

  addEventListener<K extends keyof LiveQueryEventMap<Row>>(
    type: K,
    listener: (this: LiveQuery<Row>, event: LiveQueryEventMap<Row>[K]) => void,
    options?: boolean | RealtimeAddListenerOptions,
  ): void;
  addEventListener(
    type: string,
    listener: RealtimeListener | null,
    options?: boolean | RealtimeAddListenerOptions,
  ): void;
  removeEventListener<K extends keyof LiveQueryEventMap<Row>>(
    type: K,
    listener: (this: LiveQuery<Row>, event: LiveQueryEventMap<Row>[K]) => void,
    options?: boolean | RealtimeListenerOptions,
  ): void;
  removeEventListener(
    type: string,
    listener: RealtimeListener | null,
    options?: boolean | RealtimeListenerOptions,
  ): void;
}

/** The client's own events; any other type is an event frame's. */
export interface RealtimeClientEventMap {
  state: CustomEvent<StateDetail>;
  event: CustomEvent<EventFrame>;
  auth_success: CustomEvent<AuthSuccessFrame>;
}

/** A socket to realtime that authenticates, resumes, reconnects and drops its own echoes. */
export declare class RealtimeClient extends EventTarget {
  constructor(options: RealtimeClientOptions);

  url: string;
  heartbeatInterval: number;
  backoffStart: number;
  backoffMax: number;
  jitter: number;
  connectTimeout: number;
  maxFrameSize: number;
  stampTtl: number;
  resume: boolean;
  documentEvents: boolean;
  nullsLargest: boolean;
  /** A random id of this client instance; writes are stamped `<origin>.<n>`. */
  origin: string;
  /** The `data` of the last `auth_success`, or null. */
  session: RealtimeSession | null;

  /** The current state. */
  get state(): RealtimeState;
  /** The server's reason behind the current state (a refusal), or null. */
  get reason(): string | null;
  /** The channels this client is subscribed to. */
  get channels(): string[];
  /** The live queries this client holds. */
  get liveQueries(): LiveQuery<any>[];
  /** Whether the last handshake resumed. */
  get resumed(): boolean;
  /** The cursor of the last frame handled, sent back to resume; null before any. */
  get cursor(): string | null;
  /** What the client asks to read. */
  get watching(): { scope: string | null } | { scopes: string[] };

  /** Open the socket (again after `close()` or a refusal); nothing while already at it. */
  connect(): this;
  /** Close the socket for good: no reconnection until `connect()` is called again. */
  close(): this;
  /** Read other scopes: `watch({scope: 'acme'})`, `watch({scopes: ['a', 'b']})`. */
  watch(ask?: ScopeAsk): this;
  /** Hear these channels, now and after every reconnect. */
  subscribe(...channels: ChannelList[]): this;
  /** Stop hearing these channels. */
  unsubscribe(...channels: ChannelList[]): this;
  /**
   * Keep a list of rows in step with the server: asked now when open, and again after every
   * reconnect. `Row` names the rows' type: `client.liveQuery<Ticket>({ model: 'ticket' })`.
   */
  liveQuery<Row extends QueryRowBase = QueryRow>(
    query: LiveQueryAsk,
    options?: LiveQueryOptions<Row>,
  ): LiveQuery<Row>;

  /** A fresh stamp for one write, `<origin>.<n>`, not remembered. */
  nextOrigin(): string;
  /** Expect the echo of a write stamped `stamp` (of `record`, when given); returns `stamp`. */
  remember(stamp: string, record?: RecordRef | null): string;
  /** Stop expecting the echo of `stamp`; whether it was expected. */
  forget(stamp: string): boolean;
  /** A copy of fetch's `init` whose headers carry a fresh, remembered `X-Origin-Id`. */
  stamp(init?: RequestInit, record?: RecordRef | null): RequestInit & { headers: Headers };
  /** `fetch` with a stamped write; a failed request forgets its stamp. */
  stampedFetch(input: any, init?: RequestInit, record?: RecordRef | null): Promise<Response>;

  addEventListener<K extends keyof RealtimeClientEventMap>(
    type: K,
    listener: (this: RealtimeClient, event: RealtimeClientEventMap[K]) => void,
    options?: boolean | RealtimeAddListenerOptions,
  ): void;
  addEventListener(
    type: string,
    listener: (this: RealtimeClient, event: CustomEvent<EventFrame>) => void,
    options?: boolean | RealtimeAddListenerOptions,
  ): void;
  addEventListener(
    type: string,
    listener: RealtimeListener | null,
    options?: boolean | RealtimeAddListenerOptions,
  ): void;
  removeEventListener<K extends keyof RealtimeClientEventMap>(
    type: K,
    listener: (this: RealtimeClient, event: RealtimeClientEventMap[K]) => void,
    options?: boolean | RealtimeListenerOptions,
  ): void;
  removeEventListener(
    type: string,
    listener: (this: RealtimeClient, event: CustomEvent<EventFrame>) => void,
    options?: boolean | RealtimeListenerOptions,
  ): void;
  removeEventListener(
    type: string,
    listener: RealtimeListener | null,
    options?: boolean | RealtimeListenerOptions,
  ): void;
}

export default RealtimeClient;
