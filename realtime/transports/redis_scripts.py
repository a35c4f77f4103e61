"""The two Lua scripts of the Redis transport: ``RELAY`` publishes, ``READ`` reads.

Both start by checking the stream's epoch (``META``): the meta hash records who wrote it
last, the server's ``run_id`` and its replication ID (``master_replid``); when either
differs (the server restarted, or a replica took over: either may have lost acknowledged
writes, as Redis replicates asynchronously; or the server became a replica and a primary
again without restarting: its data was replaced meanwhile by that of a primary that may have
lacked its last writes, and only its replication ID says so) or the meta is gone (flushed,
evicted, expired), the stream gets a new epoch, its old entries are dropped,
and its offsets go on from the highest one known. Whoever touches a stream first after such
an event — a publisher or a worker — rotates it, before an offset could be read under the old
epoch. The new epoch is a random value the caller passes (Lua's random numbers are seeded the
same on every call).

Each entry holds its payload (``p``), its place in the order of publishes (``o``:
``<microseconds of the server's clock>:<index in its publish>``: how streams are interleaved
when read together) and, for an outbox's relay, its key (``k``).

Every publish has a key: an outbox's relay the key of its rows, any other publish a random
one. A stream remembers the keys it took (``T:t``, each until it expires: an outbox key for
the history's window, a random one for a few seconds), so that a publish sent twice — the
client's retry after a connection broke while the reply was on its way, a sweeper's relay
of rows whose writer relayed them and died — lands once.

``RELAY``: ``KEYS`` are ``x, m, t, g`` of each stream of the publish (see ``redis_keys``:
``g`` is never touched, and keeps the call from running while a Cluster migrates its slot);
``ARGV`` the candidate epoch, the publish's key, the milliseconds a stream keeps entries (and
its keys live on without a write), the most entries a stream keeps, the milliseconds a meta
lives without a write, the largest payload sent live, the milliseconds the key is remembered,
the numbers of the streams kept by time only (``,1,3,``: the base channel, which every
account's events share, is not cut by count), the bytes of payload the call sends live at
most, then pairs of (stream number, payload), in publish order. For each message: the next
dense offset, ``XADD <ms>-<offset>`` (``ms`` never goes back, so ids grow: time-based
trimming works), and ``SPUBLISH`` on the stream's shard channel: ``<epoch>:<offset>:`` and
the payload, or nothing after the offset for a payload larger than the largest sent live or
one that would take the call's live payloads past their budget (a subscriber holds all of
a call's messages before it can read any: Redis cuts one that holds more than its
``client-output-buffer-limit pubsub``). A worker reads such a message from the stream, and
the rest of its stream after it, in order. A stream whose transaction key is already in its
``T:t`` set is skipped whole (a re-relay). One call is atomic: every message of a publish is
in its stream and sent live before any later publish. Returns ``{stream number, epoch, top
offset, 1 if skipped}`` per stream.

``READ``: ``KEYS`` ``x, m``; ``ARGV`` the candidate epoch, the meta lifetime, an offset, a
count and a byte budget. Returns ``{epoch, top offset, first offset held (-1: none), then
offset, milliseconds, payload, order, ...}``: at most ``count`` entries after that offset, in
order, and no more once their payloads reach the budget (always one at least): a page of
entries near ``REALTIME_MAX_PAYLOAD`` would otherwise keep the server from every other client
for seconds. The entries are taken a few at a time (as many as the budget left holds at the
size of the largest so far, at most ``READ_STEP``), so that the call never loads much more
than it returns. A page cut short by the budget ends below the top offset: readers tell the
end of a stream by the top, never by a page's length. An entry is found by its offset with
a binary search over the id's milliseconds (ids are ``<ms>-<offset>``, both growing): a few
``XRANGE ... COUNT 1``.
"""

from __future__ import annotations

from typing import Final

#: Entries ``READ`` takes from a stream at most per ``XRANGE``: what one call may load beyond
#: its byte budget when the entries after the first ones are larger.
READ_STEP: Final = 32

META: Final = """
local function seq_of(id) return tonumber(string.match(id, '%-(%d+)$')) end
local function ms_of(id) return tonumber(string.match(id, '^(%d+)%-')) end

-- Who writes: the server process and its replication history.
local function run_id()
  local info = redis.call('INFO', 'server', 'replication')
  return string.match(info, 'run_id:(%w+)') .. '/' .. string.match(info, 'master_replid:(%w+)')
end

-- The stream's epoch, top offset and last milliseconds; a new epoch (and no old entries)
-- when the server is not the one of its last write, or the meta is gone.
local function meta(x, m, candidate, meta_ttl)
  local rid = run_id()
  local got = redis.call('HMGET', m, 'e', 'n', 't', 'r')
  if got[1] and got[4] == rid then
    return got[1], tonumber(got[2]), tonumber(got[3])
  end
  local n, t = tonumber(got[2]) or 0, tonumber(got[3]) or 0
  local last = redis.call('XREVRANGE', x, '+', '-', 'COUNT', 1)[1]
  if last then
    n = math.max(n, seq_of(last[1]))
    t = math.max(t, ms_of(last[1]))
  end
  redis.call('DEL', x)
  redis.call('HSET', m, 'e', candidate, 'n', n, 't', t, 'r', rid)
  redis.call('PEXPIRE', m, meta_ttl)
  return candidate, n, t
end
"""

