"""``scripts/lab/pingpong.py``: the blocking one-connection client's figures."""

from __future__ import annotations

import re

import pytest
from lab import instrument

from kestreld.bench.servers import KestreldServer, darner_path

main, summarize = instrument("pingpong").main, instrument("pingpong").summarize
TightClient, build = instrument("tight_client").TightClient, instrument("tight_client").build


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


def test_the_c_client_measures_the_same_ops(capsys):
    args = ["--client", "c", "--ops", "set,get,rget", "--seconds", "0.3", "--rounds", "1"]
    assert main([*args, "--darner", ""]) == 0
    rounds = [line for line in capsys.readouterr().out.splitlines() if line.startswith("round ")]
    assert [line.split()[2] for line in rounds] == ["set", "get", "rget"]
    for line in rounds:
        m = re.search(r"kestreld +([\d.]+) µs/request \(([\d,]+)/s\)", line)
        assert m, line
        assert float(m.group(1)) > 0 and int(m.group(2).replace(",", "")) > 0


def test_the_c_client_stops_with_the_reply_it_did_not_expect(tmp_path):
    program = build(tmp_path)
    server = KestreldServer("")
    server.start()
    try:
        client = TightClient(program, server.port, "get", 0.2, prefill=0)  # nothing to get
        try:
            client.start()  # warm-up gets of an empty queue: END, as a warm-up allows
            with pytest.raises(RuntimeError, match=r"status 2\).*get: no item: END"):
                client.run()
        finally:
            client.stop()
    finally:
        server.stop()
    with pytest.raises(ValueError, match="unknown op"):
        TightClient(program, server.port, "delete", 0.2, prefill=0)


def test_the_c_client_without_a_compiler_is_refused_with_a_reason(monkeypatch, capsys):
    monkeypatch.setenv("CC", "no-such-compiler")
    assert main(["--client", "c", "--ops", "set", "--seconds", "0.3", "--darner", ""]) == 2
    err = capsys.readouterr().err
    assert err.startswith("pingpong: the C client needs a C compiler"), err
