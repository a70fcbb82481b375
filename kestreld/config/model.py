"""The server and per-queue configuration: one typed object, validated once.

The config file is TOML.  Top-level per-queue keys are the defaults for every
queue; ``[queues.NAME]`` overrides them for one queue and
``[queues."NAME+READER"]`` for one fanout reader, which inherits from NAME.
Sizes are integers (bytes) or strings with a unit ("16MiB"); durations are
integers (milliseconds) or strings with a unit ("100ms", "30s").
"""

from __future__ import annotations

import dataclasses
import importlib.util
import os
import re
import tomllib
from dataclasses import dataclass, field
from typing import Any

from kestreld.config.kestrel import hint as kestrel_hint
from kestreld.names import split_queue_name

KiB = 1024
MiB = 1024 * KiB


class ConfigError(Exception):
    """A config value or file that cannot be used; the message names the key."""


_SIZE_UNITS = {
    "": 1, "b": 1,
    "k": KiB, "kb": KiB, "kib": KiB,
    "m": MiB, "mb": MiB, "mib": MiB,
    "g": 1024 * MiB, "gb": 1024 * MiB, "gib": 1024 * MiB,
    "t": 1024**4, "tb": 1024**4, "tib": 1024**4,
}  # fmt: skip
_DURATION_UNITS = {
    "": 1, "ms": 1, "s": 1000, "sec": 1000, "seconds": 1000,
    "m": 60_000, "min": 60_000, "minutes": 60_000,
    "h": 3_600_000, "hours": 3_600_000, "d": 86_400_000, "days": 86_400_000,
}  # fmt: skip
_UNIT_RE = re.compile(r"\s*(\d+(?:\.\d+)?)\s*([A-Za-z]*)\s*")


def _parse_unit(key: str, value: Any, units: dict[str, int], what: str) -> int:
    if isinstance(value, bool):
        raise ConfigError(f"{key}: expected a {what}, got {value!r}")
    if isinstance(value, int):
        if value < 0:
            raise ConfigError(f"{key}: must not be negative (got {value})")
        return value
    if isinstance(value, float):
        raise ConfigError(f"{key}: expected an integer {what}, got {value!r}")
    if isinstance(value, str):
        if value.strip().startswith("-"):
            raise ConfigError(f"{key}: must not be negative (got {value!r})")
        m = _UNIT_RE.fullmatch(value)
        if m:
            unit = m.group(2).lower()
            if unit in units:
                return int(float(m.group(1)) * units[unit])
            raise ConfigError(f"{key}: unknown unit {m.group(2)!r} in {value!r}")
    raise ConfigError(
        f"{key}: expected a {what} like {'16MiB' if what == 'size' else '30s'}, got {value!r}"
    )


def parse_size(key: str, value: Any) -> int:
    """Bytes from an int or a string such as "16MiB" (K/M/G are powers of 1024)."""
    return _parse_unit(key, value, _SIZE_UNITS, "size")


def parse_duration(key: str, value: Any) -> int:
    """Milliseconds from an int (ms) or a string such as "100ms", "30s", "5m"."""
    return _parse_unit(key, value, _DURATION_UNITS, "duration")


def _parse_bool(key: str, value: Any) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.lower() in ("true", "on", "yes", "false", "off", "no"):
        return value.lower() in ("true", "on", "yes")
    raise ConfigError(f"{key}: expected true or false, got {value!r}")


