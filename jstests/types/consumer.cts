// The client as a CommonJS TypeScript file sees it: `require()` resolves realtime.cjs, typed
// by realtime.d.cts.

import realtime = require('../../realtime/static/realtime/realtime.cjs');

const client: realtime.RealtimeClient = new realtime.RealtimeClient({
  url: 'ws://127.0.0.1:8000/api/ws',
  token: 'bearer',
  scope: 'acme',
});
const same: typeof realtime.RealtimeClient = realtime.default;
client.addEventListener('state', (event) => console.log(event.detail.state));
client.addEventListener('contact.created', (event) => console.log(event.detail.data));
client.subscribe('contact').connect();
const header: 'X-Origin-Id' = realtime.ORIGIN_HEADER;
const states: readonly realtime.RealtimeState[] = realtime.STATES;
// @ts-expect-error: a token or getToken is required
new realtime.RealtimeClient({ url: 'ws://x/api/ws' });
const list: realtime.LiveQuery<{ id: number; name: string }> = client.liveQuery(
  { model: 'company', orderBy: ['name'] },
  { onChange: (rows) => console.log(rows.map((row) => row.name)) },
);
const live: boolean = list instanceof realtime.LiveQuery && list.stop().active;

console.log(same, header, states, live);