RELAY: Final = (
    META
    + """
local candidate, txn = ARGV[1], ARGV[2]
local keep, maxlen = tonumber(ARGV[3]), tonumber(ARGV[4])
local meta_ttl, inline = tonumber(ARGV[5]), tonumber(ARGV[6])
local remember, uncapped = tonumber(ARGV[7]), ARGV[8]
local live_budget, live_bytes = tonumber(ARGV[9]), 0
local time = redis.call('TIME')
local now = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
-- When, to the microsecond, and where in this publish: the order across streams.
local at = time[1] .. string.format('%06d', tonumber(time[2]))
local index = 0
local oldest = math.max(0, now - keep)
local streams, order = {}, {}
for i = 10, #ARGV, 2 do
  local s, payload = tonumber(ARGV[i]), ARGV[i + 1]
  local x, m, d = KEYS[4 * s - 3], KEYS[4 * s - 2], KEYS[4 * s - 1]
  local st = streams[s]
  if not st then
    local e, n, t = meta(x, m, candidate, meta_ttl)
    st = {e = e, n = n, t = math.max(t, now), skip = false}
    local until_ms = redis.call('ZSCORE', d, txn)
    if until_ms and tonumber(until_ms) >= now then st.skip = true end
    streams[s] = st
    table.insert(order, s)
  end
  if not st.skip then
    st.n = st.n + 1
    index = index + 1
    local id = st.t .. '-' .. st.n
    local place = at .. ':' .. index
    if remember >= keep then  -- an outbox's key: kept with the entry too
      redis.call('XADD', x, 'MINID', '~', oldest, id, 'p', payload, 'o', place, 'k', txn)
    else
      redis.call('XADD', x, 'MINID', '~', oldest, id, 'p', payload, 'o', place)
    end
    local live = st.e .. ':' .. st.n .. ':'
    if #payload <= inline and live_bytes + #payload <= live_budget then
      live = live .. payload
      live_bytes = live_bytes + #payload
    end
    redis.call('SPUBLISH', string.sub(x, 1, -3), live)
    if st.n % 64 == 0 and not string.find(uncapped, ',' .. s .. ',', 1, true) then
      redis.call('XTRIM', x, 'MAXLEN', '~', maxlen)
    end
  end
end
local result = {}
for _, s in ipairs(order) do
  local st = streams[s]
  local x, m, d = KEYS[4 * s - 3], KEYS[4 * s - 2], KEYS[4 * s - 1]
  if not st.skip then
    redis.call('HSET', m, 'n', st.n, 't', st.t)
    redis.call('PEXPIRE', x, keep)
    redis.call('ZADD', d, now + remember, txn)
    redis.call('ZREMRANGEBYSCORE', d, '-inf', '(' .. now)
    redis.call('PEXPIRE', d, math.max(keep, remember))
  end
  redis.call('PEXPIRE', m, meta_ttl)
  table.insert(result, {s, st.e, st.n, st.skip and 1 or 0})
end
return result
"""
)

READ: Final = (
    META
    + f"local STEP = {READ_STEP}\n"
    + """
-- The id of the first entry whose offset is want or more (nil: none).
local function start_of(x, want, top_ms)
  local first = redis.call('XRANGE', x, '-', '+', 'COUNT', 1)[1]
  if not first then return nil end
  if seq_of(first[1]) >= want then return first[1] end
  -- The smallest ms whose first entry at or after <ms>-<want> has an offset of want or
  -- more (or there is none): entries below want all sit before that id.
  local lo, hi = ms_of(first[1]), math.max(ms_of(first[1]), top_ms)
  while lo < hi do
    local mid = math.floor((lo + hi) / 2)
    local e = redis.call('XRANGE', x, mid .. '-' .. want, '+', 'COUNT', 1)[1]
    if (not e) or seq_of(e[1]) >= want then hi = mid else lo = mid + 1 end
  end
  local e = redis.call('XRANGE', x, lo .. '-' .. want, '+', 'COUNT', 1)[1]
  if e and seq_of(e[1]) >= want then return e[1] end
  return nil
end

local x, m = KEYS[1], KEYS[2]
local e, n, t = meta(x, m, ARGV[1], tonumber(ARGV[2]))
local after, count, budget = tonumber(ARGV[3]), tonumber(ARGV[4]), tonumber(ARGV[5])
local first = redis.call('XRANGE', x, '-', '+', 'COUNT', 1)[1]
local out = {e, n, first and seq_of(first[1]) or -1}
if count > 0 and after < n then
  local from = start_of(x, after + 1, t)
  local taken, bytes, largest, step = 0, 0, 0, 1
  while from and taken < count and bytes < budget do
    local asked = math.min(step, count - taken)
    local batch = redis.call('XRANGE', x, from, '+', 'COUNT', asked)
    from = nil
    for _, entry in ipairs(batch) do
      table.insert(out, seq_of(entry[1]))
      table.insert(out, ms_of(entry[1]))
      table.insert(out, entry[2][2])
      table.insert(out, entry[2][4] or '')
      taken = taken + 1
      bytes = bytes + #entry[2][2]
      largest = math.max(largest, #entry[2][2])
      from = '(' .. entry[1]
      if bytes >= budget then break end
    end
    if #batch < asked then from = nil end  -- the stream's end
    step = math.min(STEP, math.max(1, math.floor((budget - bytes) / math.max(largest, 1))))
  end
end
return out
"""
)
