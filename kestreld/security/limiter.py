"""Slowing down repeated failed authentications from one client address.

The first few failures of an address cost nothing; after that each refusal
is delayed — on that connection only, never the server — doubling up to a
ceiling.  An address that stays quiet for ``forget_after`` seconds starts
afresh, as does one that authenticates.  The table is bounded: the oldest
addresses are forgotten first, so a flood of addresses cannot grow it.
"""

from __future__ import annotations

from collections import OrderedDict

#: Failures an address may have before its refusals are delayed.
FREE_FAILURES = 3
FIRST_DELAY = 0.25  # seconds
MAX_DELAY = 5.0
FORGET_AFTER = 600.0  # seconds without a failure
MAX_ADDRESSES = 10_000


class FailureLimiter:
    """Failed authentications per address, and the delay each next refusal gets."""

    __slots__ = ("free", "first_delay", "max_delay", "forget_after", "capacity", "_failures")

    def __init__(
        self,
        *,
        free: int = FREE_FAILURES,
        first_delay: float = FIRST_DELAY,
        max_delay: float = MAX_DELAY,
        forget_after: float = FORGET_AFTER,
        capacity: int = MAX_ADDRESSES,
    ) -> None:
        self.free = free
        self.first_delay = first_delay
        self.max_delay = max_delay
        self.forget_after = forget_after
        self.capacity = capacity
        #: address -> (failures, time of the last one), least recent first.
        self._failures: OrderedDict[str, tuple[int, float]] = OrderedDict()

    def failed(self, address: str, now: float) -> float:
        """Count a failure of ``address``: seconds to wait before refusing it."""
        count, last = self._failures.pop(address, (0, now))
        if now - last > self.forget_after:
            count = 0
        count += 1
        self._failures[address] = (count, now)
        while len(self._failures) > self.capacity:
            self._failures.popitem(last=False)
        return self.delay_for(count)

    def succeeded(self, address: str) -> None:
        self._failures.pop(address, None)

    def delay_for(self, failures: int) -> float:
        if failures <= self.free:
            return 0.0
        return min(self.max_delay, self.first_delay * 2 ** (failures - self.free - 1))

    def failures(self, address: str) -> int:
        return self._failures.get(address, (0, 0.0))[0]

    def __len__(self) -> int:
        return len(self._failures)
