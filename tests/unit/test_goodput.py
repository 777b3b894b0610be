"""Goodput (sagemaker_lightning/goodput.py): the ledger's accounts, the line, an attempt's start, the timeline of one
attempt on clocks the test moves (each term exactly the time the test spent in it, the terms adding up to the wall
time), and a chain of two attempts with known sleeps, the first failing after its last save: the second trains those
steps again, and says so.

    .venv/bin/pytest tests/unit/test_goodput.py
"""

import json
import threading
import time
from types import SimpleNamespace

import lightning.pytorch as pl
import pytest

from sagemaker_lightning import LightningCLI, goodput, goodput_callback, goodput_file, lines
from sagemaker_lightning.launch import started
from sagemaker_lightning.toolbox.lightning_package import made

pytestmark = pytest.mark.unit


def test_a_timing_inside_another_counts_once():
    ledger = goodput.Ledger()
    now = [0.0]
    ledger.clock = lambda: now[0]
    with ledger.timing("checkpoint stall"):
        now[0] += 1.0
        with ledger.timing("restore"):  # a save's own write inside LastCheckpoint's save
            now[0] += 2.0
    assert ledger.seconds["checkpoint stall"] == 3.0 and ledger.seconds["restore"] == 0.0
    ledger.spent("data wait", -0.5)  # a clock's jitter is no negative time
    assert ledger.accounted() == 3.0


@pytest.mark.parametrize(
    "seconds, said",
    [(0, "0.0 s"), (0.44, "0.4 s"), (41.2, "41 s"), (130, "2m10s"), (3725, "1h02m"), (86400 + 60, "24h01m")],
)
def test_durations_read_as_a_person_says_them(seconds, said):
    assert lines.duration(seconds) == said


def test_the_line_gives_trainings_share_then_where_the_rest_went_and_the_metric_reads_it():
    seconds = dict.fromkeys(goodput.TERMS, 0.0) | {"training": 3720.0, "start-up": 41.0, "validation": 130.0}
    line = lines.goodput(3891.0, seconds, 0)
    assert line.startswith("goodput 95.6 %: training 1h02m; start-up 41 s, restore 0.0 s, checkpoint stall 0.0 s, ")
    assert "steps trained again 0 (0.0 s), data wait 0.0 s, validation 2m10s, end 0.0 s" in line
    import re

    assert re.search(lines.METRICS["job:goodput_percent"], line)[1] == "95.6"
    assert lines.goodput(0.0, dict.fromkeys(goodput.TERMS, 0.0), 0).startswith("goodput 0.0 %")  # no division by 0


def test_an_attempt_starts_with_its_container_or_else_its_process(monkeypatch):
    assert started.started_at({started.STARTED_AT: "1000.5"}) == 1000.5  # PID 1's record
    own = started.started_at({})  # this process's start, from /proc
    assert time.time() - 3600 * 24 < own <= time.time()
    restarted = {started.STARTED_AT: "1000.5", "TORCHELASTIC_RESTART_COUNT": "1"}  # torchrun restarted the ranks
    assert started.started_at(restarted) == own
    assert started.started_at({started.STARTED_AT: "not a time"}) == own


class Clocks:
    """The wall clock and the monotonic one, moved by the test."""

    def __init__(self):
        self.now = 100.0

    def __call__(self):
        return self.now


def timeline(
    start_up=3.0, restore=1.0, steps=(2.0, 2.0, 2.0), waits=(0.5, 0.5), save=1.5, validation=4.0, deferred=False
):
    """One attempt's hooks on a Goodput callback, with the clocks moved by these many seconds in each part; `deferred`:
    its line said by the hub after the fit."""
    clock = Clocks()
    ledger = goodput.Ledger()
    ledger.clock = clock
    attempt = goodput.Attempt(ledger, clock.now, wall=clock)
    attempt.deferred = deferred
    callback = made(goodput_callback.Goodput, pl)(attempt)
    callback.clock = clock
    trainer = SimpleNamespace(is_global_zero=True, global_step=0, logger=None)
    callback.setup(trainer, None, "fit")
    clock.now += start_up  # the start-up's own: the container's, the imports, the process group
    with ledger.timing("restore"):
        clock.now += restore
    callback.on_validation_start(trainer, None)  # the sanity check, inside the start-up
    clock.now += validation
    callback.on_validation_end(trainer, None)
    callback.on_train_start(trainer, None)
    for i, seconds in enumerate(steps):
        callback.step_start(trainer, i)
        clock.now += seconds
        trainer.global_step += 1
        callback.step_end(trainer, trainer.global_step, None, None)
        if i < len(waits):
            with ledger.timing("checkpoint stall"):  # a save after the step, before the next one's data
                clock.now += save
            clock.now += waits[i]
    clock.now += 0.25
    callback.on_fit_end(trainer, None)
    return attempt


