"""kestreld: a Kestrel-compatible message queue server (memcache text protocol)."""

from kestreld.compiled import install_finder as _install_finder

__version__ = "1.0.0"

# Before any hot module is imported: compiled or plain Python (KESTRELD_NO_EXTENSIONS=1).
_install_finder()
