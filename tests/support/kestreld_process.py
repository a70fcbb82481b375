"""The process harness of the tests: the package's own (``kestreld.bench.process``).

``conftest.py`` puts this folder on the tests' path, so tests import
``kestreld_process`` as before.
"""

from kestreld.bench.process import Conn, KestreldProcess

__all__ = ["Conn", "KestreldProcess"]
