"""``python -m kestreld.bench.pingpong``: the blocking one-connection client's figures."""

from __future__ import annotations

import re

import pytest

from kestreld.bench.pingpong import main, summarize
from kestreld.bench.servers import darner_path


def test_pingpong_reports_server_cpu_per_request_for_each_op(capsys):
    assert main(["--ops", "set,rget", "--seconds", "0.3", "--rounds", "1", "--darner", ""]) == 0
    lines = capsys.readouterr().out.splitlines()
    rounds = [line for line in lines if line.startswith("round ")]
    assert [line.split()[2] for line in rounds] == ["set", "rget"]
    for line in rounds:
        m = re.search(r"kestreld +([\d.]+) µs/request \(([\d,]+)/s\)", line)
        assert m, line
        assert float(m.group(1)) > 0 and int(m.group(2).replace(",", "")) > 0
    medians = [line for line in lines if line.startswith("median ")]
    assert [line.split()[1] for line in medians] == ["set", "rget"]
    assert all("kestreld" in line and "per round" not in line for line in medians)


def test_the_summary_gives_medians_and_the_ratio_round_by_round():
    costs = {
        ("set", "kestreld"): [10.0, 12.0, 30.0],
        ("set", "Darner"): [11.0, 10.0, 40.0],
    }
    (line,) = summarize(costs, ["kestreld", "Darner"])
    assert line.startswith("median set  kestreld 12.00, Darner 11.00 µs/request")
    # Rounds compared with their own peer: 10/11, 12/10, 30/40.
    assert "median 0.909x" in line
    assert "mean %.3fx" % ((10 / 11 + 12 / 10 + 30 / 40) / 3) in line
    assert "at or under 1x in 2 of 3" in line


@pytest.mark.peer
@pytest.mark.skipif(not darner_path(), reason="no Darner binary (set DARNER_BIN)")
def test_pingpong_alternates_which_server_goes_first(capsys):
    assert main(["--ops", "set", "--seconds", "0.3", "--rounds", "2"]) == 0
    rounds = [
        line.split()[3]
        for line in capsys.readouterr().out.splitlines()
        if line.startswith("round ")
    ]
    assert rounds == ["kestreld", "Darner", "Darner", "kestreld"]
