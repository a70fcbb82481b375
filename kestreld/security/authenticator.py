"""Checking a user's password: off the event loop, remembered, slowed on failure.

A password check costs a third of a second of CPU by design (scrypt), so it
runs on one thread of its own: authentications wait their turn there and
nothing else does — the event loop and the journal's threads never wait for
them.  A successful check is remembered (a keyed digest of the password, never
the password) so a client that reconnects authenticates at once.  Failures are
counted per client address and delayed (:class:`FailureLimiter`) before the
refusal goes out.
"""

from __future__ import annotations

import asyncio
import os
import time
from concurrent.futures import ThreadPoolExecutor

import structlog

from kestreld.security.auth_file import AuthFile
from kestreld.security.limiter import FailureLimiter
from kestreld.security.passwords import hash_password, verify_password
from kestreld.security.policy import User

log = structlog.get_logger("kestreld.security")

#: Remembered successful checks (name, hash) -> digest; bounded.
_REMEMBERED_LIMIT = 10_000


def parse_token(data: bytes) -> tuple[str, bytes] | None:
    """``<user> <password>`` from an auth ``set``'s data, as memcached 1.6 reads it.

    Words are separated by spaces (runs of them count as one; leading ones and
    words after the password are ignored); fewer than two words is a bad
    token (None).
    """
    words = [w for w in data.split(b" ") if w]
    if len(words) < 2:
        return None
    return words[0].decode("utf-8", "replace"), words[1]


class Authenticator:
    """The users of the auth file and the checks of their passwords."""

    def __init__(self, auth: AuthFile, limiter: FailureLimiter | None = None) -> None:
        self.auth = auth
        self.limiter = limiter or FailureLimiter()
        self._key = os.urandom(32)
        self._remembered: dict[tuple[str, str], bytes] = {}
        self._executor: ThreadPoolExecutor | None = None
        # Checked for unknown users too, so that a refusal takes as long either way.
        self._decoy = hash_password(os.urandom(16).hex())
        self._report_plaintext()

    def replace(self, auth: AuthFile) -> None:
        """Use a freshly read auth file (reload); remembered checks of changed users lapse."""
        self.auth = auth
        self._remembered.clear()
        self._report_plaintext()

    def _report_plaintext(self) -> None:
        if self.auth.plaintext_lines:
            log.warning(
                "auth_file_plaintext_passwords",
                source=self.auth.source,
                lines=self.auth.plaintext_lines,
                hint="replace them with the lines of 'kestreld passwd NAME'",
            )

    def remembered(self, name: str, password: bytes) -> User | None:
        """The user, if this exact password was checked successfully before (no waiting)."""
        user = self.auth.user(name)
        if user is None:
            return None
        import hmac  # loaded by the first authentication (see _digest)

        digest = self._remembered.get((name, user.password_hash))
        if digest is None or not hmac.compare_digest(digest, self._digest(password)):
            return None
        return user

    async def authenticate(self, name: str, password: bytes, peer: str | None) -> User | None:
        """The user when ``password`` is theirs, else None after the failure delay."""
        user = self.remembered(name, password)
        if user is not None:
            self.succeeded(user, peer)
            return user
        user = self.auth.user(name)
        encoded = user.password_hash if user is not None else self._decoy
        if encoded.startswith("$scrypt$"):
            if self._executor is None:
                self._executor = ThreadPoolExecutor(1, thread_name_prefix="kestreld-auth")
            loop = asyncio.get_running_loop()
            ok = await loop.run_in_executor(self._executor, verify_password, password, encoded)
        else:  # a password stored in the clear (memcached's file format)
            import hmac

            ok = hmac.compare_digest(encoded.encode("utf-8"), password)
        if ok and user is not None and self.auth.user(name) is user:
            if len(self._remembered) >= _REMEMBERED_LIMIT:
                self._remembered.clear()
            self._remembered[(name, user.password_hash)] = self._digest(password)
            self.succeeded(user, peer)
            return user
        await self.refused(peer, name, "unknown user" if user is None else "wrong password")
        return None

    def succeeded(self, user: User, peer: str | None) -> None:
        if peer is not None:
            self.limiter.succeeded(peer)

    async def refused(self, peer: str | None, name: str | None, reason: str) -> None:
        """Log a failed authentication and count it for the address; wait its delay."""
        delay = self.limiter.failed(peer or "", time.monotonic())
        log.warning(
            "auth_failed",
            peer=peer,
            user=None if name is None else name[:64],
            reason=reason,
            failures=self.limiter.failures(peer or ""),
            delay=delay,
        )
        if delay:
            await asyncio.sleep(delay)

    def _digest(self, password: bytes) -> bytes:
        # hashlib and hmac (OpenSSL's digest tables, 0.6 MiB) are imported by the first
        # authentication: a server without an auth file never loads them.
        import hashlib
        import hmac

        return hmac.new(self._key, password, hashlib.sha256).digest()

    def close(self) -> None:
        if self._executor is not None:
            self._executor.shutdown(wait=False, cancel_futures=True)
            self._executor = None
