"""The memcache text front end: framing, the command table, replies, the connection.

It sees the server through :class:`kestreld.state.ServerState` and the queues
through :mod:`kestreld.queues`; it never imports the journal or the server.
"""
