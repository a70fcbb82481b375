"""The small integers the framing and its sink speak in: a request's shape, a sink's verdict.

They live apart from :mod:`kestreld.frontends.memcache.framing` so that the compiled framing and
connection can hold them as C integers (``framing.pxd``, ``connection.pxd``), while every
other module imports them from here.
"""

#: Shapes of a request.
LINE = 0  # a line only
STORAGE = 1  # <cmd> <key> <flags> <exptime> <bytes> [<cas unique>] [noreply], then a block
META_SET = 2  # ms <key> <datalen> <flag>*, then a block

#: What a sink answers for a request.
GO = 0  # done: parse the next request
STOP = 1  # done, but parse nothing more now (a wait began, output paused, closing)
LATER = 2  # not run: keep it, and stop until the sink resumes parsing
#: What a sink answers for the line of a request with a data block.
KEEP = 3  # read the block, then call ``block``
SKIP = 4  # already answered: drop the block as it arrives
