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
