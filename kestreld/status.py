"""The server's status as announced and as enforced, and the grace period between them.

Kestrel 2.4's rule (``status_change_grace_period``): a move to a *stricter*
status (UP -> READONLY) is announced at once — persisted, reported, and
shown in the server sets, so well-behaved clients stop using the server — but
enforced (requests refused) only when the grace period is over.  A *looser*
status (READONLY -> UP) is announced and enforced at once.

Sans-IO: the caller passes the monotonic time and arms its own timer for
:meth:`StatusBoard.seconds_left`; :meth:`StatusBoard.expire` then enforces.
Kestrel refused a second stricter change during a grace period; here it is
accepted and the grace period starts again, since clients need that long to
see the newer change too.
"""

from __future__ import annotations

from kestreld.state import ServerStatus


class StatusBoard:
    """The announced status, the enforced one, and when the second catches up."""

    __slots__ = ("announced", "enforced", "grace_ms", "_deadline")

    def __init__(self, status: ServerStatus, grace_ms: int = 0) -> None:
        #: What the status file, the ``status`` command and the server sets show.
        self.announced = status
        #: What requests are checked against.
        self.enforced = status
        self.grace_ms = grace_ms
        self._deadline: float | None = None

    @property
    def pending(self) -> ServerStatus | None:
        """The announced status while it waits for its grace period, else None."""
        return self.announced if self._deadline is not None else None

    def set_grace_period(self, grace_ms: int) -> None:
        """The grace period of later changes (a reload); a pending one keeps its deadline."""
        self.grace_ms = grace_ms

    def change(self, status: ServerStatus, now: float) -> bool:
        """Announce ``status`` (enforced at once unless stricter); False when nothing changed."""
        if status is self.announced:
            return False
        self.announced = status
        if status.stricter_than(self.enforced) and self.grace_ms > 0:
            self._deadline = now + self.grace_ms / 1000
        else:
            self.enforced = status
            self._deadline = None
        return True

    def seconds_left(self, now: float) -> float | None:
        """Seconds until the pending status is enforced; None when none is pending."""
        if self._deadline is None:
            return None
        return max(0.0, self._deadline - now)

    def expire(self, now: float) -> bool:
        """Enforce the pending status if its grace period is over; True when it was."""
        if self._deadline is None or now < self._deadline:
            return False
        self.enforced = self.announced
        self._deadline = None
        return True

    def enforce_now(self) -> None:
        """End any grace period early (a stopping server)."""
        self.enforced = self.announced
        self._deadline = None
