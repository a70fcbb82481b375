"""Kestrel's config key names (2.4 and 3.0) and what each became in kestreld.

One table for ``kestreld convert-config`` (which translates Kestrel's Scala
configs) and for the config checks (which recognise a Kestrel name written in
a kestreld TOML file and say what it probably meant).
"""

from __future__ import annotations

#: Kestrel's server keys (``KestrelConfig``) -> kestreld's server key.
SERVER_KEYS: dict[str, str] = {
    "listenAddress": "listen_address",
    "memcacheListenPort": "port",
    "queuePath": "queue_path",
    "expirationTimerFrequency": "expiration_timer_frequency",
    "clientTimeout": "client_timeout",
    "maxOpenTransactions": "max_open_reads",
    "admin.httpPort": "metrics_port",
    "textListenPort": "text_port",
    "thriftListenPort": "thrift_port",
    "enableSessionTrace": "enable_session_trace",
    "defaultStatus": "default_status",
    "statusFile": "status_file",
    "statusChangeGracePeriod": "status_change_grace_period",
    "connectionLimitRefuseWrites": "connection_limit_refuse_writes",
    "connectionLimitRefuseReads": "connection_limit_refuse_reads",
}

#: Kestrel's per-queue keys (2.4 ``QueueBuilder``, 3.0 ``QueueBuilder`` and its
#: ``QueueReaderBuilder``) -> kestreld's per-queue key.
QUEUE_KEYS: dict[str, str] = {
    "maxItems": "max_items",
    "maxSize": "max_size",
    "maxItemSize": "max_item_size",
    "maxAge": "max_age",
    "maxMemorySize": "max_memory_size",
    "discardOldWhenFull": "discard_old_when_full",
    "keepJournal": "journal",  # 2.4
    "journaled": "journal",  # 3.0
    "syncJournal": "sync_journal",
    "journalSize": "max_journal_size",  # 3.0: the size of one journal file, as here
    "defaultJournalSize": "max_journal_size",  # 2.4: the journal's size when rotated
    "expireToQueue": "expire_to_queue",
    "maxExpireSweep": "max_expire_sweep",
    "fanoutOnly": "fanout_only",
    "maxQueueAge": "max_queue_age",
    "openTransactionTimeout": "open_transaction_timeout",
    "puntErrorToQueue": "punt_error_to_queue",
    "puntManyErrorsToQueue": "punt_many_errors_to_queue",
    "puntManyErrorsCount": "punt_many_errors_count",
    "puntManyErrorCount": "punt_many_errors_count",  # the 3.0 builder's own spelling
}

#: Kestrel keys kestreld needs no setting for, and why (convert-config leaves a comment).
NOT_NEEDED: dict[str, str] = {
    "maxJournalSize": (
        "Kestrel 2.4's compaction threshold (1 GB by default); kestreld retires whole "
        "segments without rewriting, so nothing to set (NOT max_journal_size: that is the "
        "segment size)"
    ),
    "minJournalCompactDelay": "kestreld never compacts a journal by rewriting it",
    "maxJournalOverflow": "kestreld never compacts a journal by rewriting it",
    "multifileJournal": "kestreld's journals are always segmented",
    "disableAggressiveRewrites": "kestreld never compacts a journal by rewriting it",
    "debugLogQueues": "per-queue figures are in stats and /metrics",
    "admin.statsNodes": "stats are served by the stats command and /metrics",
}

#: Kestrel keys convert-config cannot translate, and why (it names the line, exit 1).
UNTRANSLATED: dict[str, str] = {
    "connectionBacklog": "kestreld's listen backlog is fixed (4096)",
    "beFactoryClass": "no pluggable storage",
    "enableTrace": "no per-queue operation tracing; use --log-level debug",
    "whiteListClientIdForDequeue": "thrift client ids are not supported",
    "whiteListClientIdForEnqueue": "thrift client ids are not supported",
    "loggers": "kestreld logs to stderr (--log-format, --log-level); route it with the service manager",
}


def snake_case(name: str) -> str:
    """``maxItems`` -> ``max_items``."""
    out = []
    for ch in name:
        if ch.isupper():
            out.append("_" + ch.lower())
        else:
            out.append(ch)
    return "".join(out).lstrip("_")


def hint(key: str) -> str | None:
    """What a Kestrel key name found in a kestreld config probably meant, or None."""
    if key in QUEUE_KEYS:
        return f"Kestrel's {key} is {QUEUE_KEYS[key]} in kestreld"
    if key in SERVER_KEYS:
        return f"Kestrel's {key} is {SERVER_KEYS[key]} in kestreld"
    if key in NOT_NEEDED:
        return f"Kestrel's {key} has no kestreld setting: {NOT_NEEDED[key]}"
    if key in UNTRANSLATED:
        return f"Kestrel's {key} has no kestreld setting: {UNTRANSLATED[key]}"
    return None