def _parse_int(key: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigError(f"{key}: expected an integer, got {value!r}")
    if value < 0:
        raise ConfigError(f"{key}: must not be negative (got {value})")
    return value


def _parse_str(key: str, value: Any) -> str:
    if not isinstance(value, str):
        raise ConfigError(f"{key}: expected a string, got {value!r}")
    return value


def _parse_queue_ref(key: str, value: Any) -> str:
    name = _parse_str(key, value)
    if split_queue_name(name) is None:
        raise ConfigError(f"{key}: {name!r} is not a legal queue name")
    return name


# How each key's value is read, and whether 0 means "unset" for optional limits.
_SIZE, _DURATION, _BOOL, _INT, _STR, _QUEUE = "size", "duration", "bool", "int", "str", "queue"


def _parse_patterns(key: str, value: Any) -> tuple[str, ...]:
    """A list of regular expressions (``stats_filters``), each checked to compile."""
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise ConfigError(f"{key}: expected a list of regular expressions (strings)")
    for pattern in value:
        try:
            re.compile(pattern)
        except re.error as e:
            raise ConfigError(f"{key}: {pattern!r} is not a regular expression: {e}") from None
    return tuple(value)


_PATTERNS = "patterns"
_HOSTS = "hosts"
_WORKERS = "workers"


def available_cores() -> int:
    """The cores this process may run on (``workers = "auto"``)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):  # not Linux
        return max(1, os.cpu_count() or 1)


def parse_workers(key: str, value: Any) -> int:
    """``workers``: a count of at least 1, or ``"auto"`` (the cores this process may use)."""
    if isinstance(value, str) and value.strip().lower() == "auto":
        return available_cores()
    if isinstance(value, str) and value.strip().isdigit():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(f'{key}: expected a number of worker processes (1 or more) or "auto"')
    if value > 1024:
        raise ConfigError(f"{key}: at most 1024 (got {value})")
    return value


def _parse_hosts(key: str, value: Any) -> tuple[str, ...]:
    """A list of host names (``admin_allowed_hosts``), lower-cased, without ports."""
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise ConfigError(f'{key}: expected a list of host names, like ["kestreld-1.example"]')
    hosts = []
    for name in value:
        host = name.strip().lower().rstrip(".")
        if host.startswith("[") and host.endswith("]"):
            host = host[1:-1]
        if not host or any(c in host for c in " /@[]") or host.count(":") == 1:
            raise ConfigError(f"{key}: {name!r} is not a host name (give names, without a port)")
        hosts.append(host)
    return tuple(hosts)


_PARSERS = {
    _SIZE: parse_size,
    _DURATION: parse_duration,
    _BOOL: _parse_bool,
    _INT: _parse_int,
    _STR: _parse_str,
    _QUEUE: _parse_queue_ref,
    _PATTERNS: _parse_patterns,
    _HOSTS: _parse_hosts,
    _WORKERS: parse_workers,
}


@dataclass(slots=True, frozen=True)
class QueueConfig:
    """Effective settings of one queue or fanout reader (None = unset/unlimited)."""

    max_items: int | None = None
    max_size: int | None = None
    max_item_size: int = 16 * MiB
    max_age: int | None = None  # ms
    discard_old_when_full: bool = False
    journal: bool = True
    sync_journal: int | None = None  # ms between fsyncs; 0 = before every STORED; None = never
    max_journal_size: int = 16 * MiB
    max_memory_size: int = 128 * MiB
    expire_to_queue: str | None = None
    max_expire_sweep: int | None = None
    fanout_only: bool = False
    max_queue_age: int | None = None  # ms
    open_transaction_timeout: int | None = None  # ms
    # Error queues (Kestrel 3.0's puntErrorToQueue, puntManyErrorsToQueue, puntManyErrorsCount).
    punt_error_to_queue: str | None = None
    punt_many_errors_to_queue: str | None = None
    punt_many_errors_count: int = 100

    def punt_target(self, error_count: int) -> str | None:
        """Where an aborted item with this error count goes (Kestrel 3.0's rule); None = head."""
        many = self.punt_many_errors_to_queue
        if many and error_count >= self.punt_many_errors_count:
            return many
        return self.punt_error_to_queue


#: Per-queue keys in dump_config order, with their kind.
QUEUE_KEYS: dict[str, str] = {
    "max_items": _INT,
    "max_size": _SIZE,
    "max_item_size": _SIZE,
    "max_age": _DURATION,
    "discard_old_when_full": _BOOL,
    "journal": _BOOL,
    "sync_journal": _DURATION,
    "max_journal_size": _SIZE,
    "max_memory_size": _SIZE,
    "expire_to_queue": _QUEUE,
    "max_expire_sweep": _INT,
    "fanout_only": _BOOL,
    "max_queue_age": _DURATION,
    "open_transaction_timeout": _DURATION,
    "punt_error_to_queue": _QUEUE,
    "punt_many_errors_to_queue": _QUEUE,
    "punt_many_errors_count": _INT,
}
_DURATION_KEYS = {k for k, kind in QUEUE_KEYS.items() if kind == _DURATION}
_SIZE_KEYS = {k for k, kind in QUEUE_KEYS.items() if kind == _SIZE}


STATUSES = ("UP", "WRITEAVOID", "READONLY", "QUIESCENT")
ZOOKEEPER_ACLS = ("open_unsafe", "everyone_read_creator_all")
ZOOKEEPER_PORT = 2181
DEFAULT_ZOOKEEPER_HOSTS = f"127.0.0.1:{ZOOKEEPER_PORT}"


@dataclass(slots=True, frozen=True)
class ZooKeeperConfig:
    """``[zookeeper]``: the ensemble, and where this server joins its server sets."""

    hosts: str = DEFAULT_ZOOKEEPER_HOSTS  # "zk1:2181,zk2:2181"
    path_prefix: str = ""  # required: members go to <path_prefix>/read and /write
    session_timeout: int = 10_000  # ms
    credentials: str | None = None  # "user:password", ZooKeeper digest auth
    acl: str = "open_unsafe"  # or everyone_read_creator_all (needs credentials)
    advertise_address: str | None = None  # None: listen_address

    def host_list(self) -> list[tuple[str, int]]:
        """``hosts`` as (host, port) pairs (validated at load)."""
        return parse_zookeeper_hosts("zookeeper.hosts", self.hosts)


def parse_zookeeper_hosts(key: str, text: str) -> list[tuple[str, int]]:
    """``"zk1:2181,zk2"`` as [(host, port)]; ConfigError naming ``key`` when malformed."""
    out = []
    for part in text.split(","):
        part = part.strip()
        host, port = part, str(ZOOKEEPER_PORT)
        if part.startswith("["):  # [::1]:2181
            host, _, rest = part[1:].partition("]")
            if rest and not rest.startswith(":"):
                host = ""
            port = rest[1:] if rest else port
        elif part.count(":") == 1:
            host, _, port = part.partition(":")
        if not host or not re.fullmatch(r"[A-Za-z0-9._:-]+", host):
            raise ConfigError(f"{key}: {part!r} is not host:port (in {text!r})")
        if not port.isdigit() or not 0 < int(port) < 65536:
            raise ConfigError(f"{key}: {part!r} has no valid port (in {text!r})")
        out.append((host, int(port)))
    return out


_ZOOKEEPER_KEYS = {
    "hosts",
    "path_prefix",
    "session_timeout",
    "credentials",
    "acl",
    "advertise_address",
}


def _zookeeper_config(raw: Any) -> ZooKeeperConfig:
    if not isinstance(raw, dict):
        raise ConfigError("zookeeper: expected a table [zookeeper]")
    for key in raw:
        if key not in _ZOOKEEPER_KEYS:
            raise ConfigError(f"zookeeper.{key}: unknown setting")
    values: dict[str, Any] = {}
    for key in ("hosts", "path_prefix", "credentials", "acl", "advertise_address"):
        if key in raw:
            values[key] = _parse_str(f"zookeeper.{key}", raw[key])
    hosts = values.get("hosts", DEFAULT_ZOOKEEPER_HOSTS)
    if "/" in hosts:
        raise ConfigError(f"zookeeper.hosts: {hosts!r} has a path; put it in zookeeper.path_prefix")
    parse_zookeeper_hosts("zookeeper.hosts", hosts)
    prefix = values.get("path_prefix", "")
    if not prefix:
        raise ConfigError(
            'zookeeper.path_prefix: required (for example "/kestrel/prod": members '
            "join <path_prefix>/read and <path_prefix>/write)"
        )
    if not prefix.startswith("/") or prefix.endswith("/") or "//" in prefix:
        raise ConfigError(
            f"zookeeper.path_prefix: {prefix!r} must be an absolute path like /kestrel/prod"
        )
    if "session_timeout" in raw:
        values["session_timeout"] = parse_duration(
            "zookeeper.session_timeout", raw["session_timeout"]
        )
        if values["session_timeout"] < 100:
            raise ConfigError("zookeeper.session_timeout: at least 100ms")
    acl = values.get("acl", "open_unsafe")
    if acl not in ZOOKEEPER_ACLS:
        raise ConfigError(
            f"zookeeper.acl: unknown ACL {acl!r}; expected one of {', '.join(ZOOKEEPER_ACLS)}"
        )
    credentials = values.get("credentials")
    if credentials is not None and (":" not in credentials or credentials.startswith(":")):
        raise ConfigError('zookeeper.credentials: expected "user:password"')
    if acl == "everyone_read_creator_all" and credentials is None:
        raise ConfigError(
            "zookeeper.acl: everyone_read_creator_all needs zookeeper.credentials "
            "(the creator is the authenticated user)"
        )
    if importlib.util.find_spec("kazoo") is None:
        from kestreld.extras import install_command  # shutil and pathlib: for this message only

        raise ConfigError(
            "zookeeper: needs the kazoo library, which is not installed; "
            f"install kestreld[zookeeper] ({install_command('zookeeper')})"
        )
    return ZooKeeperConfig(**values)


@dataclass(slots=True, frozen=True)
class ServerConfig:
    """Server-wide settings plus the per-queue configuration tree."""

    listen_address: str = "127.0.0.1"
    port: int = 22133  # memcache; 0 = off
    text_port: int = 0  # Kestrel's text protocol (2222 in Kestrel); 0 = off
    thrift_port: int = 0  # Kestrel's thrift interface (2229 in Kestrel); 0 = off
    queue_path: str = "queues"
    #: Worker processes serving the ports and the folder (kestreld/workers/); 1: this
    #: process serves everything itself, as before workers existed.
    workers: int = 1
    #: With workers > 1: a client connection whose request names another worker's queue,
    #: while it holds nothing here, is handed to that worker (kestreld/workers/handoff.py)
    #: rather than having each such request forwarded.
    worker_handoff: bool = True
    archive_path: str | None = None
    max_open_reads: int = 100
    client_timeout: int = 0  # ms, 0 = never
    expiration_timer_frequency: int = 1000  # ms, 0 = off
    max_line_length: int = 8 * KiB
    max_connections: int = 10_000
    checkpoint_interval: int = 1000  # ms
    #: After answering a lone client, poll for its next request this long at most (µs)
    #: before the event loop sleeps, while the server measures that polling costs it less
    #: CPU than sleeping (kestreld/loop/busy_poll.py); 0 = never poll; None: the
    #: build's default (30 compiled, 0 plain Python: busy_poll.DEFAULT_LIMIT_US).
    busy_poll_us: int | None = None
    metrics_port: int | None = None
    metrics_address: str | None = None  # defaults to listen_address
    log_level: str = "info"
    log_format: str = "console"
    # --- status and cluster membership (Kestrel 2.4) ---
    default_status: str = "UP"  # the status when the status file does not exist yet
    status_file: str | None = None  # None: .kestreld-status in queue_path
    status_change_grace_period: int = 0  # ms before a stricter status is enforced
    connection_limit_refuse_writes: int | None = None  # above this many connections
    connection_limit_refuse_reads: int | None = None
    zookeeper: ZooKeeperConfig | None = None  # [zookeeper]: join the server sets
    # --- security (docs/operations.md, Security) ---
    tls_cert_file: str | None = None  # TLS on the memcache port when set (with tls_key_file)
    tls_key_file: str | None = None
    tls_ca_file: str | None = None  # CA of client certificates
    tls_verify_client: bool = False  # mutual TLS: a client certificate signed by tls_ca_file
    tls_handshake_timeout: int = 10_000  # ms a client has to finish its handshake
    auth_file: str | None = None  # users and roles; set: every client must authenticate
    max_queues: int | None = None  # queues clients may make exist; None = unlimited
    create_queue_on_get: bool = True  # a fetch from an unknown queue creates it (Kestrel)
    # --- admin port (docs/operations.md#the-admin-port) ---
    #: Bearer token the admin port's changing requests (/reload, /quiesce, /shutdown) need;
    #: without one they are accepted only when the admin port listens on loopback.
    admin_token: str | None = None
    #: Host names (besides loopback names and the port's own address) a request's Host
    #: header may carry where the Host rule applies (the DNS-rebinding defence).
    admin_allowed_hosts: tuple[str, ...] = ()
    admin_tls_cert_file: str | None = None  # HTTPS on the admin port when set (with the key)
    admin_tls_key_file: str | None = None
    #: Kestrel's session trace: an event per client session start and end.
    enable_session_trace: bool = False
    #: Stat names (regular expressions, whole-name match) /stats.json?filtered=1 leaves out.
    stats_filters: tuple[str, ...] = ()
    default_queue: QueueConfig = field(default_factory=QueueConfig)
    queues: dict[str, QueueConfig] = field(default_factory=dict)  # explicit [queues.X] tables
    aliases: dict[str, tuple[str, ...]] = field(default_factory=dict)  # [aliases.X] destinations
    source: str | None = None  # the file this was read from

    def queue(self, name: str) -> QueueConfig:
        """Effective config for a queue or fanout reader name (which need not exist)."""
        found = self.queues.get(name)
        if found is not None:
            return found
        parent, _, _ = name.partition("+")
        if parent != name:
            return self.queues.get(parent, self.default_queue)
        return self.default_queue

    def masked_queues(self) -> list[str]:
        """Configured queues hidden by an alias of the same name (Kestrel warned, then masked)."""
        return sorted(name for name in self.aliases if name in self.queues)

    def configured_readers(self) -> list[str]:
        """Fanout readers named in the config (``q+r`` tables): they exist from start-up."""
        return [n for n in self.queues if "+" in n]


SERVER_KEYS: dict[str, str] = {
    "listen_address": _STR,
    "port": _INT,
    "text_port": _INT,
    "thrift_port": _INT,
    "queue_path": _STR,
    "workers": _WORKERS,
    "worker_handoff": _BOOL,
    "archive_path": _STR,
    "max_open_reads": _INT,
    "client_timeout": _DURATION,
    "expiration_timer_frequency": _DURATION,
    "max_line_length": _SIZE,
    "max_connections": _INT,
    "checkpoint_interval": _DURATION,
    "busy_poll_us": _INT,
    "metrics_port": _INT,
    "metrics_address": _STR,
    "log_level": _STR,
    "log_format": _STR,
    "default_status": _STR,
    "status_file": _STR,
    "status_change_grace_period": _DURATION,
    "connection_limit_refuse_writes": _INT,
    "connection_limit_refuse_reads": _INT,
    # security
    "tls_cert_file": _STR,
    "tls_key_file": _STR,
    "tls_ca_file": _STR,
    "tls_verify_client": _BOOL,
    "tls_handshake_timeout": _DURATION,
    "auth_file": _STR,
    "max_queues": _INT,
    "create_queue_on_get": _BOOL,
    "admin_token": _STR,
    "admin_allowed_hosts": _HOSTS,
    "admin_tls_cert_file": _STR,
    "admin_tls_key_file": _STR,
    "enable_session_trace": _BOOL,
    "stats_filters": _PATTERNS,
}
#: Other names of server keys: the metrics port is the admin port too.
SERVER_KEY_ALIASES = {"admin_port": "metrics_port", "admin_address": "metrics_address"}
_LOG_LEVELS = ("debug", "info", "warning", "error", "critical")


def _queue_values(where: str, table: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, raw in table.items():
        kind = QUEUE_KEYS.get(key)
        if kind is None:
            raise ConfigError(f"{where}{key}: unknown queue setting{_kestrel_hint(key)}")
        if raw is None:
            out[key] = None
            continue
        if (
            kind != _BOOL
            and isinstance(raw, str)
            and raw.lower() in ("none", "off", "never", "unlimited")
        ):
            if key in ("max_item_size", "max_journal_size", "max_memory_size"):
                raise ConfigError(f"{where}{key}: must be a size, not {raw!r}")
            out[key] = None
            continue
        out[key] = _PARSERS[kind](where + key, raw)
    return out


def _kestrel_hint(key: str) -> str:
    """`` (Kestrel's maxItems is max_items in kestreld)`` for a Kestrel key name, else ""."""
    said = kestrel_hint(key)
    return f" ({said})" if said else ""


#: Queue keys whose value names where items go; each must name a queue (see _check_targets).
TARGET_KEYS = ("expire_to_queue", "punt_error_to_queue", "punt_many_errors_to_queue")


def _check_targets(
    where: str, name: str | None, values: dict[str, Any], aliases: dict[str, tuple[str, ...]]
) -> None:
    """A table's own target keys must name another queue: not a fanout reader, not an alias.

    ``name`` is the table's queue (None for the top-level defaults).  An
    inherited default may name the queue itself: that queue keeps its aborted
    or expired items (see QueueCollection), as it would without the key.  A
    fanout reader as target would hand the item to every reader of its queue,
    and an alias to every destination: neither is one queue's error queue.
    """
    own = name.partition("+")[0] if name is not None else None
    for key in TARGET_KEYS:
        target = values.get(key)
        if target is None:
            continue
        what = "an expired" if key == "expire_to_queue" else "an aborted"
        if target.partition("+")[0] == own:
            raise ConfigError(
                f"{where}{key}: {target!r} is the queue itself; {what} item would never leave it"
            )
        if "+" in target:
            raise ConfigError(
                f"{where}{key}: {target!r} is a fanout reader; name a queue "
                f"({what} item put to {target.partition('+')[0]!r} reaches all of its readers)"
            )
        if target in aliases:
            raise ConfigError(
                f"{where}{key}: {target!r} is an alias; name a queue "
                f"(one of {', '.join(aliases[target])})"
            )


def _check_queue(where: str, cfg: QueueConfig) -> None:
    if cfg.punt_many_errors_count < 1:
        raise ConfigError(
            f"{where}punt_many_errors_count: must be at least 1 (got {cfg.punt_many_errors_count})"
        )
    if cfg.max_journal_size < 4 * KiB:
        raise ConfigError(
            f"{where}max_journal_size: must be at least 4KiB (got {cfg.max_journal_size})"
        )
    if cfg.max_item_size > 16 * MiB:
        raise ConfigError(f"{where}max_item_size: at most 16MiB, the journal's record limit")


def _check_security(server: dict[str, Any]) -> None:
    cert, key = server.get("tls_cert_file"), server.get("tls_key_file")
    if (cert is None) != (key is None):
        raise ConfigError("tls_cert_file and tls_key_file: set both (or neither)")
    if cert is None and (server.get("tls_ca_file") or server.get("tls_verify_client")):
        raise ConfigError("tls_ca_file, tls_verify_client: need tls_cert_file and tls_key_file")
    if server.get("tls_verify_client") and not server.get("tls_ca_file"):
        raise ConfigError("tls_verify_client: needs tls_ca_file (the CA of client certificates)")
    if server.get("tls_handshake_timeout") == 0:
        raise ConfigError("tls_handshake_timeout: must be more than 0")
    admin_cert, admin_key = server.get("admin_tls_cert_file"), server.get("admin_tls_key_file")
    if (admin_cert is None) != (admin_key is None):
        raise ConfigError("admin_tls_cert_file and admin_tls_key_file: set both (or neither)")
    if server.get("max_queues") == 0:
        raise ConfigError("max_queues: must be at least 1 (leave it unset for no limit)")


def build_config(doc: dict[str, Any], source: str | None = None) -> ServerConfig:
    """Validate a parsed TOML document into a ServerConfig (raises ConfigError)."""
    server: dict[str, Any] = {}
    defaults: dict[str, Any] = {}
    tables: dict[str, Any] = {}
    alias_tables: dict[str, Any] = {}
    for key, raw in doc.items():
        if key in SERVER_KEY_ALIASES:
            if SERVER_KEY_ALIASES[key] in doc:
                raise ConfigError(f"{key}: same setting as {SERVER_KEY_ALIASES[key]}; give one")
            key = SERVER_KEY_ALIASES[key]
        if key == "queues":
            if not isinstance(raw, dict):
                raise ConfigError("queues: expected tables like [queues.NAME]")
            tables = raw
        elif key == "zookeeper":
            server["zookeeper"] = _zookeeper_config(raw)
        elif key == "aliases":
            if not isinstance(raw, dict):
                raise ConfigError("aliases: expected tables like [aliases.NAME]")
            alias_tables = raw
        elif key in SERVER_KEYS:
            server[key] = None if raw is None else _PARSERS[SERVER_KEYS[key]](key, raw)
        elif key in QUEUE_KEYS:
            defaults.update(_queue_values("", {key: raw}))
        else:
            raise ConfigError(f"{key}: unknown setting{_kestrel_hint(key)}")
    if "log_level" in server and server["log_level"].lower() not in _LOG_LEVELS:
        raise ConfigError(f"log_level: expected one of {', '.join(_LOG_LEVELS)}")
    if "log_format" in server and server["log_format"] not in ("console", "json"):
        raise ConfigError("log_format: expected console or json")
    for key in ("port", "text_port", "thrift_port"):
        if key in server and not 0 <= server[key] <= 65535:
            raise ConfigError(f"{key}: {server[key]} is not a TCP port")
    ports = [(k, server[k]) for k in ("port", "text_port", "thrift_port") if server.get(k)]
    for i, (key, port) in enumerate(ports):
        for other, other_port in ports[:i]:
            if port == other_port:
                raise ConfigError(f"{key}: {port} is already {other}")
    if server.get("admin_token") is not None and len(server["admin_token"]) < 16:
        raise ConfigError("admin_token: at least 16 characters (a random string)")
    if server.get("busy_poll_us", 0) > 10_000:
        raise ConfigError("busy_poll_us: at most 10000 (10 ms); 0 turns polling off")
    if server.get("max_line_length", 8 * KiB) < 64:
        raise ConfigError("max_line_length: must be at least 64 bytes")
    if "default_status" in server:
        server["default_status"] = server["default_status"].upper()
        if server["default_status"] not in STATUSES:
            raise ConfigError(f"default_status: expected one of {', '.join(STATUSES)}")
    _check_security(server)

    default_queue = QueueConfig(**defaults)
    _check_queue("", default_queue)
    queues: dict[str, QueueConfig] = {}
    own_values: dict[str, dict[str, Any]] = {}  # what each table sets itself
    # Parents first, so that a reader inherits its parent's table.
    for name in sorted(tables, key=lambda n: ("+" in n, n)):
        table = tables[name]
        if split_queue_name(name) is None:
            raise ConfigError(f"queues.{name}: illegal queue name")
        if not isinstance(table, dict):
            raise ConfigError(f"queues.{name}: expected a table")
        base = queues.get(name.partition("+")[0], default_queue) if "+" in name else default_queue
        values = _queue_values(f"queues.{name}.", table)
        cfg = dataclasses.replace(base, **values)
        _check_queue(f"queues.{name}.", cfg)
        own_values[name] = values
        queues[name] = cfg
    aliases = _aliases(alias_tables)
    _check_targets("", None, defaults, aliases)
    for name, values in own_values.items():
        _check_targets(f"queues.{name}.", name, values, aliases)
    return ServerConfig(
        **server, default_queue=default_queue, queues=queues, aliases=aliases, source=source
    )


#: Keys of an ``[aliases.NAME]`` table.
ALIAS_KEYS = ("destination_queues",)


def _aliases(tables: dict[str, Any]) -> dict[str, tuple[str, ...]]:
    """``[aliases.NAME] destination_queues = [...]`` tables, validated against each other."""
    aliases: dict[str, tuple[str, ...]] = {}
    for name, table in tables.items():
        where = f"aliases.{name}"
        if split_queue_name(name) is None or "+" in name:
            raise ConfigError(f"{where}: illegal alias name (a queue name, without '+')")
        if not isinstance(table, dict):
            raise ConfigError(f"{where}: expected a table with destination_queues = [...]")
        for key in table:
            if key not in ALIAS_KEYS:
                hint = " (did you mean destination_queues?)" if "dest" in key.lower() else ""
                raise ConfigError(f"{where}.{key}: unknown alias setting{hint}")
        raw = table.get("destination_queues")
        if not isinstance(raw, list) or not raw:
            raise ConfigError(
                f"{where}.destination_queues: expected a non-empty list of queue names"
            )
        destinations = []
        for dest in raw:
            if not isinstance(dest, str) or split_queue_name(dest) is None or "+" in dest:
                raise ConfigError(
                    f"{where}.destination_queues: {dest!r} is not a legal queue name "
                    "(a queue, not a fanout reader: puts go to queues)"
                )
            if dest == name:
                raise ConfigError(f"{where}.destination_queues: the alias points at itself")
            if dest not in destinations:
                destinations.append(dest)
        aliases[name] = tuple(destinations)
    for name, destinations in aliases.items():
        for dest in destinations:
            if dest in aliases:
                raise ConfigError(
                    f"aliases.{name}.destination_queues: {dest!r} is itself an alias "
                    "(an alias points at queues only)"
                )
    return aliases


def load_config(path: str | None) -> ServerConfig:
    """Read and validate a config file; None gives the embedded defaults."""
    if path is None:
        return ServerConfig()
    try:
        with open(path, "rb") as f:
            doc = tomllib.load(f)
    except FileNotFoundError:
        raise ConfigError(f"config file {path} does not exist") from None
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"{path}: not valid TOML: {e}") from None
    except OSError as e:
        raise ConfigError(f"{path}: cannot read: {e.strerror}") from None
    try:
        return build_config(doc, source=path)
    except ConfigError as e:
        raise ConfigError(f"{path}: {e}") from None


def render_value(key: str, value: Any) -> str:
    """A value as dump_config shows it: bytes, ms, true/false, (none)."""
    if value is None:
        return "(none)"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, tuple):  # admin_allowed_hosts, stats_filters
        return ",".join(value) if value else "(none)"
    return str(value)


def alias_dump_lines(destinations: tuple[str, ...]) -> list[str]:
    """The ``dump_config`` line of an alias."""
    return [f"destination_queues={','.join(destinations)}"]


def dump_lines(cfg: QueueConfig) -> list[str]:
    """``key=value`` lines in the reference order."""
    return [f"{key}={render_value(key, getattr(cfg, key))}" for key in QUEUE_KEYS]
