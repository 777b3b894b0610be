"""The straggler arithmetic: arrival times of the same collectives on each rank → the host the others wait for; and
the watchdog's warning that names it, at most once in WARN_EVERY_S for a host.

    .venv/bin/pytest tests/unit/health/test_stragglers.py
"""

import time
from types import SimpleNamespace

import pytest

from sagemaker_lightning import lines
from sagemaker_lightning.health import judge, stragglers
from sagemaker_lightning.toolbox.status import Status

pytestmark = pytest.mark.unit

S = 1_000_000_000  # ns in a second


def entry(seq: int, created_s: float, p2p: bool = False) -> dict:
    return {"process_group": ["0", "default_pg"], "collective_seq_id": seq, "time_created_ns": int(created_s * S),
            "is_p2p": p2p}  # fmt: skip


def test_arrivals_are_the_latest_collectives_since_training_began():
    entries = [entry(i, 100 + i) for i in range(100)] + [entry(0, 300, p2p=True)]
    got = stragglers.arrivals(entries, since_ns=110 * S)
    assert len(got) == stragglers.ARRIVALS and min(got) == "0:36" and "0:99" in got  # the latest, no send/recv
    assert stragglers.arrivals(entries, since_ns=0) == {}  # the first step has not ended yet


def test_the_straggler_is_the_host_the_others_wait_for():
    # 16 steps of 2 s: rank 2 (algo-2) enters each step's collective 1 s after the others
    arrived = {r: {f"0:{i}": int((10 + 2 * i + (r == 2)) * S) for i in range(16)} for r in range(3)}
    late, span = stragglers.lateness(arrived)
    assert late == {0: 0.0, 1: 0.0, 2: 16.0} and span == 30.0
    hosts = {0: "algo-1", 1: "algo-1", 2: "algo-2"}
    # 2 hosts: the median is their mean; algo-1 waited 8 of the 30 s: its own time is 22 s of algo-2's 30
    slowest, ratio = stragglers.spread(late, span, hosts)
    assert slowest == "algo-2" and ratio == pytest.approx(30 / 22)
    assert lines.spread((slowest, ratio)) == " hosts: slowest algo-2 1.36x the median"
    assert stragglers.warning((slowest, ratio)).startswith("warning: host algo-2 is a straggler: its steps take 1.4x")
    assert stragglers.warning(("algo-2", stragglers.SLOW - 0.01)) is None


def test_no_spread_without_two_hosts_or_common_collectives():
    assert stragglers.spread({0: 0.0, 1: 3.0}, 6.0, {0: "algo-1", 1: "algo-1"}) is None  # one host
    assert stragglers.lateness({0: {"0:1": S}, 1: {"0:2": S}}) == ({}, 0.0)  # none recorded by both
    few = {r: {f"0:{i}": i * S for i in range(stragglers.FEWEST - 1)} for r in range(2)}
    assert stragglers.lateness(few) == ({}, 0.0)  # too few to tell
    assert lines.spread(None) == ""


def heartbeats(straggler: int) -> dict[int, dict]:
    """Three hosts' heartbeats, fresh, over 16 steps of 2 s; rank `straggler` enters each collective 1 s late."""
    return {
        r: {"host": f"algo-{r + 1}", "t": time.time(), "arrived": {f"0:{i}": (10 + 2 * i + (r == straggler)) * S for i in range(16)}}
        for r in range(3)
    }  # fmt: skip


def test_a_straggler_is_named_at_most_once_in_warn_every_s(capsys):
    """Rank 0's watchdog compares the heartbeats every PERIOD_S: a host that straggles throughout is named at once,
    then once every WARN_EVERY_S of the watchdog's clock, not at each comparison; another host that becomes the
    straggler is named at once. The spread for the progress line is there at every comparison."""
    now = [0.0]
    dog = judge.Judge(
        rank=0,
        world_size=3,
        key=b"k" * 32,
        plan=SimpleNamespace(host="algo-1", master="algo-1:29500", output_data_dir=None),
        progress=judge.Progress(beat=0.0, step=0),
        limit=lambda: 600.0,
        clock=lambda: now[0],
        status=Status(),
        goodput=None,
    )
    warned, period = [], judge.PERIOD_S
    for straggler, start in ((1, 0.0), (2, 1000.0)):  # algo-2 straggles for 1000 s, then algo-3
        records = heartbeats(straggler)
        for now[0] in (start + period * i for i in range(int(1000 / period))):
            dog._compare(records, time.time())
            assert dog.status.spread.startswith(f" hosts: slowest algo-{straggler + 1} ")
            said = capsys.readouterr().out
            warned += [(now[0], line.split()[2]) for line in said.splitlines() if "is a straggler" in line]
    every = stragglers.WARN_EVERY_S
    assert warned == [(0.0, "algo-2"), (every, "algo-2"), (2 * every, "algo-2"), (3 * every, "algo-2"),
                      (1000.0, "algo-3"), (1000 + every, "algo-3"), (1000 + 2 * every, "algo-3"),
                      (1000 + 3 * every, "algo-3")]  # fmt: skip
