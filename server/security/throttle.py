"""The brake on guessing tokens: wrong tokens per client address, on the REST API and the sign-in form alike.

Each wrong token is counted against the address it came from for ``window_s`` seconds and logged once (the
address, where, the count; never the token). The first ``UNDELAYED_FAILURES`` are answered at once (a typo
costs nothing); each later one waits ``delay_s`` more than the one before; at ``limit`` the address's token
attempts are answered 429 with ``Retry-After`` until its oldest failure leaves the window, whatever token
they carry, so that a right guess is not told apart from a wrong one. A success does not clear the count:
a holder of one token cannot reset it between guesses at another.

The counts live in the server process (``parity server`` is one process); the address is the one uvicorn
reports, which is the proxy's ``X-Forwarded-For`` only for proxies in ``PARITY_FORWARDED_ALLOW_IPS``.
"""

from __future__ import annotations

import logging
import math
import time
from collections import OrderedDict, deque
from collections.abc import Callable

from parity.server.errors import TooManyRequests

logger = logging.getLogger(__name__)

UNDELAYED_FAILURES = 3
#: Addresses tracked at most; past it the one idle longest is forgotten (memory stays bounded under a flood).
MAX_ADDRESSES = 65_536


class GuessThrottle:
    def __init__(
        self, limit: int, window_s: float, delay_s: float, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.limit = limit
        self.window_s = window_s
        self.delay_s = delay_s
        self.clock = clock
        self._failures: OrderedDict[str, deque[float]] = OrderedDict()

    def _recent(self, address: str, now: float) -> deque[float]:
        times = self._failures.get(address)
        if times is None:
            return deque()
        while times and times[0] <= now - self.window_s:
            times.popleft()
        if not times:
            del self._failures[address]
        return times

    def check(self, address: str) -> None:
        """Raise ``TooManyRequests`` (with the seconds to wait) while ``address`` is at its limit."""
        now = self.clock()
        times = self._recent(address, now)
        if len(times) >= self.limit:
            retry_after = max(1, math.ceil(times[0] + self.window_s - now))
            raise TooManyRequests(
                f"too many wrong tokens from {address}; try again in {retry_after} s", retry_after
            )

    def failed(self, address: str, where: str) -> float:
        """Count a wrong token from ``address`` (logged once) and return how long to wait before answering."""
        now = self.clock()
        times = self._recent(address, now)
        if address not in self._failures:
            self._failures[address] = times
        self._failures.move_to_end(address)
        times.append(now)
        while len(self._failures) > MAX_ADDRESSES:
            self._failures.popitem(last=False)
        count = len(times)
        delay = self.delay_s * max(0, count - UNDELAYED_FAILURES)
        locked = " (limit reached: 429 until the window passes)" if count >= self.limit else ""
        logger.warning("wrong token from %s (%s): %d of %d in %g s, answered after %.2f s%s", address, where,
                       count, self.limit, self.window_s, delay, locked)  # fmt: skip
        return delay
