"""kestreld: a Kestrel-compatible message queue server (memcache text protocol).

The packages that hold compiled modules (journal, queues, session, protocol) install the
finder that picks the extension or the plain Python (kestreld.compiled) when they are
imported; importing kestreld or kestreld.client installs nothing.
"""

__version__ = "1.0.0"