def test_each_term_is_the_time_spent_in_it_and_the_terms_add_up_to_the_wall_time(capsys, tmp_path):
    attempt = timeline()
    wall, seconds, again = goodput.summed(attempt.records())
    assert seconds == {
        "start-up": 3.0,  # what is left of the time before the first step once the restore and the sanity check go
        "restore": 1.0,
        "checkpoint stall": 3.0,
        "steps trained again": 0.0,
        "data wait": 1.0,
        "validation": 4.0,
        "training": 6.0,
        "end": 0.25,
    }
    assert sum(seconds.values()) == pytest.approx(wall) and again == 0
    assert capsys.readouterr().out.startswith("goodput ")


def test_a_step_of_the_wall_clock_moves_neither_the_wall_time_nor_a_term(monkeypatch):
    """An NTP correction sets the wall clock back 30 s in the middle of a run (it said goodput 142.9 %): the terms are
    timed on the monotonic clock, and so is the wall time once the attempt exists."""
    mono, wall = Clocks(), Clocks()
    wall.now = 1_000_000.0
    monkeypatch.setattr(goodput, "time", SimpleNamespace(time=wall, monotonic=mono))
    ledger = goodput.Ledger()
    ledger.clock = mono
    attempt = goodput.Attempt(ledger, wall.now - 5.0)  # the process started 5 s ago
    callback = made(goodput_callback.Goodput, pl)(attempt)
    callback.clock = mono
    trainer = SimpleNamespace(is_global_zero=True, global_step=0, logger=None)
    callback.setup(trainer, None, "fit")
    for i in range(3):
        callback.step_start(trainer, i)
        mono.now, wall.now = mono.now + 20.0, wall.now + 20.0 - (30.0 if i == 1 else 0.0)
        trainer.global_step += 1
        callback.step_end(trainer, trainer.global_step, None, None)
    callback.on_fit_end(trainer, None)
    seconds, terms, _ = goodput.summed(attempt.records())
    assert seconds == pytest.approx(65.0) and terms["training"] == 60.0 and sum(terms.values()) == pytest.approx(65.0)


def test_what_is_said_after_the_fits_end_is_what_its_line_said(capsys):
    """An attempt's wall time stops at its fit's end: the figures read after the line (the MLflow run's at its end, a
    failure's line), a while later under load, are the line's. Before the end it grows (the ledger, "so far")."""
    clock = Clocks()
    running = goodput.Attempt(goodput.Ledger(), clock.now, wall=clock)
    clock.now += 5.0
    assert running.record()["wall"] == 5.0
    attempt = timeline()
    said, figures, record = capsys.readouterr().out.strip(), attempt.figures(), attempt.record()
    attempt.wall.now += 5.0  # the time between the line and a later reading
    assert attempt.line() == said and attempt.figures() == figures and attempt.record() == record


def test_the_hubs_line_is_said_last_and_its_end_holds_what_follows_the_fit(capsys):
    """The hub runs the fit, then ends the process group (a second's wait): the line comes after, and counts it."""
    attempt = timeline(deferred=True)
    assert capsys.readouterr().out == ""  # not at the fit's end
    attempt.wall.now += 1.0
    attempt.conclude()
    wall, seconds, _ = goodput.summed(attempt.records())
    assert capsys.readouterr().out.strip() == attempt.line() and seconds["end"] == 1.25
    assert sum(seconds.values()) == pytest.approx(wall)


def test_a_killed_attempts_steps_after_its_last_save_are_trained_again_and_said(tmp_path):
    """The killed attempt's ledger (written as it trained) got to step 6; its checkpoint holds step 4: the next
    attempt trains steps 5 and 6 again, under their own term."""
    first = timeline(steps=(1.0,) * 6, waits=())
    goodput_file.write(str(tmp_path), first.records())
    saved = [{**first.record(), "step": 4}]  # the record the checkpoint of step 4 carries
    clock = Clocks()
    ledger = goodput.Ledger()
    ledger.clock = clock
    second = goodput.Attempt(ledger, clock.now, checkpoint=SimpleNamespace(dirpath=str(tmp_path)), wall=clock)
    second.resumed(saved, 4, goodput_file.read(str(tmp_path)))
    callback = made(goodput_callback.Goodput, pl)(second)
    callback.clock = clock
    trainer = SimpleNamespace(is_global_zero=True, global_step=4, logger=None)
    callback.setup(trainer, None, "fit")
    for i in range(4):
        callback.step_start(trainer, i)
        clock.now += 1.0
        trainer.global_step += 1
        callback.step_end(trainer, trainer.global_step, None, None)
    callback.on_fit_end(trainer, None)
    wall, seconds, again = goodput.summed(second.records())
    assert again == 2 and seconds["steps trained again"] == 2.0 and seconds["training"] == 6.0 + 2.0
    assert sum(seconds.values()) == pytest.approx(wall)
    ledger = json.loads((tmp_path / goodput_file.NAME).read_text())["records"]  # both attempts, as far as each got
    assert [r["step"] for r in ledger] == [6, 8] and ledger[-1]["id"] == second.id


