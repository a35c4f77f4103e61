"""Text that MySQL's and MariaDB's collations may take for the same, told apart from text no
collation does.

A live query compares text for equality in process. PostgreSQL and SQLite compare text as
Python does, character by character (``realtime.E050`` refuses a column of a collation of its
own). MySQL and MariaDB compare it by the column's collation, case-insensitive by default,
accent-insensitive for most, blind to trailing spaces and to what Unicode calls ignorable:
``"Open"`` and ``"open "`` are ``"open"`` there, and so, under ``utf8mb4_unicode_ci``, are
Arabic-Indic digits ASCII ones, a Hebrew final letter its other form. Which texts a collation
takes for one another is the database's to say; what Python can say for sure, without the
collation's tables, is which ones *no* such collation does, and only for printable ASCII:
``loose_key`` keeps the letters (in one case) and digits of such a text, and gives ``None``
(any text may be taken for it) for a text with any other character. Two texts of different
keys are different for every collation; two texts that differ but share a key, or of which
one has no key, are the database's to compare: the live query reads its rows again.
"""

from __future__ import annotations

import functools
from typing import Final

#: The characters whose weights every collation of MySQL and MariaDB agrees on, up to case:
#: printable ASCII (punctuation and spaces are left out of keys: some collations ignore them).
PRINTABLE_ASCII: Final = frozenset(map(chr, range(0x20, 0x7F)))


@functools.lru_cache(maxsize=4096)
def loose_key(text: str) -> str | None:
    """``text``'s letters in lower case and its digits, when it is printable ASCII: every text
    a collation takes for it has the same key, or none. ``None`` for any other text."""
    if not PRINTABLE_ASCII.issuperset(text):
        return None
    return "".join(char for char in text.lower() if char.isalnum())
