"""The watchdog's arithmetic and its line, without processes: the timeout, the overdue collective, who held it up
(watchdog.py, heartbeats.py).

    .venv/bin/pytest tests/unit/health/test_watchdog.py
"""

import traceback

import pytest

from sagemaker_lightning.health import heartbeats, watchdog
from sagemaker_lightning.launch.plan import FR_BUFFER_SIZE, make_plan
from sagemaker_lightning.toolbox.status import Status

pytestmark = pytest.mark.unit

NOW = 1_000.0


def entry(seq: int, age_s: float, retired: bool, name: str = "gloo:all_reduce") -> dict:
    """A flight recorder entry as torch 2.14's _dump_fr_trace_json gives it (the keys read here)."""
    created = int((NOW - age_s) * 1e9)
    return {
        "collective_seq_id": seq,
        "profiling_name": name,
        "process_group": ["0", "default_pg"],
        "retired": retired,
        "time_created_ns": created,
    }


def record(host: str, step: int, last: int, age_s: float = 0.0, stack: str | None = None, busy=None) -> dict:
    return {"host": host, "t": NOW - age_s, "step": step, "last": {"0": last}, "stack": stack, "busy": busy}


@pytest.mark.parametrize(
    ("given", "steps", "expected"),
    [
        (7.5, [], 7.5),  # the user's, from the first step
        (None, [], watchdog.FLOOR_S),  # no step timed yet: the floor, not dist_timeout (a hang in the first steps)
        (None, [20.0], 200),  # one step timed: 10 of it
        (None, [0.1] * 10, watchdog.FLOOR_S),  # 10 x 0.1 s is below the floor
        (None, [30.0] * 9 + [0.1], 300),  # 10 x the median (30 s), not the mean
        (None, [100.0] * 20, 600),  # never past dist_timeout, which bounds every collective anyway
    ],
)
def test_the_training_timeout(given, steps, expected):
    assert watchdog.timeout_s(given, steps, 600) == expected


def test_the_oldest_unfinished_collective_past_the_timeout_is_overdue():
    entries = [entry(5, 50, retired=True), entry(6, 12, retired=False), entry(7, 11, retired=False)]
    assert heartbeats.overdue(entries, int(NOW * 1e9), 10)["collective_seq_id"] == 6
    assert heartbeats.overdue(entries, int(NOW * 1e9), 12.5) is None  # none unfinished for that long
    assert heartbeats.overdue([entry(5, 50, retired=True)], int(NOW * 1e9), 10) is None  # finished long ago


def test_the_last_collective_entered_per_process_group():
    entries = [entry(56, 3, retired=True), entry(57, 2, retired=False), {**entry(9, 1, False), "is_p2p": True}]
    entries.append({**entry(4, 1, retired=True), "process_group": ["1", "mesh"]})
    assert heartbeats.last_entered(entries) == {"0": 57, "1": 4}  # a send or recv is not a collective


def test_the_held_up_ranks_are_those_that_never_entered_or_stopped_answering():
    records = {
        0: record("algo-1", 12, last=57),
        1: record("algo-2", 12, last=56, stack="training_step (model.py:40)"),  # never entered #57
        2: record("algo-3", 12, last=57),  # waits in it, as rank 0
        3: record("algo-4", 11, last=57, age_s=30),  # entered it, then its heartbeat stopped
        4: None,  # never wrote one
    }
    assert heartbeats.absent(records, "0", 57, NOW, me=0) == [1, 3, 4]
    assert heartbeats.absent(records, None, None, NOW, me=0) == [3, 4]  # no flight recorder: the silent ones only


def test_the_line_names_the_collective_the_ranks_their_hosts_and_what_they_do():
    records = {
        0: record("algo-1", 12, last=57),
        1: record("algo-2", 12, last=56, stack="training_step (model.py:40) < advance (loop.py:9)"),
        2: record("algo-3", 11, last=57, age_s=30),
    }
    said = heartbeats.line(entry(57, 25, retired=False), 20, 0, records, [1, 2], NOW)
    assert said == (
        "gloo:all_reduce #57 of process group default_pg did not finish within the training timeout of 20 s "
        "(training_timeout) on rank 0 (algo-1, step 12); rank 1 on algo-2 did not arrive: in training_step "
        "(model.py:40) < advance (loop.py:9) at step 12, last entered #56; rank 2 on algo-3 did not arrive: no "
        "heartbeat for 30 s at step 11, last entered #57: its process is stopped (SIGSTOP, a frozen host) or its "
        "network is gone"
    )
    # none held up (every rank entered it, none stopped): each rank's state instead, to compare
    said = heartbeats.line(None, 20, 0, {0: records[0], 1: record("algo-2", 12, 57, busy="writing last.ckpt")}, [], NOW)
    assert said.startswith("a collective (torch's flight recorder is off: TORCH_FR_BUFFER_SIZE) did not finish")
    assert said.endswith("rank 1 on algo-2: running at step 12, writing last.ckpt")


def test_a_stack_reads_innermost_first():
    def stuck():
        return traceback.extract_stack()

    assert heartbeats.where(stuck(), most=2).startswith("stuck (test_watchdog.py:")
    assert " < test_a_stack_reads_innermost_first (test_watchdog.py:" in heartbeats.where(stuck(), most=2)


def test_the_flight_recorder_is_on_for_sagemaker_jobs_unless_the_job_sets_it():
    env = {"SM_HOSTS": '["algo-1"]', "SM_CURRENT_HOST": "algo-1", "SM_OUTPUT_DATA_DIR": "/opt/ml/output/data"}
    assert make_plan(env, set()).env["TORCH_FR_BUFFER_SIZE"] == FR_BUFFER_SIZE
    assert make_plan(env, set()).env["TORCH_FR_DUMP_TEMP_FILE"] == "/opt/ml/output/data/flight_recorder/rank_"
    assert "TORCH_FR_BUFFER_SIZE" not in make_plan({**env, "TORCH_FR_BUFFER_SIZE": "0"}, set()).env  # the job's own


def test_a_busy_mark_lasts_for_its_block_only():
    status = Status()
    with status.busy("writing last.ckpt"):
        assert status.doing == "writing last.ckpt"
    assert status.doing is None
