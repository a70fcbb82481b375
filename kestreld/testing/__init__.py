"""Test support shipped with the package (asyncpg's ``_testbase`` precedent).

- :mod:`kestreld.testing.process` -- :class:`KestreldProcess`, a real kestreld on a
  loopback port (start, SIGTERM, kill -9, restart), and :class:`Conn`, a raw protocol
  connection; used by ``kestreld bench`` (servers.py), the tests and scripts/lab.
- :mod:`kestreld.testing.memory_transport` -- an in-memory transport to drive real
  connections in process (the hot-path benchmark, connection-state tests).
"""
