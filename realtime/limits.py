"""Limits that are not settings, in one place so that tests can patch them."""

from typing import Final

#: Accounts named in one internal message (``user_ids``, ``only``), and ``EXISTS`` columns in
#: one read-check statement (databases cap the select list).
MAX_IDS_PER_MESSAGE: Final = 200
#: Relation channels one event may carry; past it the event keeps only its model's channels.
MAX_RELATION_CHANNELS: Final = 50
#: Bytes of one pg_notify message (PostgreSQL refuses 8,000).
PG_NOTIFY_BUDGET: Final = 7000
#: Characters of an ``X-Origin-Id`` value; a longer one is left out.
MAX_ORIGIN_LENGTH: Final = 64
#: The request header a client stamps its writes with.
ORIGIN_HEADER: Final = "X-Origin-Id"
#: Seconds of the fixed window client frames are counted in.
FRAME_WINDOW: Final = 10.0
#: Messages of its scopes a socket's resume reads, at most, per allowed frame (the scan
#: budget): a history busier than this on its scopes is not scanned to the end (that socket
#: starts afresh instead). The Redis transport's streams keep ``REALTIME_RESUME_MAX_FRAMES``
#: times this many.
RESUME_SCAN_PER_FRAME: Final = 50
#: Messages one publish hands the log or Redis at a time: a transaction that announces
#: 100,000 rows holds the log's publish lock (table, pg_notify) or runs a Lua call on Redis
#: (which blocks every client of that server) for one chunk at a time, not for all of them.
PUBLISH_CHUNK: Final = 500
#: Bytes of payload one statement of the table transport's publish carries at most (a single
#: larger message goes alone): under the statement size a database takes in one packet
#: (MySQL 5.7's ``max_allowed_packet`` is 4 MiB, MariaDB's 16 MiB), whatever the messages weigh.
#: The Redis transport's unkeyed publish cuts its script calls by it too: a Lua call blocks
#: every client of the server while it copies its payloads.
PUBLISH_CHUNK_BYTES: Final = 1 << 20
#: Bytes of payload one Redis publish's script call (``RELAY``) sends live on Pub/Sub at
#: most; a message past it goes by its offset only, and workers read it from the stream.
#: A call's messages all wait in each subscriber's output buffer until it reads them, and
#: Redis cuts a subscriber holding more than ``client-output-buffer-limit pubsub`` (32 MB by
#: default): a relay's call, which keeps a stream's messages whole, may carry 500 messages
#: of up to 64 KiB each sent live, which cut every worker following the stream, however
#: healthy. A sixteenth of that limit leaves room for many calls a worker has not read yet.
LIVE_CALL_BYTES: Final = 2 << 20
#: Bytes of payload one read of a Redis stream (a ``READ`` script call) returns, about: it
#: stops taking entries once they weigh this much (one at least), so a page of entries near
#: ``REALTIME_MAX_PAYLOAD`` does not hold the server for seconds; the reader asks again.
READ_CHUNK_BYTES: Final = 1 << 20
#: Rows of realtime's outbox one publish of a relay carries at most (``realtime.writes.publish``:
#: a relay made again covers the same rows per publish, under the same key). The Redis
#: transport never parts one stream's messages of such a publish between script calls, so
#: this also bounds one call: a stream's messages of this many rows.
RELAY_ROWS: Final = PUBLISH_CHUNK // 2
#: Rows of the outbox one sweep reads to find the transactions whose writers did not relay
#: them (the oldest first).
OUTBOX_ROWS_PER_SWEEP: Final = 1000
#: Transactions one sweep relays at most (each with all its rows).
OUTBOX_TXNS_PER_SWEEP: Final = 100
#: Seconds a duration may be at most, a setting's (``realtime.E007``) or a command option's:
#: 100 years. No one means more, and more breaks what the duration reaches: PostgreSQL
#: refuses the interval or the time it reaches back to, MySQL and MariaDB infinity, and
#: ``time.sleep`` a wait that large.
MAX_SECONDS: Final = 100 * 365 * 24 * 3600
#: Seconds a sweeper holds the rows it relays; past it another may relay them.
OUTBOX_LEASE: Final = 60.0
#: Rows whose latest announced version a worker remembers (``realtime.sockets.record_order``):
#: a late announcement of a row it no longer remembers is delivered as it comes.
ORDER_MEMORY: Final = 100_000
#: Seconds a writer's clock may be ahead of a worker's before the worker stops trusting the
#: order of that writer's announcements (they are delivered as they come, and it says so).
ORDER_CLOCK_AHEAD: Final = 1.0
