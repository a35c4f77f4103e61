"""The write side: from a model write, inside its transaction, to ``Transport.publish``.

The path of one ``save()``, each step one call::

    receivers.on_post_save          what changed (snapshots), then:
      preparing.prepare_write       read the event in the transaction, never failing the write
      outbox.add                    hold it until the outermost commit (nothing on rollback);
                                    durable transports: also a row of realtime_outbox, in
                                    the transaction
    -- commit --
      publish.publish               coalesce the transaction's events, ask the audiences
                                    asked after commit, build the messages (payload), and
                                    hand them to the transport in one call (then delete
                                    the outbox rows; relay sweeps what writers left)

``decorator`` declares models (recorded in ``realtime.registry``), ``cascades`` limits and adds
the deletes of a cascade, ``rechecks`` asks workers to recheck sockets when memberships or
accounts change, ``broadcast`` sends the application's own events. The write side never
imports the socket side: they meet only in ``realtime.messages``, through a transport.
"""
