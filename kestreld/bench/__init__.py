"""The instrument: load tests against kestreld and memcached, the in-process hot-path
benchmark, the crash soak and the pipeline benchmark, run as ``kestreld bench ...``
(``scripts/bench``, ``scripts/soak`` and ``scripts/bench-pipeline`` call it).

Ships with the server, the way ``redis-benchmark`` ships with Redis: nothing here
is imported by the server itself.
"""
