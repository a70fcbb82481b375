"""Operator tools run as ``kestreld`` sub-commands against files or a running server."""
