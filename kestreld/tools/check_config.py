"""``kestreld --check-config FILE``: validate a config and print what the server would use.

    kestreld --check-config FILE [--listen ADDR] [--port N] [--queue-path DIR] ...

Reads FILE exactly as the server would (the same flags override it), then
prints the effective settings: every server key, the defaults of every queue,
and each ``[queues.X]`` table after inheritance, values in bytes and
milliseconds as ``dump_config`` shows them.  Exit status 0 when the config is
usable, 2 with the error on stderr when not, so a deploy can run it before a
restart.  It starts nothing and touches no queue folder.
"""

from __future__ import annotations

import dataclasses
import ipaddress
import sys
from typing import Any

from kestreld.config import ConfigError, ServerConfig, dump_lines, load_config
from kestreld.config.model import SERVER_KEYS, MiB, alias_dump_lines, render_value
from kestreld.loop.busy_poll import COMPILED as BUSY_POLL_COMPILED
from kestreld.loop.busy_poll import DEFAULT_LIMIT_US
from kestreld.state import default_status_file


def effective_config(path: str, overrides: dict[str, Any]) -> ServerConfig:
    """The config the server would run with; raises ConfigError."""
    config = load_config(path)
    return dataclasses.replace(config, **overrides) if overrides else config


def render(config: ServerConfig) -> str:
    """The effective settings as text, server keys first."""
    lines = [f"# effective config of {config.source} (sizes in bytes, durations in ms)"]
    lines.append("server {")
    for key in SERVER_KEYS:
        value = getattr(config, key)
        if key == "metrics_address" and value is None and config.metrics_port is not None:
            value = config.listen_address  # what the endpoint binds when unset
        elif key == "busy_poll_us" and value is None:
            value = DEFAULT_LIMIT_US  # the build's default: what the server will poll
        elif key == "status_file" and value is None:
            value = default_status_file(config.queue_path)
        if key == "admin_token" and value is not None:
            value = "(set)"  # a secret: never printed
        lines.append(f"  {key}={render_value(key, value)}{_unset_note(config, key, value)}")
    lines.append("}")
    if config.zookeeper is not None:
        lines.append("zookeeper {")
        for key in ZOOKEEPER_RENDERED:
            value = getattr(config.zookeeper, key)
            if key == "credentials" and value is not None:
                value = value.partition(":")[0] + ":(hidden)"
            elif key == "advertise_address" and value is None:
                value = config.listen_address
            lines.append(f"  {key}={render_value(key, value)}")
        lines.append("}")
    lines.append("queue defaults {")
    lines.extend("  " + line for line in dump_lines(config.default_queue))
    lines.append("}")
    for name in sorted(config.queues):
        lines.append(f"queue '{name}' {{")
        lines.extend("  " + line for line in dump_lines(config.queues[name]))
        lines.append("}")
    for name in sorted(config.aliases):
        lines.append(f"alias '{name}' {{")
        lines.extend("  " + line for line in alias_dump_lines(config.aliases[name]))
        lines.append("}")
    return "\n".join(lines) + "\n"


def _unset_note(config: ServerConfig, key: str, value: Any) -> str:
    """Why a value the file left out is what it is, where it depends on more than the key."""
    if getattr(config, key) is not None or value is None:
        return ""
    if key == "busy_poll_us":
        return f" ({'compiled' if BUSY_POLL_COMPILED else 'plain Python'} build's default)"
    if key == "status_file":
        return " (in queue_path)"
    return ""


ZOOKEEPER_RENDERED = (
    "hosts",
    "path_prefix",
    "session_timeout",
    "credentials",
    "acl",
    "advertise_address",
)


def warnings(config: ServerConfig) -> list[str]:
    """Settings that work but that an operator should know about."""
    out = []
    if config.metrics_port is not None:
        address = config.metrics_address or config.listen_address
        if not _is_loopback(address):
            out.append(
                f"metrics listen on {address}:{config.metrics_port}, not loopback: "
                "/metrics and /stats.json have no authentication; firewall that port"
            )
            if config.admin_token is None:
                out.append(
                    f"the admin port {address}:{config.metrics_port} is not loopback and "
                    "admin_token is not set: /reload, /quiesce and /shutdown are refused (403) "
                    "until it is"
                )
            elif config.admin_tls_cert_file is None:
                out.append(
                    f"the admin port {address}:{config.metrics_port} is not loopback and has "
                    "no TLS: admin_token crosses the network in the clear (set "
                    "admin_tls_cert_file and admin_tls_key_file)"
                )
    if not _is_loopback(config.listen_address):
        if config.auth_file is None:
            out.append(
                f"the memcache protocol listens on {config.listen_address}:{config.port}: "
                "it has no authentication (no auth_file); keep it on a private network "
                "behind a firewall"
            )
        elif config.tls_cert_file is None:
            out.append(
                f"the memcache protocol listens on {config.listen_address}:{config.port} "
                "without TLS: passwords and items cross the network in the clear"
            )
        for name, port in (("text", config.text_port), ("thrift", config.thrift_port)):
            if port and config.auth_file is None:
                out.append(
                    f"the {name} protocol listens on {config.listen_address}:{port}: "
                    "it has no authentication; firewall it like the memcache port"
                )
    if config.thrift_port and config.auth_file is not None and not config.tls_verify_client:
        out.append(
            f"thrift_port = {config.thrift_port} with an auth_file but without "
            "tls_verify_client: thrift clients authenticate by TLS client certificate, "
            "so the thrift port refuses every call"
        )
    for name, cfg in [("", config.default_queue), *sorted(config.queues.items())]:
        if cfg.max_journal_size >= 256 * MiB:
            where = f"queues.{name}." if name else ""
            out.append(
                f"{where}max_journal_size = {cfg.max_journal_size} is the size of one journal "
                "segment here; Kestrel 2.4's maxJournalSize (a compaction threshold, 1 GB) "
                "needs no setting in kestreld: you probably meant to leave it out (default 16MiB)"
            )
    for name in config.masked_queues():
        out.append(f"the alias {name!r} masks the configured queue {name!r}: puts go to the alias")
    if config.zookeeper is not None:
        advertised = config.zookeeper.advertise_address or config.listen_address
        if _is_loopback(advertised):
            out.append(
                f"the server sets will advertise {advertised}, a loopback address: "
                "only clients on this host can use it (set zookeeper.advertise_address)"
            )
    return out


def _is_loopback(address: str) -> bool:
    if address == "localhost":
        return True
    try:
        return ipaddress.ip_address(address).is_loopback
    except ValueError:
        return False


def main(path: str, overrides: dict[str, Any]) -> int:
    try:
        config = effective_config(path, overrides)
    except ConfigError as e:
        print(f"kestreld: {e}", file=sys.stderr)
        return 2
    sys.stdout.write(render(config))
    for warning in warnings(config):
        print(f"# warning: {warning}")
    print(f"# {path}: OK")
    return 0
