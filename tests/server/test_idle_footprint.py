"""An idle server loads only what it uses (docs/operations.md, "Sizing memory"), and binds
its listen address as it did when the loop resolved it."""

from __future__ import annotations

import socket

import pytest
from kestreld_process import Conn


def _mapped_files(pid: int) -> str:
    with open(f"/proc/{pid}/maps") as f:
        return f.read()


def test_an_idle_server_has_not_loaded_the_idna_codec(server):
    # encodings.idna imports stringprep, which loads the unicodedata extension: a numeric
    # listen address is bound without the resolver that encodes host names.
    assert "unicodedata" not in _mapped_files(server.pid)


def test_an_idle_server_has_not_loaded_the_compressors_shutil_imports(server):
    maps = _mapped_files(server.pid)
    assert "_bz2" not in maps
    assert "_lzma" not in maps


def test_a_server_listens_on_a_numeric_ipv6_address(make_server, qname):
    proc = make_server('listen_address = "::1"\n')
    with socket.create_connection(("::1", proc.port), timeout=10) as sock:
        c = Conn(sock)
        assert c.set(qname, b"six") == b"STORED"
        assert c.get(qname) == b"six"
    with socket.socket() as v4:  # IPV6_V6ONLY: the IPv4 loopback is not this server's
        assert v4.connect_ex(("127.0.0.1", proc.port)) != 0


def test_a_server_listens_on_a_host_name(make_server, qname):
    proc = make_server('listen_address = "localhost"\n')
    c = Conn(proc.connect())  # 127.0.0.1, one of the name's addresses
    assert c.set(qname, b"named") == b"STORED"
    assert c.get(qname) == b"named"
    c.close()


def test_a_second_server_on_the_same_address_and_port_is_refused(make_server):
    first = make_server('listen_address = "127.0.0.1"\n')
    second = make_server('listen_address = "127.0.0.1"\n', start=False)
    second.port = first.port
    with pytest.raises(RuntimeError, match=f"cannot listen on 127.0.0.1:{first.port}"):
        second.start()
