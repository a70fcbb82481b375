"""Every queue of one server: lookup by name, creation, deletion, sweeps and checkpoints."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable
from concurrent.futures import Executor, Future
from typing import Any

import structlog

from kestreld.config import ServerConfig
from kestreld.journal import large_write
from kestreld.journal.batch import Batch, joined
from kestreld.journal.clock import monotonic, now_ms
from kestreld.journal.files import scan_folder
from kestreld.journal.handles import HandleCache
from kestreld.journal.journal_reader import Compaction
from kestreld.journal.retire import retire_segments
from kestreld.journal.tick import Tick
from kestreld.journal.writer import JournalWriteError
from kestreld.names import split_queue_name
from kestreld.queues.alias import AliasedQueue
from kestreld.queues.item import QueueItem
from kestreld.queues.journaled_queue import JournaledQueue, QueueFull
from kestreld.queues.reader import Reader

log = structlog.get_logger("kestreld.queues")


class Kestrel2JournalsFound(Exception):
    """The queue folder holds Kestrel 2.x journals, which must be imported first."""

    def __init__(self, folder: str, paths: list[str]) -> None:
        self.folder = folder
        self.paths = paths
        names = ", ".join(os.path.basename(p) for p in paths[:10])
        more = f" and {len(paths) - 10} more" if len(paths) > 10 else ""
        super().__init__(
            f"{folder} holds Kestrel 2.x journal files ({names}{more}); kestreld will not read "
            f"them as its own format. Import them with: kestreld journal import-kestrel2 "
            f"{folder} NEW_FOLDER, then start kestreld on NEW_FOLDER."
        )


class TooManyQueues(Exception):
    """A new queue name beyond ``max_queues``: refused, nothing created."""

    def __init__(self, name: str, limit: int) -> None:
        self.name = name
        self.limit = limit
        super().__init__(f"too many queues (max_queues = {limit}); {name} not created")


class NotOwned(Exception):
    """A queue another worker owns (``workers = N``): this worker never opens its journal."""

    def __init__(self, name: str) -> None:
        super().__init__(f"queue {name} belongs to another worker")
        self.name = name


class QueueCollection:
    __slots__ = (
        "config",
        "executor",
        "queues",
        "aliases",
        "queue_creates",
        "queue_deletes",
        "queue_expires",
        "_checkpointing",
        "_compacting",
        "tick",
        "handles",
        "_sweeping",
        "_unsettled",
        "owns",
        "elsewhere",
        "box_queues",
    )

    def __init__(
        self,
        config: ServerConfig,
        executor: Executor | None = None,
        owns: Callable[[str], bool] | None = None,
    ) -> None:
        self.config = config
        self.executor = executor
        #: Every queue's writer journal flushes in this one callback per event-loop tick.
        self.tick = Tick()
        #: The journals' share of the open-file limit (the server sets it at start).
        self.handles = HandleCache()
        self.queues: dict[str, JournaledQueue] = {}
        # Names whose puts go to other queues; an alias masks a queue of its name.
        self.aliases: dict[str, AliasedQueue] = {}
        self.queue_creates = 0
        self.queue_deletes = 0
        self.queue_expires = 0
        self._checkpointing = False
        #: The queues the expiry sweep visits: those with something that may expire or
        #: time out (JournaledQueue.has_deadlines), not every queue.
        self._sweeping: set[JournaledQueue] = set()
        #: Queues the next checkpoint round visits besides those whose journal changed
        #: (loaded ones, and those whose last rewrite failed or was still running).
        self._unsettled: set[JournaledQueue] = set()
        # The rewrites running off the loop (shutdown waits for them).
        self._compacting: tuple[Future, list[Compaction]] | None = None
        #: With ``workers = N``: True for the queue names this worker owns (it loads and
        #: creates no other: each journal keeps one writer); None: every queue is ours.
        self.owns = owns
        #: With ``workers = N``: puts to another worker's queue (an alias's destination, an
        #: error queue, expire_to_queue): (name, data, expire_time, error_count) -> the
        #: batch resolved once that worker has the item (set by relay_puts_to).
        self.elsewhere: Callable[..., Batch] | None = None
        #: With ``workers = N``: ``max_queues`` counts the box's queues, not this worker's
        #: (kestreld/workers/queue_budget.py: ``admit(mine, limit) -> bool``).
        self.box_queues: Any = None

    # --- start-up -----------------------------------------------------------------------

    def load(self) -> None:
        """Rebuild every queue from the queue folder (raises Kestrel2JournalsFound).  On an
        event loop, the queues' large writes go to write threads until :meth:`close`."""
        large_write.start_write_threads()
        folder = self.config.queue_path
        os.makedirs(folder, exist_ok=True)
        found = scan_folder(folder)
        if found.kestrel2:
            raise Kestrel2JournalsFound(folder, found.kestrel2)
        for path in found.temporaries:
            try:
                os.unlink(path)
                log.info("temporary_removed", path=path)
            except OSError:
                pass
        for path in found.unknown:
            log.warning("unknown_file_ignored", path=path)
        self._apply_aliases(self.config)
        names = set(found.queues)
        configured: dict[str, list[str]] = {}
        for full in self.config.configured_readers():
            q, r = full.split("+", 1)
            configured.setdefault(q, []).append(r)
            names.add(q)
        if self.owns is not None:
            names = {name for name in names if self.owns(name)}
        for name in sorted(names):
            queue = JournaledQueue(
                name, self.config, executor=self.executor, tick=self.tick, handles=self.handles
            )
            for warning in queue.open(found.queues.get(name), configured.get(name, [])):
                log.warning("journal_repaired", queue=name, problem=warning)
            self._adopt(queue)
            # Flat fields, one event per reader: a fanout_only queue keeps no items itself.
            default = queue.readers.get("")
            log.info("queue_loaded", queue=name, items=default.items if default else 0)
            for rname, reader in queue.readers.items():
                if rname:
                    log.info("reader_loaded", queue=name, reader=rname, items=reader.items)

    def _adopt(self, queue: JournaledQueue) -> None:
        self.queues[queue.name] = queue
        queue.sweeps = self._sweeping
        queue.sweep_me()  # the next sweep keeps it only if something in it has a deadline
        # The next checkpoint round writes its progress files (a new queue's first ones,
        # also when nothing is ever put to it) and retires what its readers consumed.
        self._unsettled.add(queue)
        for reader in queue.readers.values():
            reader.forward_expired_to(self._forward_expired)
            reader.punt_aborted_to(self._punt_aborted)

    def _apply_aliases(self, config: ServerConfig) -> None:
        """Create, update and drop aliases to match the config."""
        for name in list(self.aliases):
            if name not in config.aliases:
                del self.aliases[name]
                log.info("alias_removed", alias=name)
        for name, destinations in config.aliases.items():
            alias = self.aliases.get(name)
            if alias is None:
                self.aliases[name] = AliasedQueue(name, destinations)
                log.info("alias_created", alias=name, destinations=",".join(destinations))
            elif alias.destinations != destinations:
                alias.reconfigure(destinations)
                log.info("alias_reconfigured", alias=name, destinations=",".join(destinations))
        masked = config.masked_queues()
        if self.owns is not None:  # with workers = N: said once, by each masked queue's owner
            masked = [name for name in masked if self.owns(name)]
        if masked:
            log.warning("queues_masked_by_aliases", queues=",".join(masked))

    # --- lookup ---------------------------------------------------------------------------

    def queue(self, name: str, create: bool) -> JournaledQueue | None:
        """The queue ``name``; created when missing and ``create`` (raises TooManyQueues).

        None for an alias (it holds nothing).  ``max_queues`` counts every queue; a queue
        named in the config (``[queues.NAME]``, ``[queues."NAME+R"]``) is never refused.
        """
        if self.aliases and name in self.aliases:
            return None
        queue = self.queues.get(name)
        if queue is None and create:
            if self.owns is not None and not self.owns(name):
                raise NotOwned(name)
            limit = self.config.max_queues
            if limit is not None and not self._configured(name):
                if self.box_queues is None:
                    if len(self.queues) >= limit:
                        raise TooManyQueues(name, limit)
                elif not self.box_queues.admit(len(self.queues), limit):
                    raise TooManyQueues(name, limit)
            queue = JournaledQueue(
                name, self.config, executor=self.executor, tick=self.tick, handles=self.handles
            )
            queue.open(
                None,
                [
                    r.split("+", 1)[1]
                    for r in self.config.configured_readers()
                    if r.split("+", 1)[0] == name
                ],
            )
            self._adopt(queue)
            self.queue_creates += 1
            log.info("queue_created", queue=name)
        return queue

    def _configured(self, name: str) -> bool:
        """Named in the config, itself or through one of its fanout readers."""
        prefix = name + "+"
        return name in self.config.queues or any(n.startswith(prefix) for n in self.config.queues)

    def reader(self, full_name: str, create: bool) -> Reader | None:
        """The reader for ``q`` or ``q+r`` (the name must be legal); raises TooManyQueues."""
        if "+" in full_name:
            qname, _, rname = full_name.partition("+")
        else:  # the usual name: no fanout reader, no split
            qname = full_name
            rname = ""
        queue = self.queue(qname, create)
        if queue is None:
            return None
        reader = queue.reader(rname, create)
        if reader is not None and reader.on_expired is None:  # a new reader
            reader.forward_expired_to(self._forward_expired)
            reader.punt_aborted_to(self._punt_aborted)
            queue.sweep_me()  # its config may set a timeout
        return reader

    def readers(self) -> list[Reader]:
        return [r for q in self.queues.values() for r in q.readers.values()]

    # --- commands -----------------------------------------------------------------------

    def relay_puts_to(self, elsewhere: Callable[..., Batch]) -> None:
        """With ``workers = N``: how a put reaches a queue another worker owns."""
        self.elsewhere = elsewhere

    def put(self, name: str, data: bytes, expire_time: int, now: int, error_count: int = 0):
        """Put to a queue or an alias: the batch to wait on, or None when already done.

        Raises QueueFull (``NOT_STORED``) or JournalWriteError (``SERVER_ERROR``).
        """
        if self.aliases:
            alias = self.aliases.get(name)
            if alias is not None:
                return alias.put(data, expire_time, now, self._put_to_queue, error_count)
        if self.owns is not None and not self.owns(name):
            return self._put_elsewhere(name, data, expire_time, error_count)
        queue = self.queue(name, create=True)
        assert queue is not None
        return queue.put(data, expire_time, now, error_count)

    def _put_to_queue(
        self, name: str, data: bytes, expire_time: int, now: int, error_count: int
    ) -> Batch | None:
        if self.owns is not None and not self.owns(name):
            # Judged here as the owner would (an alias's puts are refused before any crosses).
            if len(data) > self.config.queue(name).max_item_size:
                raise QueueFull(f"{name}: item larger than max_item_size")
            return self._put_elsewhere(name, data, expire_time, error_count)
        queue = self.queue(name, create=True)
        if queue is None:  # an alias's destination masked by an alias: refused at config load
            raise QueueFull(name)
        if len(data) > queue.config.max_item_size:  # a set checks it before reading the data
            raise QueueFull(f"{name}: item larger than max_item_size")
        return queue.put(data, expire_time, now, error_count)

    def _put_elsewhere(self, name: str, data: bytes, expire_time: int, error_count: int) -> Batch:
        if self.elsewhere is None:
            raise NotOwned(name)
        return self.elsewhere(name, data, expire_time, error_count)

    def alias(self, name: str) -> AliasedQueue | None:
        return self.aliases.get(name)

    def delete(self, full_name: str) -> None:
        """Delete a queue or a fanout reader; deleting an alias does nothing (Kestrel's rule)."""
        qname, plus, rname = full_name.partition("+")
        if qname in self.aliases:
            return
        queue = self.queues.get(qname)
        if queue is None:
            return
        if plus:
            if queue.remove_reader(rname):
                log.info("reader_deleted", queue=qname, reader=rname)
            return
        del self.queues[qname]
        queue.erase()
        self.queue_deletes += 1
        log.info("queue_deleted", queue=qname)

    def flush(self, full_name: str) -> Batch | None:
        """Drop every waiting item of ``q`` or ``q+r``; the ticket to hold the reply on."""
        reader = self.reader(full_name, create=False)
        if reader is not None:
            return _flush(reader, full_name)
        return None

    def flush_all(self) -> Batch | None:
        """Flush every reader; one ticket for all their jumps (None: nothing to wait for)."""
        return joined([_flush(reader, reader.full_name) for reader in self.readers()])

    def flush_expired(self, full_name: str) -> int:
        reader = self.reader(full_name, create=False)
        if reader is None:
            return 0
        return reader.discard_expired(now_ms())

    def flush_all_expired(self) -> int:
        now = now_ms()
        return sum(r.discard_expired(now) for r in self.readers())

    def _forward_expired(self, reader: Reader, item: QueueItem) -> None:
        target = reader.config.expire_to_queue
        if (
            not target
            or split_queue_name(target) is None
            or target.partition("+")[0] == reader.queue_name
        ):
            return
        try:
            self.put(target.partition("+")[0], item.data, 0, now_ms(), item.error_count)
        except (QueueFull, JournalWriteError, TooManyQueues, NotOwned) as e:
            log.warning(
                "expire_to_queue_failed", queue=reader.full_name, target=target, error=str(e)
            )

    def _punt_aborted(self, reader: Reader, items: list[QueueItem]) -> list[QueueItem]:
        """Aborted items (error counts raised): move those the reader's punt keys send away.

        Returns the items that go back to the reader's head.  A move is one
        durable step: the item leaves the reader only once the target's batch
        is acknowledged (a crash in between leaves it in both, never in neither);
        a refused move gives the item back to the head.
        """
        config = reader.config
        if config.punt_error_to_queue is None and config.punt_many_errors_to_queue is None:
            return items
        back = []
        for item in items:
            target = config.punt_target(item.error_count)
            if target is None or split_queue_name(target) is None:
                back.append(item)
                continue
            target = target.partition("+")[0]
            if target == reader.queue_name:  # an inherited default naming this queue: keep the item
                back.append(item)
                continue
            if not self._move(reader, item, target):
                back.append(item)
        return back

    def _move(self, reader: Reader, item: QueueItem, target: str) -> bool:
        """Put ``item`` to ``target``; it leaves ``reader`` once that is durable.

        False (nothing moved) when the target refused it at once.
        """
        now = now_ms()
        try:
            # Kestrel 3.0: a punted item is new in its target (added now, no expiry).
            batch = self.put(target, item.data, 0, now, item.error_count)
        except (QueueFull, JournalWriteError, OSError, NotOwned) as e:
            log.warning(
                "punt_failed",
                queue=reader.full_name,
                target=target,
                errors=item.error_count,
                error=str(e),
            )
            return False
        if batch is None or batch.done:
            self._moved(reader, item, target, batch)
        else:
            batch.add_done_callback(lambda b: self._moved(reader, item, target, b))
        return True

    def _moved(self, reader: Reader, item: QueueItem, target: str, batch: Batch | None) -> None:
        if batch is not None and batch.error is not None:
            log.warning(
                "punt_failed",
                queue=reader.full_name,
                target=target,
                errors=item.error_count,
                error=batch.error,
            )
            reader.return_items([item])
            return
        reader.punted(item)
        log.info("item_punted", queue=reader.full_name, target=target, errors=item.error_count)

    # --- periodic work ------------------------------------------------------------------

    def sweep(self) -> None:
        """Expire items, time out open reads, delete idle queues past max_queue_age.

        Only the queues with deadlines are visited; a queue left with none leaves the sweep
        (a put with an expiry, a new reader or a reload brings it back).
        """
        now = now_ms()
        mono = monotonic()
        sweeping = self._sweeping
        for queue in list(sweeping):
            if queue.deleted or self.queues.get(queue.name) is not queue:
                sweeping.discard(queue)
                continue
            for reader in list(queue.readers.values()):
                limit = reader.config.max_expire_sweep
                reader.discard_expired(now, limit if limit else None)
                stale = reader.expired_open_reads(mono)
                if stale:
                    log.info("open_reads_timed_out", queue=reader.full_name, count=len(stale))
                    reader.abort(stale)
                    for read in stale:  # each leaves the session that held it
                        if read.owner is not None:
                            read.owner.open_read_timed_out(read)
            max_queue_age = queue.config.max_queue_age
            if (
                max_queue_age
                and (mono - queue.created_at) * 1000 >= max_queue_age
                and all(r.idle() for r in queue.readers.values())
            ):
                del self.queues[queue.name]
                sweeping.discard(queue)
                queue.erase()
                self.queue_expires += 1
                log.info("queue_expired", queue=queue.name)
            elif not queue.has_deadlines():
                sweeping.discard(queue)
                queue.expiring = False

    async def checkpoint(self) -> None:
        """Write changed checkpoints (off the loop), then drop dead segments."""
        if self._checkpointing:
            return
        self._checkpointing = True
        try:
            # The queues whose journal wrote or read since the last round, and those left
            # unsettled by it: an idle queue is not visited.
            visit = self._unsettled
            self._unsettled = set()
            for writer in self.tick.take_changed():
                writer.changed = False
                queue = self.queues.get(writer.queue)
                if queue is not None and queue.journal is writer:
                    visit.add(queue)
            queues = [q for q in visit if not q.deleted]
        except BaseException:
            self._checkpointing = False
            raise
        try:
            jobs = [job for q in queues for job in q.compactions()]
            if jobs:
                if self.executor is None:
                    _run_all(jobs)
                else:
                    fut = self.executor.submit(_run_all, jobs)
                    self._compacting = (fut, jobs)
                    # Cancelled at shutdown: close() waits for the rewrites instead.
                    await asyncio.wrap_future(fut)
                self._finish_compactions(jobs)
            for queue in queues:
                if not queue.deleted:
                    dead = queue.remove_dead_segments()
                    if dead:
                        await asyncio.get_running_loop().run_in_executor(
                            self.executor,
                            retire_segments,
                            queue.name,
                            queue.folder,
                            dead,
                            self.config.archive_path,
                        )
                    for path in dead:
                        log.debug("segment_retired", queue=queue.name, path=path)
        except BaseException:
            self._unsettled.update(queues)  # not done: the next round visits them again
            raise
        finally:
            for queue in queues:
                if not queue.deleted and queue.unsettled():
                    self._unsettled.add(queue)
            self._checkpointing = False

    def reconfigure(self, config: ServerConfig) -> None:
        self.config = config
        self._apply_aliases(config)
        for queue in self.queues.values():
            queue.reconfigure(config)
            queue.sweep_me()  # its deadlines may have changed
        for full in config.configured_readers():
            self.reader(full, create=True)

    def _finish_compactions(self, jobs: list[Compaction]) -> None:
        self._compacting = None
        for job in jobs:
            job.reader.finish_compaction(job)

    def close(self) -> None:
        if self._compacting is not None:
            fut, jobs = self._compacting
            try:
                fut.result(timeout=30)
            except Exception as e:  # cancelled before it ran, or timed out
                log.error("checkpoint_failed", error=str(e) or type(e).__name__)
            self._finish_compactions(jobs)
        for queue in self.queues.values():
            for reader in queue.readers.values():
                reader.wake_waiters()
            queue.close()
        large_write.stop_write_threads()  # the journals waited for their large writes

    # --- stats --------------------------------------------------------------------------

    def totals(self) -> tuple[int, int]:
        items = nbytes = 0
        for reader in self.readers():
            items += reader.items
            nbytes += reader.bytes
        return items, nbytes


def _run_all(jobs: list[Compaction]) -> None:
    """Every rewrite of one checkpoint round (blocking; runs off the loop)."""
    for job in jobs:
        job.run()


def _flush(reader: Reader, full_name: str) -> Batch | None:
    """Flush one reader and log it (with the session trace, the event names the client)."""
    items = reader.items
    ticket = reader.flush()
    log.info("queue_flushed", queue=full_name, items=items)
    return ticket
