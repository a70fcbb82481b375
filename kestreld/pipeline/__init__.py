"""The Spark pipeline over kestreld journals (never imported by the server).

- :mod:`~kestreld.pipeline.schema`: the data source's columns.
- :mod:`~kestreld.pipeline.listing`: which files a path names; partitions.
- :mod:`~kestreld.pipeline.columnar`: journal files as Arrow record batches.
- :mod:`~kestreld.pipeline.source`: the ``kestrel_journal`` data source (batch).
- :mod:`~kestreld.pipeline.stream`: its streaming reader.
- :mod:`~kestreld.pipeline.tables`, :mod:`~kestreld.pipeline.charts`,
  :mod:`~kestreld.pipeline.analyze`: ``kestreld analyze``.
- :mod:`~kestreld.pipeline.session`: a configured SparkSession (ships kestreld to a cluster).
- :mod:`~kestreld.pipeline.package`: the zip of kestreld the cluster's Python workers import.
- :mod:`~kestreld.pipeline.executors`: checks the executors' Python before reading.

Importing this package imports neither PySpark nor PyArrow; ``source`` and
``stream`` do (they subclass PySpark's data source classes).
"""
