"""Operator tools run as ``kestreld`` sub-commands: offline programs on the queue folder,
or clients of a running server. Not the engine."""
