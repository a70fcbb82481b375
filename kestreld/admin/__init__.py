"""The admin port (``metrics_port``): ostrich's endpoints as Kestrel 2.4 served them,
Prometheus ``/metrics``, and a live page for people.

- :mod:`kestreld.admin.http`: the HTTP server, its routes and who may change what.
- :mod:`kestreld.admin.ostrich`: ``/stats.json`` in ostrich's shape, with Kestrel's names.
- :mod:`kestreld.admin.window`: samples of the figures, for ``?period=`` and the page's rates.
- :mod:`kestreld.admin.page`: what the live page shows (``/admin/overview.json``) and its files.
"""
