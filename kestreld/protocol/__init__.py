"""The memcache text front end: framing, the command table, replies, the connection.

It sees the server through :class:`kestreld.state.ServerState` and the queues
through :mod:`kestreld.queues`; it never imports the journal or the server.
"""

# Before any compiled module of this package is imported: the extension, or its plain
# Python with KESTRELD_NO_EXTENSIONS=1 (kestreld.compiled).  Installed by the packages that
# hold compiled modules, not by ``import kestreld``: a client user's imports stay plain.
from kestreld.compiled import install_finder as _install_finder

_install_finder()
