"""The write side: from a model write, inside its transaction, to ``Transport.publish``.

The path of one write, top to bottom (each module one room)::

    decorator       @realtime_model: the model's options recorded, its receivers connected, a
                    RealtimeManager in place of Django's own managers
    querysets       loads keep what rows held (tracking); update(), bulk_create, bulk_update
                    and QuerySet.delete() enter here -> bulk
    receivers       save(), delete() and many-to-many changes enter here
      tracking      what the save changed (no query)
      audiences     who could read the row before it, when the write may change that
      events        the Event read from the instance in the transaction (payload=)
      failsafe      ... never failing the write (raised, in tests)
      on_commit     held until the outermost commit; nothing on rollback
                    (durable transports: a row of the outbox too, in the transaction)
    -- commit --
      publish       coalesce the transaction's events, ask the audiences asked after commit
                    (views: who enters, stays, leaves), build the messages (packing), hand
                    them to the transport in one call; the outbox rows are then deleted, and
                    a relay sweeps what writers left

Beside the path: ``memberships``, ``shared_roots`` and ``guard_links`` (readers gained or lost
when links change; ``link_tables``: the writes of an auto-created table of them), ``deletes``
(cascades, and rows a delete sets to NULL), ``rechecks`` (sockets to recheck when memberships
or accounts change), ``manual`` (``announce()``, ``deleting()``), ``broadcast`` and ``items``
(the application's own events), ``from_async`` (their work and ``announce()``'s, asked for from
async code, run on the thread of the caller's transaction), ``outbox``, ``outbox_form`` and
``relay`` (the durable outbox, its rows' form, and the sweeper). The write side never imports
the socket side: they meet only in ``realtime.messages``, through a transport.
"""
