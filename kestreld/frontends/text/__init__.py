"""Kestrel's text protocol (port 2222): :mod:`.parser` (sans-IO) and :mod:`.connection`."""
