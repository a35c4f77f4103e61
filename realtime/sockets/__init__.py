"""The socket side: WebSocket connections, what they read, and delivery to them.

The path of one frame::

    transport listener -> manager.on_message -> delivery.Dispatcher: plan (targets from the
    index, narrowed by the audience hook) -> send in arrival order -> connection.Socket.send_frame

``consumer`` serves one socket as a state machine over ``protocol``'s frames, reading them
through ``inbox``; ``access`` asks the auth hooks who a socket is and which scopes it reads
(handshake, watch, recheck); ``limits`` holds the per-socket limits; ``link`` reaches the
server's connection behind ``send`` through the seams of ``realtime.compat``; ``manager`` owns
this process's sockets (``index``), follows on the transport the scopes they read, and runs
housekeeping (rechecks, stalled sockets). The socket side never imports the write side: it
reads the messages of ``realtime.messages`` that a transport carries.
"""
