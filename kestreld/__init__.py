"""kestreld: a Kestrel-compatible message queue server (memcache text protocol)."""

__version__ = "1.0.0"
