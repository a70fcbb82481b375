"""``kestreld bench``: load tests against kestreld, side by side with memcached and Darner
(``scripts/bench`` calls it): the load generator (load.py), the workloads (workloads.py),
the servers it starts (servers.py), backlog and restart (backlog.py), Darner's own suite
(darner_suite.py), idle queues (many_queues.py), the tables (report.py), the commands (cli.py).

Ships with the server, the way ``redis-benchmark`` ships with Redis: nothing here is
imported by the server itself.  The instruments of the performance work live in the
repository's ``scripts/lab/``, the crash soak and the model-based test in ``tests/support/``.
"""
