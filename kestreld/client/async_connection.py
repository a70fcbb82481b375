"""One asyncio connection to one kestreld server.

The same requests as :class:`kestreld.client.connection.Connection`, over
asyncio streams.  Error replies leave the connection usable; a broken
connection, a timeout, or a request interrupted by cancellation closes it
(a half-read reply would put the next request out of step), and breakage
comes out as :class:`ConnectionFailed`.
"""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import Awaitable, Callable
from typing import TypeVar

from kestreld.client.errors import (
    ClientError,
    CommandError,
    ConnectionFailed,
    KestrelError,
    PipelineBroken,
    ProtocolViolation,
    ServerError,
    TlsFailed,
)
from kestreld.client.tls import tls_reason
from kestreld.client.wire import (
    auth_request,
    auth_result,
    error_for,
    set_request,
    store_result,
    value_size,
)

T = TypeVar("T")


class AsyncConnection:
    """One connection; one request at a time (the pool sees to that).

    Not connected until the first request; reconnects by itself after a
    failure (a reconnected socket holds none of the old open reads).  With
    ``username`` and ``password`` every socket authenticates first; ``tls``
    is the client's TLS context.
    """

    def __init__(
        self,
        host: str,
        port: int,
        *,
        connect_timeout: float,
        timeout: float,
        username: str | None = None,
        password: str | None = None,
        tls: ssl.SSLContext | None = None,
    ) -> None:
        self.host = host
        self.port = port
        self.address = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
        self.connect_timeout = connect_timeout
        self.timeout = timeout
        self.tls = tls
        self.auth = auth_request(username, password or "") if username is not None else None
        self._reader: asyncio.StreamReader | None = None
        self._writer: asyncio.StreamWriter | None = None

    # --- requests ----------------------------------------------------------------------

    async def get(self, key: str, wait: float = 0.0) -> bytes | None:
        """``get <key>``: the item's data or None.  ``wait`` is the ``/t=`` in the key, in seconds."""
        return await self._exchange(b"get %s\r\n" % key.encode("ascii"), self._read_value, wait)

    async def put(self, queue: str, data: bytes, expire: int) -> bool:
        """``set``: True when stored, False for ``NOT_STORED`` (queue full, item too large)."""

        async def read(reader: asyncio.StreamReader) -> bool:
            return store_result(await self._line(reader))

        return await self._exchange(set_request(queue, data, expire), read)

    async def put_many(self, queue: str, items: list[bytes], expire: int) -> list[bool]:
        """Pipelined ``set`` of every item; as :meth:`Connection.put_many`."""
        results: list[bool] = []

        async def read(reader: asyncio.StreamReader) -> list[bool]:
            client_error: ClientError | None = None
            for _ in items:
                line = await self._line(reader)
                try:
                    results.append(store_result(line))
                except ServerError:
                    results.append(False)
                except ClientError as e:
                    results.append(False)
                    client_error = e
            if client_error is not None:
                raise client_error
            return results

        request = b"".join(set_request(queue, data, expire) for data in items)
        try:
            return await self._exchange(request, read)
        except PipelineBroken:
            raise
        except ConnectionFailed as e:
            raise PipelineBroken(str(e), self.address, results) from None

    async def version(self) -> str:
        reply = await self.command("version")
        return reply.removeprefix(b"VERSION ").decode("ascii", "replace")

    async def command(self, line: str) -> bytes:
        """A one-line request with a one-line reply (``flush q``, ``delete q``, ``status``)."""

        async def read(reader: asyncio.StreamReader) -> bytes:
            reply = await self._line(reader)
            error = error_for(reply)
            if error is not None:
                raise error
            return reply

        return await self._exchange(line.encode("ascii") + b"\r\n", read)

    async def confirm(self, queue: str) -> bool:
        """``confirm <queue> 1``: True when an open read was confirmed, False when none was open."""
        try:
            return await self.command(f"confirm {queue} 1") == b"END"
        except CommandError:
            return False

    async def stats(self) -> tuple[list[bytes], list[bytes]]:
        """``stats`` and ``dump_stats`` in one write (one snapshot): both replies' lines."""

        async def read(reader: asyncio.StreamReader) -> tuple[list[bytes], list[bytes]]:
            return await self._lines_until_end(reader), await self._lines_until_end(reader)

        return await self._exchange(b"stats\r\ndump_stats\r\n", read)

    def usable(self) -> bool:
        """False (and closed) when the server closed this idle connection."""
        if self._reader is None or self._writer is None:
            return True
        if self._reader.at_eof() or self._writer.is_closing():
            self.close()
            return False
        return True

    def close(self) -> None:
        writer, self._writer, self._reader = self._writer, None, None
        if writer is not None:
            writer.close()

    # --- plumbing -----------------------------------------------------------------------

    async def _connect(self) -> None:
        try:
            async with asyncio.timeout(self.connect_timeout):
                self._reader, self._writer = await asyncio.open_connection(
                    self.host,
                    self.port,
                    ssl=self.tls,
                    server_hostname=self.host if self.tls is not None else None,
                )
                if self.auth is not None:
                    self._writer.write(self.auth)
                    auth_result(await self._line(self._reader), self.address)
        except KestrelError:
            self.close()
            raise
        except ssl.SSLError as e:  # first: a certificate error is a ValueError too
            self.close()
            raise TlsFailed(f"TLS failed: {tls_reason(e)}", self.address) from None
        except (OSError, TimeoutError) as e:
            self.close()
            raise ConnectionFailed(str(e) or type(e).__name__, self.address) from None

    async def _exchange(
        self,
        request: bytes,
        read: Callable[[asyncio.StreamReader], Awaitable[T]],
        wait: float = 0.0,
    ) -> T:
        if self._writer is None:
            await self._connect()
        assert self._reader is not None and self._writer is not None
        try:
            async with asyncio.timeout(self.timeout + wait):
                self._writer.write(request)
                await self._writer.drain()
                return await read(self._reader)
        except ConnectionFailed:
            self.close()
            raise
        except KestrelError:
            raise  # an error reply: the stream is still in step
        except ssl.SSLError as e:  # e.g. the server refused the client certificate (TLS 1.3)
            self.close()
            raise TlsFailed(f"TLS failed: {tls_reason(e)}", self.address) from None
        except (OSError, TimeoutError, EOFError) as e:
            self.close()
            raise ConnectionFailed(str(e) or type(e).__name__, self.address) from None
        except (asyncio.LimitOverrunError, ValueError) as e:
            self.close()
            raise ProtocolViolation(str(e).encode(), self.address) from None
        except BaseException:
            self.close()  # cancelled mid-request: the stream is out of step
            raise

    async def _line(self, reader: asyncio.StreamReader) -> bytes:
        try:
            line = await reader.readuntil(b"\r\n")
        except asyncio.IncompleteReadError:
            raise ConnectionFailed("connection closed by the server", self.address) from None
        return line[:-2]

    async def _lines_until_end(self, reader: asyncio.StreamReader) -> list[bytes]:
        lines: list[bytes] = []
        while True:
            line = await self._line(reader)
            if line == b"END":
                return lines
            if not lines:
                error = error_for(line)
                if error is not None:
                    raise error
            lines.append(line)

    async def _read_value(self, reader: asyncio.StreamReader) -> bytes | None:
        size = value_size(await self._line(reader))
        if size is None:
            return None
        try:
            block = await reader.readexactly(size + 2)
        except asyncio.IncompleteReadError:
            raise ConnectionFailed("connection closed by the server", self.address) from None
        end = await self._line(reader)
        if block[-2:] != b"\r\n" or end != b"END":
            raise ProtocolViolation(end, self.address)
        return block[:-2]
