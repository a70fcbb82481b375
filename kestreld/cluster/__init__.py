"""Cluster membership: Twitter server sets in ZooKeeper (Kestrel 2.4's discovery).

- :mod:`kestreld.cluster.member` — the server-set member JSON (sans-IO), read by the
  client too;
- :mod:`kestreld.cluster.membership` — a server's two members (``<path_prefix>/read``
  and ``/write``) kept in step with its status over a ZooKeeper session (kazoo).

Nothing here imports the server, the protocol or the queues: the server hands
its endpoints and status in.
"""
