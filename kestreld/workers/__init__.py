"""``workers = N``: one port, one queue folder, a worker process per core.

ownership.py (which worker owns a queue), supervisor.py (the parent process: the folder
lock, the listening sockets, the workers' lives), role.py (what a worker is told at
birth), channel.py (the local socket a worker serves its queues on to the others),
upstream.py (one connection to another worker, and its reply framing), routing.py (the
memcache command table that sends a request to the queue's owner), box_stats.py (one
``stats`` for the box: totals summed, each queue's lines from its owner), text_routing.py
and thrift_routing.py (Kestrel's text and thrift front ends, their requests run by the
queue's owner), wire_channels.py (their channels: one per wire format and worker), box_figures.py
(the same for the admin port: every worker's figures, gathered by worker 0 and merged).
"""
