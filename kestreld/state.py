"""Server status (Kestrel 2.4): UP, READONLY or QUIESCENT, kept in the queue folder."""

from __future__ import annotations

import os
from enum import Enum

from kestreld.journal.files import STATUS_FILE


class ServerStatus(Enum):
    UP = "UP"
    READONLY = "READONLY"  # writes refused
    QUIESCENT = "QUIESCENT"  # reads and writes refused (draining before maintenance)


def load_status(folder: str) -> ServerStatus:
    """The persisted status; UP when there is none or it is unreadable."""
    try:
        with open(os.path.join(folder, STATUS_FILE)) as f:
            return ServerStatus(f.read().strip().upper())
    except (OSError, ValueError):
        return ServerStatus.UP


def save_status(folder: str, status: ServerStatus) -> None:
    """Persist atomically so a restart comes back in the same status."""
    path = os.path.join(folder, STATUS_FILE)
    tmp = path + "~~"
    with open(tmp, "w") as f:
        f.write(status.value + "\n")
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
