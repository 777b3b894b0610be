"""The watchdog's values in the job's store, which answers anyone who reaches MASTER_PORT: what another writer of the
store can and cannot do (forge the line, hide a hang, flood a reader), a heartbeat that does not parse, the key the
ranks agree on over two real gloo processes, and a store that accepts a connection but never answers.

    .venv/bin/pytest tests/unit/health/test_watchdog_store.py
"""

import datetime
import functools
import json
import os
import socket
import threading

import pytest
import spawned
import torch
import torch.distributed as dist
from test_watchdog_judgement import KEY, LIMIT, Ended, started

from sagemaker_lightning.health import heartbeats, signing, store_link

pytestmark = pytest.mark.unit


@pytest.fixture
def job(monkeypatch):
    return started(monkeypatch)


@pytest.fixture
def intruder(job):
    """A client of the job's store that is none of its ranks: anything that reaches MASTER_PORT."""
    store = dist.TCPStore("127.0.0.1", job.port, is_master=False, wait_for_workers=False)
    return lambda name, value: store.set(store_link.stored(name), value)


def warnings(out: str) -> list[str]:
    return [line for line in out.splitlines() if line.startswith("warning: ")]


def test_an_abort_line_the_ranks_did_not_sign_ends_nothing_and_is_said_once(job, intruder, capsys):
    """Before: every rank ended with the intruder's text as the job's FailureReason."""
    wd = job.rank(1)
    intruder(heartbeats.ABORT, "everyone exit 1")
    wd.judge.tick()
    intruder(heartbeats.ABORT, signing.signed(b"another key" * 3, heartbeats.ABORT, "everyone exit 1"))
    wd.judge.tick()
    assert warnings(capsys.readouterr().out) == [
        f"warning: a value not signed by this job's ranks was written to {store_link.stored('abort')} (no valid "
        f"signature): ignored; the store at 127.0.0.1:{job.port} (MASTER_ADDR:MASTER_PORT) is reachable by "
        "something else"
    ]


def test_a_forged_busy_heartbeat_hides_no_hang(job, intruder):
    """Before: a busy mark in rank 0's heartbeat held the judgement off for as long as it was written."""
    wd = job.rank(1)
    job.advance(LIMIT + 1)
    forged = {"host": "algo-1", "t": job.wall, "step": 5, "last": {}, "stack": None, "busy": "writing last.ckpt"}
    for name in ("0", heartbeats.BUSY):
        intruder(name, json.dumps({**forged, "arrived": {}, "ended": False}))
    with pytest.raises(Ended) as ended:
        wd.judge.tick()
    assert ended.value.line.endswith(
        "rank 0 on ? did not arrive: its heartbeat in the store was replaced by a value not signed by this job's ranks"
    )


def test_a_heartbeat_that_does_not_parse_says_so_and_blames_no_host(job, capsys):
    """Before: the parse error escaped as a silent store, and the line blamed rank 0's host as stopped or gone."""
    wd = job.rank(1)
    wd.judge.link.call(lambda store: store.set("0", signing.signed(KEY, "0", '{"host": "algo-1", "t": "soon"}')))
    job.advance(LIMIT + 1)
    with pytest.raises(Ended) as ended:
        wd.judge.tick()
    wrong = "t, step, last, arrived, ended missing or not of its type"
    assert ended.value.line.endswith(f"rank 0 on ? did not arrive: its heartbeat does not parse ({wrong})")
    assert "does not answer" not in ended.value.line
    assert warnings(capsys.readouterr().out) == [
        f"warning: the watchdog's heartbeat in {store_link.stored('0')} does not parse ({wrong})"
    ]


@pytest.mark.parametrize(
    ("text", "problem"),
    [("[1, 2]", "a JSON list, not an object"), ("{", "Expecting property name"), ('{"t": 1', "Expecting")],
)
def test_a_parse_error_names_what_is_wrong(text, problem):
    with pytest.raises(ValueError, match=problem):
        heartbeats.parsed(text)


def test_a_value_is_read_only_under_its_own_key_and_the_size_cap():
    text = json.dumps({"t": 1})
    assert signing.opened(KEY, "0", signing.signed(KEY, "0", text).encode()) == text
    with pytest.raises(signing.Forged, match="no valid signature"):  # rank 0's, copied to rank 1's key
        signing.opened(KEY, "1", signing.signed(KEY, "0", text).encode())
    long = signing.signed(KEY, "0", "x" * signing.MAX_VALUE_BYTES).encode()  # signed, but past the cap
    with pytest.raises(signing.Forged, match=f"{len(long)} bytes, over the {signing.MAX_VALUE_BYTES}"):
        signing.opened(KEY, "0", long)


def test_a_long_abort_line_is_clipped_to_the_cap_and_still_reads():
    line = "rank 7 on algo-8 did not arrive: é " * 10_000
    value = signing.signed(KEY, heartbeats.ABORT, signing.clipped(line)).encode()
    assert len(value) <= signing.MAX_VALUE_BYTES
    assert signing.opened(KEY, heartbeats.ABORT, value).endswith("…")


def agreeing(rank: int, port: int, out) -> None:
    """One of two gloo ranks: the key it agrees on, as the watchdog does at the start of training."""
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2, timeout=datetime.timedelta(seconds=20))
    out.put((rank, signing.agree_key(torch.device("cpu"))))
    dist.destroy_process_group()


def test_the_ranks_agree_on_rank_0s_key_over_the_process_group(free_port):
    keys = spawned.two_ranks(agreeing, free_port(), timeout_s=60)
    assert keys[0] == keys[1] and len(keys[0]) == signing.KEY_BYTES


def test_a_store_that_accepts_but_never_answers_holds_the_watchdog_no_longer_than_its_wait(job):
    """A stopped process of rank 0: its kernel still accepts connections, nothing answers. TCPStore's client waits
    for the answer without a timeout (torch 2.14); before, the watchdog's thread waited with it, for ever."""
    listening = socket.create_server(("127.0.0.1", 0))
    job.address = f"127.0.0.1:{listening.getsockname()[1]}"
    wd = job.rank(1)
    wd.judge.link = store_link.Link(functools.partial(store_link.connect, job.address), wait_s=0.2)
    job.advance(LIMIT + 1)
    ended: list[Ended] = []

    def tick():
        try:
            wd.judge.tick()
        except Ended as e:
            ended.append(e)

    thread = threading.Thread(target=tick, daemon=True)
    thread.start()
    thread.join(timeout=25 * wd.judge.link.wait_s)  # the tick waits for the store once
    assert not thread.is_alive()
    assert "does not answer (no answer within 0.2 s)" in ended[0].line
    listening.close()
