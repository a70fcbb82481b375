"""Fixtures and helpers for power-loss tests on the lazy file system (``lazyfs.py``).

Test modules import the fixture: ``from support.power_loss import lazyfs  # noqa: F401``.
"""

from __future__ import annotations

import os

import pytest
from support.lazyfs import LazyFS, unavailable_reason


@pytest.fixture
def lazyfs(tmp_path):
    """A mounted lazy file system with an empty, durable ``queues`` folder; unmounted after."""
    reason = unavailable_reason()
    if reason is not None:
        pytest.skip(f"power-loss tests need FUSE: {reason}")
    fs = LazyFS(tmp_path / "lazyfs")
    try:
        fs.start()
    except RuntimeError as e:
        # /dev/fuse present but mounting refused (a container without CAP_SYS_ADMIN).
        last = str(e).strip().splitlines()[-1]
        pytest.skip(f"power-loss tests need FUSE: mounting a FUSE file system failed: {last}")
    try:
        os.mkdir(fs.mount / "queues")
        fs.sync_all()
        yield fs
    finally:
        fs.stop()


def fsync_dir(path: str | os.PathLike) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
