"""Giving freed item memory back to the system (glibc's malloc; elsewhere nothing is done).

An item's data (a 1 KiB value is one ``malloc`` of about 1 KiB) lives on the C heap.  When a
burst is drained, every item is freed, but glibc keeps the freed chunks in its arenas and
returns to the system only what lies at the very top of the heap: one item still queued at
the top keeps the whole burst resident.  ``malloc_trim`` walks the arenas and returns every
free page (``madvise``), wherever it lies.  A reader calls :func:`release` when its memory
empties after holding a burst (``reader.RELEASE_AFTER``): the queue's own verb (the get that
took the last item) pays for it, once per burst, and an idle server never runs it.
"""

from __future__ import annotations

import ctypes

#: mallopt's parameter numbers (malloc.h).
_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
#: Allocations from this size on get pages of their own (mmap), returned whole when freed.
#: glibc's largest: an item of up to 32 MiB comes from the heap, where the next one reuses
#: its pages.  Mapped, each 8 MiB item cost the event loop its 2,048 page faults as it
#: arrived and an munmap when freed (0.7 ms, more on a busy machine): a flood of large
#: items held the loop over 1 ms at 4% of instants, 1% so.
MMAP_THRESHOLD = 32 * 1024 * 1024
#: Free memory at the top of the heap past this is returned at once by free() itself: room
#: for the next large items, and no more than a backlog's allowance over max_memory_size.
#: The rest comes back when a reader empties (:func:`release`).
TRIM_THRESHOLD = 32 * 1024 * 1024


def _load_libc() -> ctypes.CDLL | None:
    # The process's own symbols (libc's among them): ctypes.util.find_library would load
    # tempfile, shutil and the compressors, half a MiB of every server, to find the same.
    try:
        libc = ctypes.CDLL(None)
        libc.malloc_trim  # noqa: B018  (glibc only: musl and others have none)
        libc.mallopt  # noqa: B018
    except (OSError, AttributeError):
        return None
    libc.malloc_trim.argtypes = [ctypes.c_size_t]
    libc.mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    return libc


_libc = _load_libc()


def configure() -> None:
    """Fix glibc's thresholds (called once at start-up): large items are mapped and unmapped
    whole, and a free top of the heap goes back early."""
    if _libc is not None:
        _libc.mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD)
        _libc.mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD)


def release() -> bool:
    """Return the heap's free pages to the system; True when some were returned.

    On the caller's thread, the event loop: about 18 ms per 128 MiB freed (1 KiB items), once
    per burst.  On a thread of its own the walk would leave the loop alone, but the memory
    would come back only some milliseconds after the get that emptied the queue was answered,
    later on a busy machine: whoever reads RSS once the drain is over would find it still there.
    """
    if _libc is None:
        return False
    return bool(_libc.malloc_trim(0))
