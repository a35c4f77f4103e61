"""What a client of live queries holds, and what the ORM says it should: the two sides every
end-to-end live-query test compares (any model, any key: integer, UUID, composite)."""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

from realtime.sockets.live_queries import queryset, read_query, row_of_instance


def apply_frames(lists: dict[str, list[dict[str, Any]]], frames: list[dict[str, Any]]) -> None:
    """Apply ``query.rows`` and ``query.diff`` frames as a client does (order by the ORM's
    answer is checked separately: here, membership and contents)."""
    for frame in frames:
        data = frame.get("data") or {}
        if frame["type"] == "query.rows":
            lists[data["id"]] = list(data["rows"])
        elif frame["type"] == "query.diff":
            rows = lists[data["id"]]
            gone = data["leave"]  # a list: a composite key's id is a JSON array
            rows[:] = [row for row in rows if row["id"] not in gone]
            for row in data["update"]:
                at = next(n for n, held in enumerate(rows) if held["id"] == row["id"])
                rows[at] = row
            for row in data["enter"]:
                assert all(held["id"] != row["id"] for held in rows), "entered twice"
                rows.append(row)


def orm_answer(ask: dict[str, Any], user: Any, scope_ids: Iterable[Any]) -> list[dict[str, Any]]:
    """The rows the query ``ask`` (a ``query`` frame's data, less its id) should list for
    ``user`` reading ``scope_ids``, in order, as the socket sends them."""
    _, shape = read_query({"id": "check", **ask})
    found = queryset(shape, user, list(scope_ids))[: shape.limit]
    return [row_of_instance(shape.options, row) for row in found]


def same_rows(held: list[dict[str, Any]], expected: list[dict[str, Any]]) -> bool:
    """Whether a client holds exactly ``expected``'s rows, with their values (any order)."""

    def key(row: dict[str, Any]) -> str:
        return json.dumps(row, sort_keys=True)

    return sorted(map(key, held)) == sorted(map(key, expected))
