"""Configuration: one typed object for the server and every queue."""

from kestreld.config.model import (
    QUEUE_KEYS,
    ConfigError,
    QueueConfig,
    ServerConfig,
    build_config,
    dump_lines,
    load_config,
    parse_duration,
    parse_size,
)

__all__ = [
    "QUEUE_KEYS",
    "ConfigError",
    "QueueConfig",
    "ServerConfig",
    "build_config",
    "dump_lines",
    "load_config",
    "parse_duration",
    "parse_size",
]
