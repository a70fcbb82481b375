"""The lazy file system itself: after a power cut only what was fsynced is there.

These tests pin the model the power-loss suite relies on (POSIX's minimum):
file data is durable after an fsync of the file, a name (create, rename,
unlink) after an fsync of its folder, and nothing else.
"""

from __future__ import annotations

import errno
import os

import pytest
from support import power_loss
from support.power_loss import fsync_dir

from kestreld.journal.checkpoint import read_checkpoint
from kestreld.journal.progress import rewrite

lazyfs = power_loss.lazyfs  # the fixture


def _write(path, data: bytes, *, sync: bool) -> None:
    with open(path, "wb") as f:
        f.write(data)
        f.flush()
        if sync:
            os.fsync(f.fileno())


def test_unsynced_data_is_gone_synced_data_stays(lazyfs):
    q = lazyfs.mount / "queues"
    _write(q / "a", b"synced", sync=True)
    _write(q / "b", b"never synced", sync=False)
    fsync_dir(q)
    with open(q / "a", "ab") as f:
        f.write(b" and a tail nobody synced")
    assert (q / "a").read_bytes() == b"synced and a tail nobody synced"

    lazyfs.power_cut()

    assert (q / "a").read_bytes() == b"synced"
    # The name was durable (folder fsynced), the data never was.
    assert (q / "b").read_bytes() == b""


def test_unsynced_names_are_gone_synced_names_stay(lazyfs):
    q = lazyfs.mount / "queues"
    _write(q / "kept", b"x", sync=True)
    fsync_dir(q)
    _write(q / "fsynced-file-but-not-folder", b"data", sync=True)
    os.mkdir(q / "sub")
    (q / "kept").unlink()  # an unlink nobody made durable

    lazyfs.power_cut()

    assert sorted(os.listdir(q)) == ["kept"]
    assert (q / "kept").read_bytes() == b"x"


def test_unsynced_rename_is_undone_synced_rename_stays(lazyfs):
    q = lazyfs.mount / "queues"
    _write(q / "old", b"one", sync=True)
    _write(q / "moved", b"two", sync=True)
    fsync_dir(q)
    os.replace(q / "moved", q / "moved-and-synced")
    fsync_dir(q)
    os.replace(q / "old", q / "new")

    lazyfs.power_cut()

    assert sorted(os.listdir(q)) == ["moved-and-synced", "old"]
    assert (q / "old").read_bytes() == b"one"


def test_rename_over_an_old_file_keeps_the_old_one_until_the_folder_is_synced(lazyfs):
    q = lazyfs.mount / "queues"
    _write(q / "cp", b"old", sync=True)
    fsync_dir(q)
    _write(q / "cp~~1", b"new", sync=True)
    os.replace(q / "cp~~1", q / "cp")
    assert (q / "cp").read_bytes() == b"new"

    lazyfs.power_cut()

    assert os.listdir(q) == ["cp"]
    assert (q / "cp").read_bytes() == b"old"


def test_crash_at_fails_that_fsync_and_every_later_one(lazyfs):
    q = lazyfs.mount / "queues"
    lazyfs.crash_at(2)
    _write(q / "one", b"1", sync=True)  # boundary 1: durable
    for _ in range(2):  # boundary 2 is the cut; later ones fail the same way
        with pytest.raises(OSError) as e:
            fsync_dir(q)
        assert e.value.errno == errno.EIO
    status = lazyfs.status()
    assert status["cut"] and status["boundaries"] == 2

    lazyfs.power_cut()

    # The data of "one" was durable, its name never was.
    assert os.listdir(q) == []
    assert not lazyfs.status()["cut"]


def test_checkpoint_rewrite_survives_a_power_cut(lazyfs):
    """A progress-file rewrite promises 'the old or the new file': the new one once it returns.

    Before the folder fsync after the rename, a power cut right after the
    rewrite brought back the old checkpoint (or none at all).
    """
    path = str(lazyfs.mount / "queues" / "jobs.read.")
    rewrite(path, 5, [7], sync_folder=True)
    rewrite(path, 9, [11, 12], sync_folder=True)

    lazyfs.power_cut()

    cp = read_checkpoint(path)
    assert cp is not None, "the checkpoint's name was never made durable"
    assert (cp.head, cp.done) == (9, {11, 12})
    assert os.listdir(lazyfs.mount / "queues") == ["jobs.read."]


def test_partial_writeback_keeps_some_unsynced_sectors_in_no_order(lazyfs):
    q = lazyfs.mount / "queues"
    synced = b"s" * 512
    _write(q / "f", synced, sync=True)
    fsync_dir(q)
    pages = [bytes([ord("a") + i]) * 512 for i in range(8)]
    with open(q / "f", "ab") as f:
        f.write(b"".join(pages))

    lazyfs.power_cut(writeback=0.5, seed=7)

    data = (q / "f").read_bytes()
    assert data[:512] == synced
    kept = []
    for i, page in enumerate(pages):
        got = data[512 * (i + 1) : 512 * (i + 2)]
        assert got in (page, bytes(512), b""), f"sector {i} is neither written back nor absent"
        kept.append(got == page)
    assert any(kept) and not all(kept)
    # Written back in no order: some sector landed while an earlier one did not (a hole).
    assert any(kept[j] and not kept[i] for i in range(8) for j in range(i + 1, 8))


def test_full_writeback_keeps_the_data_but_not_the_names(lazyfs):
    q = lazyfs.mount / "queues"
    _write(q / "old", b"old", sync=True)
    fsync_dir(q)
    with open(q / "old", "ab") as f:
        f.write(b" and new")
    _write(q / "unnamed", b"x", sync=False)

    lazyfs.power_cut(writeback=1.0)

    assert os.listdir(q) == ["old"]
    assert (q / "old").read_bytes() == b"old and new"
