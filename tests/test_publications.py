"""A publication's messages say where it ends, so that a worker tells a live query's client
what a transaction changed in one diff (``realtime.messages``, ``realtime.sockets.
publications``); the socket tests are in ``test_live_queries.py``."""

import json

from realtime.messages import (
    Publication,
    addressed_to,
    mark_publication,
    publication_of,
)
from realtime.sockets.publications import ELSEWHERE_WAIT, OWED_WAIT, Publications


def test_each_message_of_a_publication_says_what_follows_on_its_channel() -> None:
    messages = [
        ("rt_1", b'{"target":"scope","n":1}'),
        ("rt", b'{"target":"users","n":2,"user_ids":[7,8]}'),
        ("rt_1", b'{"target":"scope","n":3}'),
    ]
    marked = mark_publication(messages)
    places = [publication_of(payload) for _, payload in marked]
    assert [(p.rest, p.channels) for p in places if p] == [(1, 2), (0, 2), (0, 2)]
    assert len({p.id for p in places if p}) == 1
    for (channel, payload), (was_channel, was) in zip(marked, messages, strict=True):
        assert channel == was_channel
        read = json.loads(payload)
        assert read.pop("pub")[1:] in ([1, 2], [0, 2])
        assert read == json.loads(was)
    assert addressed_to(marked[1][1]) == [7, 8]  # still read from the end


def test_a_publication_of_one_message_is_left_as_it_is() -> None:
    messages = [("rt_1", b'{"target":"scope"}')]
    assert mark_publication(messages) == messages
    assert publication_of(messages[0][1]) is None


def test_a_message_the_mark_would_take_past_the_budget_is_left_unmarked() -> None:
    short, full = b'{"n":1}', b'{"n":"' + b"x" * 92 + b'"}'
    assert len(full) == 100
    marked = mark_publication([("rt_1", short), ("rt_1", full)], budget=100)
    assert publication_of(marked[0][1]) is not None
    assert marked[1][1] == full  # at the transport's cap already: kept whole, unmarked


def test_a_message_of_another_layout_has_no_place() -> None:
    for payload in (b'{"pub":[1,2,3],"a":1}', b'{"pub":["x",2],"a":1}', b'{"pub":"x"}', b"{}"):
        assert publication_of(payload) is None


def test_a_publication_is_whole_once_every_channel_ended() -> None:
    publications = Publications()
    assert publications.whole
    first = Publication("p", 1, 2)
    assert not publications.take(first)
    publications.carried("rt_1", first)
    assert not publications.whole
    assert publications.wait() == OWED_WAIT  # rt_1 owes one more
    second = Publication("p", 0, 2)
    assert publications.take(second)
    publications.carried("rt_1", second)
    assert not publications.whole
    assert publications.wait() == ELSEWHERE_WAIT  # the other channel may not be heard here
    third = Publication("p", 0, 2)
    assert publications.take(third)
    publications.carried("rt", third)
    assert publications.whole
    # Another publication (or a message alone) begins: the one before is over.
    assert not publications.take(Publication("q", 3, 1))
    assert not publications.take(None)
    assert publications.whole
