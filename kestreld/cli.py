"""The ``kestreld`` command: the server, and its tools as sub-commands.

    kestreld [--config FILE] [--listen ADDR] [--port N] [--queue-path DIR] ...
    kestreld --check-config FILE [--listen ADDR] [--port N] ...
    kestreld journal dump PATH... [--stats]
    kestreld journal import-kestrel2 OLD_DIR NEW_DIR [--queue NAME] [--dry-run]
    kestreld analyze SOURCE --out DIR [--master URL] [--since T] [--until T]
    kestreld ping [--host H] [--port N] [--timeout S] [--config FILE] [LOGIN]
    kestreld queues [--host H] [--port N] [--config FILE] [--json] [LOGIN]
    kestreld move SRC DST [--limit N] [--host H] [--port N] [--config FILE] [LOGIN]
    kestreld passwd NAME [--roles R] [--queues PATTERNS] [--file AUTH_FILE]
    kestreld convert-config KESTREL_CONFIG.scala > kestreld.conf

LOGIN, for a server with TLS or an auth_file (kestreld/tools/endpoint.py):
    [--tls] [--tls-ca-file F] [--tls-cert-file F --tls-key-file F] [--tls-server-name N]
    [--user NAME] [--password-file F]   (or $KESTRELD_USER, $KESTRELD_PASSWORD)

Sub-commands import their modules lazily: the server never imports Spark.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys

# sub-command -> module whose main(argv) -> int runs it
_TOOLS = {
    ("journal", "dump"): "kestreld.tools.dump",
    ("journal", "import-kestrel2"): "kestreld.tools.kestrel2_import",
    ("analyze",): "kestreld.pipeline.analyze",
    ("ping",): "kestreld.tools.ping",
    ("queues",): "kestreld.tools.queues_table",
    ("move",): "kestreld.tools.move",
    ("convert-config",): "kestreld.tools.convert_config",
}

_TOOLS[("bench",)] = "kestreld.bench.cli"  # the load tests against kestreld, memcached, Darner
_TOOLS[("passwd",)] = "kestreld.tools.passwd"  # a user's auth file line (auth_file)


class _HelpFormatter(argparse.HelpFormatter):
    """argparse's formatter, sized without shutil: argparse makes one for every argument
    added, and shutil (with the compressors it imports) would be half a MiB of the server's
    idle memory, for a help text it seldom prints."""

    def __init__(self, prog: str) -> None:
        super().__init__(prog, width=_terminal_columns() - 2)


def _terminal_columns() -> int:
    """The terminal's width as ``shutil.get_terminal_size`` finds it: $COLUMNS, stdout, 80."""
    try:
        columns = int(os.environ["COLUMNS"])
    except (KeyError, ValueError):
        columns = 0
    if columns > 0:
        return columns
    try:
        return os.get_terminal_size(sys.__stdout__.fileno()).columns or 80
    except (AttributeError, ValueError, OSError):
        return 80


def _serve_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="kestreld",
        formatter_class=_HelpFormatter,
        description="Kestrel-compatible message queue server (memcache text protocol). "
        "Tools: 'kestreld journal dump', 'kestreld journal import-kestrel2', "
        "'kestreld analyze', 'kestreld ping', 'kestreld queues', 'kestreld move', "
        "'kestreld convert-config'.",
    )
    p.add_argument("--config", help="TOML config file (default: embedded defaults)")
    p.add_argument(
        "--listen", dest="listen_address", help="address to listen on (default 127.0.0.1)"
    )
    p.add_argument("--port", type=int, help="memcache port (default 22133; 0 = off)")
    p.add_argument(
        "--text-port", dest="text_port", type=int, help="Kestrel text protocol port (0 = off)"
    )
    p.add_argument(
        "--thrift-port", dest="thrift_port", type=int, help="Kestrel thrift port (0 = off)"
    )
    p.add_argument("--queue-path", dest="queue_path", help="queue folder (default ./queues)")
    p.add_argument(
        "--workers",
        type=_workers,
        help='worker processes sharing the port and the folder (N or "auto"; default 1)',
    )
    p.add_argument("--log-format", dest="log_format", choices=["console", "json"])
    p.add_argument("--log-level", dest="log_level", choices=["debug", "info", "warning", "error"])
    p.add_argument("--version", action="store_true", help="print the version and exit")
    p.add_argument(
        "--check-config",
        dest="check_config",
        metavar="FILE",
        help="validate FILE, print the effective config and exit (0 usable, 2 not)",
    )
    return p


def _workers(text: str) -> int:
    from kestreld.config import ConfigError
    from kestreld.config.model import parse_workers

    try:
        return parse_workers("--workers", text)
    except ConfigError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


#: Command-line flags that override config keys of the same name.
_SERVER_FLAGS = (
    "workers",
    "listen_address",
    "port",
    "text_port",
    "thrift_port",
    "queue_path",
    "log_format",
    "log_level",
)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    for words, module in _TOOLS.items():
        if tuple(argv[: len(words)]) == words:
            return int(importlib.import_module(module).main(argv[len(words) :]) or 0)
    if argv[:1] == ["journal"]:
        print("usage: kestreld journal {dump,import-kestrel2} ...", file=sys.stderr)
        return 2
    args = _serve_parser().parse_args(argv)
    if args.version:
        from kestreld import __version__
        from kestreld.compiled import implementation

        print(f"kestreld {__version__} ({implementation()})")
        return 0
    overrides = {k: v for k, v in vars(args).items() if k in _SERVER_FLAGS and v is not None}
    if args.check_config is not None:
        from kestreld.tools import check_config

        return check_config.main(args.check_config, overrides)
    from kestreld.server import run_server

    return run_server(args.config, overrides)


if __name__ == "__main__":
    raise SystemExit(main())
