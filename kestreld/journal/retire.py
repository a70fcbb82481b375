"""Retiring dead segments: deleted, or moved to ``archive_path``, without a power-loss gap.

Runs off the event loop, after the checkpoints that made the segments dead
were written: ``progress.rewrite`` fsyncs the queue folder, so a segment is
only removed once the head that retired it is durable.

Archiving links the segment into the archive, fsyncs the archive folder and
only then unlinks it from the queue folder (and fsyncs that): at every
moment a power loss leaves the segment in one folder or both, never in
neither.  A rename would not do: another fsync of the queue folder (a
checkpoint, a new segment) could make the removal durable before the
archive folder's fsync made the arrival durable.  A segment found in both
after a power loss is simply archived again.
"""

from __future__ import annotations

import errno
import os

import structlog

from kestreld.journal.files import fsync_folder, make_folders

log = structlog.get_logger("kestreld.journal")


def retire_segments(queue: str, folder: str, paths: list[str], archive_path: str | None) -> None:
    """Delete (or archive) dead segment files (blocking: run in the executor)."""
    if not paths:
        return
    keep: set[str] = set()
    if archive_path:
        try:
            make_folders(archive_path)
        except OSError as e:
            log.warning("archive_failed", queue=queue, path=archive_path, error=e.strerror)
            return  # the segments stay; they are found and retired again after a restart
        for path in paths:
            target = os.path.join(archive_path, os.path.basename(path))
            try:
                os.link(path, target)
            except FileExistsError:
                pass  # archived before a power loss brought the original back
            except OSError as e:
                if e.errno == errno.EXDEV:
                    keep.add(path)  # another file system: neither a link nor a rename works
                    log.warning(
                        "segment_archive_failed",
                        queue=queue,
                        path=path,
                        error=e.strerror,
                        hint="archive_path must be on the queue folder's file system",
                    )
                    continue
                # A file system without hard links: a rename, as before, with the gap
                # (removal durable before arrival) a concurrent folder fsync can open.
                try:
                    os.replace(path, target)
                except OSError as e2:
                    keep.add(path)
                    log.warning("segment_archive_failed", queue=queue, path=path, error=e2.strerror)
        try:
            fsync_folder(archive_path)
        except OSError as e:
            log.warning("archive_failed", queue=queue, path=archive_path, error=e.strerror)
            return
    for path in paths:
        if path in keep:
            continue
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass
        except OSError as e:
            log.warning("segment_removal_failed", queue=queue, path=path, error=e.strerror)
    try:
        fsync_folder(folder)
    except OSError as e:
        log.warning("segment_removal_failed", queue=queue, path=folder, error=e.strerror)
