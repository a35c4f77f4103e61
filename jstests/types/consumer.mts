// Everything realtime.js offers, used as a TypeScript application would: `tsc -p jstests/types`
// fails when realtime.d.ts stops describing it (each @ts-expect-error must stay an error).

import RealtimeClientDefault, {
  LiveQuery,
  ORIGIN_HEADER,
  RealtimeClient,
  STATES,
  type EventFrame,
  type LiveQueryAsk,
  type LiveQueryChange,
  type LiveQueryState,
  type QueryRow,
  type RealtimeClientOptions,
  type RealtimeSession,
  type RealtimeState,
  type StateDetail,
} from '../../realtime/static/realtime/realtime.js';

interface Contact {
  model: 'contact';
  id: number;
  name: string;
}

const header: 'X-Origin-Id' = ORIGIN_HEADER;
const states: readonly RealtimeState[] = STATES;
const same: typeof RealtimeClient = RealtimeClientDefault;

const options: RealtimeClientOptions = {
  url: 'ws://127.0.0.1:8000/api/ws',
  token: 'bearer',
  scope: 'acme',
  refreshToken: async () => 'fresh',
  heartbeatInterval: 30000,
  backoffStart: 1000,
  backoffMax: 30000,
  jitter: 0.5,
  connectTimeout: 10000,
  maxFrameSize: 65536,
  stampTtl: 300000,
  resume: true,
  nullsLargest: true,
  WebSocket,
  fetch,
};
const client = new RealtimeClient(options);
new RealtimeClient({ url: 'ws://x/api/ws', getToken: async () => 'bearer', scopes: ['a', 'b'] });
new RealtimeClient({ url: 'ws://x/api/ws', token: 't', refreshToken: () => undefined });
// @ts-expect-error: a token or getToken is required
new RealtimeClient({ url: 'ws://x/api/ws' });
// @ts-expect-error: the url is required
new RealtimeClient({ token: 't' });
// @ts-expect-error: a token is a string
new RealtimeClient({ url: 'ws://x/api/ws', token: 7 });

client.addEventListener('state', (event) => {
  const detail: StateDetail = event.detail;
  if (detail.state === 'open') {
    const resumed: boolean = detail.resumed;
    console.log(resumed);
  } else if (detail.state === 'reconnecting') {
    const wait: number = detail.delay + detail.attempt;
    const code: number | null = detail.code;
    console.log(wait, code, detail.reason);
  } else if (detail.state === 'refused') {
    const reason: string = detail.reason;
    console.log(reason);
  }
});
client.addEventListener('event', (event) => {
  const frame: EventFrame = event.detail;
  console.log(frame.type, frame.data, frame.cursor, frame.changed?.join(), frame.scope_id);
});
client.addEventListener('auth_success', (event) => {
  const session: RealtimeSession = event.detail.data;
  console.log(session.user_id, session.scopes.join());
});
client.addEventListener('contact.updated', (event: CustomEvent<EventFrame<Contact>>) => {
  const name: string = event.detail.data.name;
  console.log(name, event.detail.origin, event.detail.truncated, event.detail.moved);
});
const onEvent = (event: Event) => console.log(event.type);
client.addEventListener('report.ready', onEvent, { once: true });
client.removeEventListener('report.ready', onEvent);
// @ts-expect-error: a state event's detail has no `data`
client.addEventListener('state', (event) => event.detail.data);

const chained: RealtimeClient = client
  .subscribe('contact', ['contact:7', ['company']])
  .unsubscribe('company')
  .watch({ scope: 'acme' })
  .watch({ scopes: new Set(['acme', 'beta']) })
  .watch()
  .connect()
  .close();
// @ts-expect-error: channels are strings
client.subscribe(7);

const state: RealtimeState = client.state;
const reason: string | null = client.reason;
const channels: string[] = client.channels;
const resumed: boolean = client.resumed;
const cursor: string | null = client.cursor;
const watching = client.watching;
const scopes: string[] | null = 'scopes' in watching ? watching.scopes : null;
const session: RealtimeSession | null = client.session;
const origin: string = client.origin;
const settings: number[] = [
  client.heartbeatInterval,
  client.backoffStart,
  client.backoffMax,
  client.jitter,
  client.connectTimeout,
  client.maxFrameSize,
  client.stampTtl,
];
const url: string = client.url;
const resume: boolean = client.resume && client.nullsLargest;
// @ts-expect-error: the state is read, not written
client.state = 'open';

const stamp: string = client.remember(client.nextOrigin(), { model: 'contact', id: 7 });
const forgotten: boolean = client.forget(stamp);
const init: RequestInit = client.stamp({ method: 'PATCH' }, { id: '7' });
const headers: Headers = client.stamp().headers;
client.remember(client.nextOrigin(), { model: 'membership', id: [12, 'acme'] }); // a composite key
const response: Promise<Response> = client.stampedFetch('/api/contacts/7', { method: 'PATCH' });

interface Ticket {
  id: number;
  title: string;
  priority: number | null;
}

const ask: LiveQueryAsk = {
  model: 'ticket',
  where: { status: 'open', company: 42, priority__gte: 2 },
  orderBy: ['-priority'],
  limit: 50,
};
const tickets: LiveQuery<Ticket> = client.liveQuery<Ticket>(ask, {
  onChange(rows, change) {
    const titles: string[] = rows.map((row) => row.title);
    const kind: 'rows' | 'diff' = change.type;
    const moved: Ticket[] = [...change.entered, ...change.updated, ...change.left];
    const self: LiveQuery<Ticket> = this;
    console.log(titles, kind, moved, self.id);
  },
  onError: (message) => console.error(message.toUpperCase()),
  compare: (a, b) => (b.priority ?? -1) - (a.priority ?? -1) || a.id - b.id,
});
const first: Ticket | undefined = tickets.rows[0];
const loaded: boolean = tickets.loaded && tickets.active;
const refused: string | null = tickets.error;
const asked: LiveQueryState = tickets.query;
const limit: number | undefined = asked.limit;
tickets.addEventListener('change', (event) => {
  const change: LiveQueryChange<Ticket> = event.detail;
  console.log(change.rows.length);
});
tickets.addEventListener('error', (event) => console.log(event.detail.message));
const replaced: LiveQuery<Ticket> = tickets.replace({ where: { status: 'closed' }, limit: null });
const stopped: LiveQuery<Ticket> = replaced.replace().stop(); // asked again, as it is
const anyRows: LiveQuery<QueryRow> = client.liveQuery({ id: 'companies', model: 'company' });
const company: unknown = anyRows.rows[0]?.name;
const held: LiveQuery[] = client.liveQueries;
// @ts-expect-error: the model is required
client.liveQuery({ where: {} });
// @ts-expect-error: rows have an id
client.liveQuery<{ title: string }>({ model: 'ticket' });
// @ts-expect-error: a live query is made by the client
new LiveQuery();
// @ts-expect-error: the error is the server's to say
tickets.error = 'x';

console.log(first, loaded, refused, limit, stopped, company, held);
console.log(header, states, same, chained, state, reason, channels, resumed, cursor, scopes);
console.log(session, origin, settings, url, resume, forgotten, init, headers, response);