def test_attempts_killed_before_any_save_are_the_ledgers_and_their_steps_are_trained_again(tmp_path):
    """No checkpoint to resume from, but a ledger: the attempts killed before the job's first save (they counted for
    nothing before)."""
    first = timeline(steps=(1.0,) * 3, waits=())
    goodput_file.write(str(tmp_path), first.records())
    second = goodput.Attempt(goodput.Ledger(), 0.0, wall=lambda: 1.0)
    second.resumed([], 0, goodput_file.read(str(tmp_path)))
    assert [r["id"] for r in second.records()] == [first.id, second.id] and second.again_until == 3


def test_the_ledgers_write_holds_no_step_and_one_that_fails_is_said_once_and_retried(tmp_path, monkeypatch, capsys):
    """An S3 put of the ledger that hangs holds no step; one that fails (S3's SlowDown) is one line, and the ledger is
    written again at the next chance; each write's thread ends with it."""
    from sagemaker_lightning.checkpoints import atomic

    release, calls, put = threading.Event(), [], atomic.write

    def slow_then_throttled(path, data):
        calls.append(threading.current_thread().name)
        assert release.wait(10), "held in the training thread"
        if len(calls) == 1:
            raise OSError("SlowDown: Please reduce your request rate.")
        put(path, data)

    monkeypatch.setattr(atomic, "write", slow_then_throttled)
    clock = Clocks()
    attempt = goodput.Attempt(
        goodput.Ledger(), clock.now, checkpoint=SimpleNamespace(dirpath=str(tmp_path)), wall=clock
    )
    callback = made(goodput_callback.Goodput, pl)(attempt)
    callback.clock = clock
    trainer = SimpleNamespace(is_global_zero=True, global_step=0, logger=None)
    callback.setup(trainer, None, "fit")
    for i in range(2):  # the first step's write is held; the second's interval passes while it is in flight
        callback.step_start(trainer, i)
        clock.now += goodput_file.EVERY_S
        trainer.global_step += 1
        callback.step_end(trainer, trainer.global_step, None, None)
    release.set()
    callback.on_fit_end(trainer, None)
    assert calls == ["goodput-ledger", "goodput-ledger"]  # the held one, then the fit's end's
    said = [line for line in capsys.readouterr().out.splitlines() if "goodput.json" in line]
    assert len(said) == 1 and "(OSError: SlowDown: " in said[0] and "retried every 30 s" in said[0], said
    assert [r["step"] for r in json.loads((tmp_path / goodput_file.NAME).read_text())["records"]] == [2]
    assert not [t for t in threading.enumerate() if t.name.startswith("goodput-ledger")]


@pytest.mark.parametrize(
    "figure, said", [("12", '"12"'), (float("inf"), "Infinity"), (float("nan"), "NaN"), (-1, "-1"), (True, "true")]
)
def test_a_records_figure_that_is_no_count_of_seconds_or_steps_is_named(figure, said):
    record = {"id": "a", "wall": 2.0, "seconds": {"training": 1.0}, "steps_again": 0, "step": 2}
    assert goodput_file.problem([record]) is None
    assert goodput_file.problem([{**record, "wall": figure}]) == f"wall is {said}"
    assert goodput_file.problem([{**record, "seconds": {"end": figure}}]) == f"end is {said}"
    assert goodput_file.problem([{**record, "step": 10**400}]) == f"step is 1{'0' * 39}"  # no float holds it
    assert goodput_file.problem({"records": []}) == "not a list of records"


def test_a_checkpoints_mistyped_records_are_ignored_in_one_line_and_the_fit_ends_with_its_line(capsys):
    clock = Clocks()
    attempt = goodput.Attempt(goodput.Ledger(), clock.now, wall=clock)
    callback = made(goodput_callback.Goodput, pl)(attempt)
    callback.clock = clock
    trainer = SimpleNamespace(is_global_zero=True, global_step=4, logger=None)
    callback.setup(trainer, None, "fit")
    callback.load_state_dict({"records": [{"id": "a", "wall": "12", "seconds": {}, "step": 4}]})
    callback.on_train_start(trainer, None)
    callback.step_start(trainer, 0)
    clock.now += 1.0
    trainer.global_step += 1
    callback.step_end(trainer, trainer.global_step, None, None)
    callback.on_fit_end(trainer, None)
    said = capsys.readouterr().out.splitlines()
    assert said[0] == (
        "ignored the goodput records of the checkpoint resumed from: not goodput's records as the runtime writes them "
        '(wall is "12"); goodput goes on without them'
    )
    assert len(said) == 2 and said[1] == attempt.line() and attempt.records() == [attempt.record()]


def test_a_failures_line_is_said_whatever_its_goodput_so_far_holds(capsys):
    """fail() ends a job's failure line with the goodput so far: a figure no check foresaw leaves the line without it,
    never raises in its place (a job that failed so ended in a traceback and no failure file)."""
    from lightning.pytorch.demos.boring_classes import BoringModel

    cli = LightningCLI(BoringModel, args=["--trainer.logger=false"], run=False)
    cli.goodput.training, cli.goodput.before = True, [{"wall": "12"}]
    assert cli.fail(RuntimeError("a crash")) == 1
    errors = [line for line in capsys.readouterr().err.splitlines() if line.startswith("ERROR: ")]
    assert len(errors) == 1 and "a crash" in errors[0] and "goodput" not in errors[0], errors
