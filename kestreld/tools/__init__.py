"""Offline programs that work on the queue folder or talk to a server: not the engine."""
