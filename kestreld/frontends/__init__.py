"""The front ends: one folder per wire format over one connection core.

- :mod:`kestreld.frontends.memcache` -- the memcache text protocol (port 22133):
  framing, the command table, replies, authentication, and its connection (compiled).
- :mod:`kestreld.frontends.text` -- Kestrel's text protocol (port 2222): its
  sans-IO parser and its connection.
- :mod:`kestreld.frontends.thrift` -- Kestrel's thrift interface (port 2229): the
  IDL, its sans-IO codec and its connection.
- :mod:`kestreld.frontends.core` -- what every front end keeps alike and is no wire
  syntax: input bounded to one request beyond the one answered (back-pressure),
  output back-pressure, replies in order, the one close path, the idle timeout.
- :mod:`kestreld.frontends.listener` -- the listening socket of each front end's port.

Front ends see the server through :class:`kestreld.state.ServerState` and the queues
through the :class:`~kestreld.session.session.Session`; they never import the journal,
the queues or the server.
"""

# Before any compiled module of this package is imported: the extension, or its plain
# Python with KESTRELD_NO_EXTENSIONS=1 (kestreld.compiled).  Installed by the packages that
# hold compiled modules, not by ``import kestreld``: a client user's imports stay plain.
from kestreld.compiled import install_finder as _install_finder

_install_finder()
