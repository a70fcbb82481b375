"""The queue session: what one client has open, is owed and waits for, under any front end.

- :mod:`kestreld.session.session` -- :class:`Session`, one per client: its open reads,
  its wait, its put tickets and pending replies; the verbs a front end calls
  (put, fetch, confirm, abort, flush, delete, status checks, limits, close).
- :mod:`kestreld.session.fetch` -- :class:`Fetch`, one get as a request and its outcome.
- :mod:`kestreld.session.reply` -- :class:`PendingReply`, a reply promised to the client
  that resolves to its bytes or to an error once the journal has it.
- :mod:`kestreld.session.errors` -- why a request was refused.
- :mod:`kestreld.session.traffic` -- :class:`Traffic`, the server-wide per-request counters.

The session knows nothing of a wire syntax: front ends (``kestreld.frontends``)
parse requests, call its verbs and render what they return.  It depends on
``kestreld.queues`` and ``kestreld.state`` only.
"""

# Before any compiled module of this package is imported: the extension, or its plain
# Python with KESTRELD_NO_EXTENSIONS=1 (kestreld.compiled).  Installed by the packages that
# hold compiled modules, not by ``import kestreld``: a client user's imports stay plain.
from kestreld.compiled import install_finder as _install_finder

_install_finder()
