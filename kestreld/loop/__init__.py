"""Event-loop scheduling beside the front ends: :mod:`kestreld.loop.busy_poll`, the
poll a lone client's next request gets after its reply (``busy_poll_us``), and
:mod:`kestreld.loop.hold`, the probe of how long the loop is held (``loop_hold_*``)."""

# busy_poll is compiled: the hot-module finder goes first (kestreld.compiled).
from kestreld.compiled import install_finder as _install_finder

_install_finder()
