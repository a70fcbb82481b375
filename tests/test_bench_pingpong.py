"""``python -m kestreld.bench.pingpong``: the blocking one-connection client's figures."""

from __future__ import annotations

import re

from kestreld.bench.pingpong import main


def test_pingpong_reports_server_cpu_per_request_for_each_op(capsys):
    assert main(["--ops", "set,rget", "--seconds", "0.3", "--rounds", "1", "--darner", ""]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [line.split()[2] for line in lines] == ["set", "rget"]
    for line in lines:
        m = re.search(r"kestreld +([\d.]+) µs/request \(([\d,]+)/s\)", line)
        assert m, line
        assert float(m.group(1)) > 0 and int(m.group(2).replace(",", "")) > 0
