"""Keeping a quiet socket resumable: a fresh cursor for an opted-in socket's ``heartbeat``.

A cursor is stamped with the time it was handed out and resumes for
``REALTIME_RESUME_WINDOW`` seconds. A page that stays open and quiet longer than that would
hold only an expired cursor, and reload everything after the smallest blip. So a socket that
opted in to resume has each ``heartbeat`` answered with ``{"type": "cursor", "cursor": c}``:
a cursor stamped now, at a position ``P`` it is known to have every frame up to. Sockets that
did not opt in get no answer (their frames stay byte for byte what they were). A recheck
that changes the scopes an opted-in socket reads hands it the same frame unasked
(``SocketManager._hand_cursor``), so that the cursor it keeps names those scopes (a scope
gained, from where the socket started hearing it: ``Socket.scopes_named``).

Choosing ``P`` is the whole matter: a resume from ``P`` replays what the log holds after
``P`` and nothing at or below it, so ``P`` must be a position such that the socket was handed
every frame of a message at or below it that it was to get. Two positions are known to be so:

* the socket's ``floor``: where its handshake started it (the log's last position then, or
  the highest position its resume read); the frames up to it were replayed or were not its to
  get (published before it came), and frames of messages at or below it that reach the worker
  later are not sent to it (``Socket.has_heard``);
* the dispatcher's ``carried``: the highest position of a message it finished carrying out.
  Transports that keep a log hand messages over in position order (the table poller reads
  above its floor in id order, and ids become visible in commit order because publishers
  serialize on the log; pg_notify's ``Sequencer`` hands positions over in order, catching up
  from the log after an outage or a full queue before it follows notifications again), and
  the dispatcher carries them out strictly in arrival order. So when the message at ``carried``
  has been carried out, every message of the channels this worker follows at or below it has
  been too: its frame handed to each socket it was for, directly or into ``Socket.held``.
  Messages still queued, being planned, or not yet read by the transport (behind, in an
  outage, catching up) are above it, and a resume from ``P`` replays them.

``P`` is the larger of the two in each stream the socket hears (a global log is one stream;
Redis has one per channel, each handed over in order), taken only when nothing can be on its
way to this socket out of that order:

* its frames are not held (``Socket.held`` is ``None``): during its handshake, its resume or a
  requested recheck, frames carried out wait for it, and a cursor past them would let a
  resume skip the ones dropped with the socket;
* no message is being carried out (``Dispatcher.carrying``): the socket may already have the
  frame of the message after ``carried`` (and its cursor), and a smaller cursor sent after it
  would make a resume hear that frame twice;
* nothing was ever lost on the way (``Dispatcher.trusted``): a delivery that failed, or a
  delivery task that died with messages queued, leaves messages below later positions that
  some sockets never got. From then on ``carried`` is not used; the ``floor`` still is (a
  resume from it replays whatever was lost after it), and so is the last cursor the socket
  was handed (``Socket.handed``: its frames up to there went out to it, as that cursor said).

A socket that is still indexed has missed nothing the transport reported lost: those are
closed 1012 (``SocketManager.on_missed``). When no sound ``P`` is known (the transport keeps
no log, or the conditions above do not hold) the heartbeat gets no answer; the client keeps
the cursor it has and the next heartbeat tries again. The refreshed cursor is never behind
the last one the socket was handed, so a client that keeps the last cursor it received never
goes back.

Trimming: a refreshed ``P`` may be older than the messages the log still holds. A resume from
it is covered when nothing after ``P`` was trimmed (the log's first position is ``P + 1`` or
below, or the log is empty and its last handed-out position is ``P``: nothing came after) and
refused (``resumed: false``) otherwise, never skipping what was trimmed. A worker whose
channels hear nothing for longer than ``REALTIME_MESSAGE_RETENTION`` while others publish
keeps ``P`` where it was; once what came after ``P`` is trimmed, its sockets start afresh if
they drop.
"""

from __future__ import annotations

from realtime.positions import Vector
from realtime.sockets.connection import Socket
from realtime.sockets.delivery import Dispatcher, cursor_of
from realtime.sockets.protocol import cursor_frame


def refreshed_position(socket: Socket, dispatcher: Dispatcher) -> Vector | None:
    """Where ``socket`` is known to have every frame up to now, in each stream it hears;
    ``None`` when that is not known soundly (see the module docstring)."""
    if not socket.resumable or socket.closed or socket.held is not None:
        return None
    if dispatcher.carrying:
        return None
    return dispatcher.known(socket) or None


def cursor_answer(socket: Socket, dispatcher: Dispatcher) -> str | None:
    """The ``cursor`` frame answering an opted-in socket's ``heartbeat``; ``None``: no
    answer."""
    position = refreshed_position(socket, dispatcher)
    if position is None:
        return None
    socket.handed = position
    return cursor_frame(cursor_of(socket, position))
