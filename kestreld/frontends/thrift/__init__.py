"""Kestrel's thrift interface (port 2229): the IDL, :mod:`.codec` (sans-IO), :mod:`.connection`."""
