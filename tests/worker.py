"""A Django process the tests drive over stdin/stdout: ``python -m tests.worker COMMAND ...``.

Commands
    publish CHANNEL PAYLOAD [COUNT]  publish through the table transport, print "published"
    publish-pg CHANNEL PAYLOAD [COUNT]  the same through the pg_notify transport
    publish-redis URL CHANNEL PAYLOAD   publish through the Redis transport on the server at
                                     URL, print "published"
    hold-insert CHANNEL PAYLOAD      insert in an open transaction, as another process
                                     sharing the table would (a firm-channel publisher: plain
                                     SQL, none of realtime's publish lock), print
                                     "inserted <id>", commit when a line arrives on stdin,
                                     print "committed"
    hold-publish CHANNEL PAYLOAD     publish through realtime's store in an open transaction,
                                     print "inserted", commit when a line arrives on stdin
    hold-notice TRANSPORT USER_ID TEXT  publish a ``user.notice`` account event for USER_ID
                                     as TRANSPORT (table or pg_notify) does, in an open
                                     transaction (holding the publish lock), print
                                     "inserted", commit when a line arrives on stdin, print
                                     "committed"
    hold-write WORKSPACE_ID NAME     create a Company in an open transaction, print "created
                                     <id>", commit when a line arrives on stdin (its
                                     announcement is published then), print "committed"
    hold-trim ID                     take a trim's turn and lock row ID in it, as a trim
                                     under way holds its batch, print "locked", release
                                     when a line arrives on stdin
    trim BATCH                       wait for a line on stdin, trim until nothing expired is
                                     left, print the deleted ids as JSON
    durable-write WORKSPACE_ID NAME  create a Company in an atomic block (with the transport
                                     of ``REALTIME_TEST_SETTINGS``: a durable one that dies
                                     when asked to publish ends the process right after the
                                     commit)
    race-writes HOW IDS COUNT        print "ready", wait for a line on stdin, then add 1 to
                                     ``points`` of the Tickets IDS (comma-separated) in turn,
                                     COUNT times, as fast as it can; print "done". HOW:
                                     ``update`` (``update()`` in ``atomic()``) or ``save``
                                     (the row locked, then ``save()``, in ``atomic()``)
    broadcast-and-exit SCOPE COUNT   asyncio.run() a coroutine that broadcasts COUNT events to
                                     SCOPE and returns at once, then exit (the broadcasts run
                                     on asgiref's thread as the interpreter shuts down)
    relay                            print "ready", wait for a line on stdin, sweep the
                                     outbox (no grace) until it is empty, print the number
                                     of rows this process relayed
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any


def race_write(ticket: Any, how: str, pk: int) -> None:
    """Add 1 to the ``points`` of Ticket ``pk`` the way ``how`` says (see ``race-writes``)."""
    from django.db import transaction
    from django.db.models import F

    with transaction.atomic():
        if how == "update":
            ticket.objects.filter(pk=pk).update(points=F("points") + 1)
        else:
            row = ticket.objects.select_for_update().get(pk=pk)
            row.points += 1
            row.save(update_fields=["points"])


def main(argv: list[str]) -> None:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.settings")
    import django

    django.setup()
    from django.db import connection, transaction

    from realtime.transports.base import Transport
    from realtime.transports.pg_notify import PgNotifyTransport
    from realtime.transports.table import TableTransport
    from realtime.transports.table_store import MessageStore, channel_hash, db_now

    command, *args = argv
    if command in ("publish", "publish-pg"):
        channel, payload, *count = args
        transport: Transport = (
            TableTransport(auto_trim=False) if command == "publish" else PgNotifyTransport()
        )
        for index in range(int(count[0]) if count else 1):
            suffix = f"-{index}" if count else ""
            transport.publish([(channel, f"{payload}{suffix}".encode())])
        print("published", flush=True)
    elif command == "publish-redis":
        from realtime.transports.redis import RedisTransport

        url, channel, payload = args
        redis_transport = RedisTransport(url=url)
        redis_transport.publish([(channel, payload.encode())])
        redis_transport.close()
        print("published", flush=True)
    elif command == "hold-insert":
        channel, payload = args
        with transaction.atomic(), connection.cursor() as cursor:
            encoded = channel.encode()
            cursor.execute(
                "INSERT INTO firm_channel_messages (channel, payload, channel_hash, created_at) "
                f"VALUES (%s, %s, %s, {db_now(connection)})",
                [encoded, payload.encode(), channel_hash(encoded)],
            )
            cursor.execute("SELECT MAX(id) FROM firm_channel_messages")
            row = cursor.fetchone()
            print("inserted", row[0] if row else None, flush=True)
            sys.stdin.readline()
        print("committed", flush=True)
    elif command == "hold-publish":
        channel, payload = args
        store = MessageStore()
        with store._serialized(), transaction.atomic():
            store.insert([(channel.encode(), payload.encode())])
            print("inserted", flush=True)
            sys.stdin.readline()
        print("committed", flush=True)
    elif command == "hold-notice":
        from realtime import limits
        from realtime.transports.pg_log import publish_logged
        from realtime.transports.pg_notify import pg_channel
        from realtime.writes.packing import users_messages

        kind, user_id, text = args
        ((base, notice),) = users_messages(
            [int(user_id)], "user.notice", {"text": text}, channels=None, meta={}, budget=None
        )
        store = MessageStore()
        with store._serialized(), transaction.atomic():
            if kind == "pg_notify":
                publish_logged(
                    connection, [(base, notice, pg_channel(base))], limits.PG_NOTIFY_BUDGET
                )
            else:
                store.insert([(base.encode(), notice)])
            print("inserted", flush=True)
            sys.stdin.readline()
        print("committed", flush=True)
    elif command == "hold-write":
        from tests.testapp.models import Company

        workspace_id, name = args
        with transaction.atomic():
            company = Company.objects.create(workspace_id=int(workspace_id), name=name)
            print("created", company.pk, flush=True)
            sys.stdin.readline()
        print("committed", flush=True)
    elif command == "hold-trim":
        (id_,) = args
        with MessageStore()._trim_turn() as cursor:
            if connection.vendor != "sqlite":  # SQLite's turn is its write lock, on every row
                cursor.execute(
                    "SELECT id FROM firm_channel_messages WHERE id = %s FOR UPDATE", [id_]
                )
            print("locked", flush=True)
            sys.stdin.readline()
    elif command == "trim":
        (batch,) = args
        store = MessageStore()
        print("ready", flush=True)
        sys.stdin.readline()
        deleted: list[int] = []
        while True:
            ids = store.trim_batch(retention=60.0, batch_size=int(batch))
            deleted += ids
            if len(ids) < int(batch):
                break
        print(json.dumps(deleted), flush=True)
    elif command == "durable-write":
        from tests.testapp.models import Company

        workspace_id, name = args
        with transaction.atomic():
            Company.objects.create(workspace_id=int(workspace_id), name=name)
        print("committed", flush=True)
    elif command == "race-writes":
        from tests.testapp.models import Ticket

        how, pks = args[0], [int(pk) for pk in args[1].split(",")]
        print("ready", flush=True)
        sys.stdin.readline()
        for n in range(int(args[2])):
            race_write(Ticket, how, pks[n % len(pks)])
        print("done", flush=True)
    elif command == "broadcast-and-exit":
        import asyncio

        from realtime.broadcast import broadcast_to_scope

        scope, events = (int(arg) for arg in args)

        async def broadcast() -> None:
            for number in range(events):
                broadcast_to_scope(scope, "note", {"n": number})

        asyncio.run(broadcast())
    elif command == "relay":
        from realtime.writes import outbox
        from realtime.writes.relay import Sweeper

        sweeper = Sweeper(grace=0.0)
        print("ready", flush=True)
        sys.stdin.readline()
        relayed = 0
        while outbox.backlog("default").rows:
            relayed += sweeper.sweep_database("default")
        print(relayed, flush=True)
    else:
        raise SystemExit(f"unknown command {command!r}")


if __name__ == "__main__":
    main(sys.argv[1:])
