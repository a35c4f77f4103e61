"""Text that MySQL's and MariaDB's collations may take for the same, told apart from text no
collation does.

A live query compares text for equality in process. PostgreSQL and SQLite compare text as
Python does, character by character (``realtime.E050`` refuses a column of a collation of its
own). MySQL and MariaDB compare it by the column's collation, case-insensitive by default,
accent-insensitive for most, and blind to trailing spaces: ``"Open"`` and ``"open "`` are
``"open"`` there. Which texts a collation takes for one another is the database's to say;
what Python can say for sure is which ones *no* such collation does. ``loose_key`` folds
text into a key coarser than any of them: two texts of different keys are different for
every collation, two equal texts are the same for every one, and two texts that differ but
share a key (``"Open"`` and ``"open"``, ``"Zürich"`` and ``"zurich"``, ``"a-b"`` and ``"ab"``)
are the database's to compare: the live query reads its rows again, and a key written in
another form than the row holds (``Locker(owner_id="ANN")`` for the account ``"ann"``) is
matched to the row the database found for it (``realtime.paths.pks_by_value``).
"""

from __future__ import annotations

import functools
import unicodedata
from typing import Final

#: Letters Unicode does not decompose that collations take for others (``æ`` is ``ae`` under
#: ``utf8mb4_unicode_ci``, ``ø`` an ``o`` with an accent under the accent-insensitive ones).
LETTER_FORMS: Final = str.maketrans(
    {
        "æ": "ae",
        "œ": "oe",
        "ø": "o",
        "đ": "d",
        "ð": "d",
        "ł": "l",
        "ŀ": "l",
        "ħ": "h",
        "ŧ": "t",
        "\u0131": "i",  # dotless i
        "þ": "th",
    }
)
#: Katakana, which the accent- and case-insensitive Unicode collations take for hiragana:
#: moved onto hiragana.
KATAKANA: Final = range(0x30A1, 0x30F7)
KATAKANA_TO_HIRAGANA: Final = -0x60


@functools.lru_cache(maxsize=4096)
def loose_key(text: str) -> str:
    """``text`` folded so that every text a case- or accent-insensitive collation takes for it
    folds alike: compatibility forms decomposed, case folded (``ß`` is ``ss``), accents and
    every character but letters and digits dropped (punctuation, spaces, what collations
    ignore), katakana read as hiragana, and a letter repeated read once (``ss`` and ``s``:
    ``ß`` is ``s`` under ``utf8mb4_general_ci``)."""
    folded = unicodedata.normalize("NFKD", text).casefold().translate(LETTER_FORMS)
    kept = [
        chr(ord(char) + KATAKANA_TO_HIRAGANA) if ord(char) in KATAKANA else char
        for char in unicodedata.normalize("NFKD", folded)
        if char.isalnum()
    ]
    return "".join(char for at, char in enumerate(kept) if at == 0 or char != kept[at - 1])
