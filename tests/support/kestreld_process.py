"""The process harness of the tests: the package's own (``kestreld.testing.process``).

``conftest.py`` puts this folder on the tests' path, so tests import
``kestreld_process`` as before.
"""

from kestreld.testing.process import Conn, KestreldProcess

__all__ = ["Conn", "KestreldProcess"]
