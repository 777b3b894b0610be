"""Data streamed from S3 (moto) with litdata resumes at the exact sample on every rank and node: a user's project
(streaming_project/: its own StreamingDataLoader, a schedule that asks for estimated_stepping_batches) run by the
real `train` through the image's entrypoint, stopped by SIGTERM and SIGKILL mid-epoch in the first epoch and in a later
one, then restarted, each run resuming from what the one before left. Each rank prints the ids of each step: after the
chain, each rank's ids at each step equal the uninterrupted run's, every epoch covers every id exactly once, each
epoch ends once per rank, and the final weights are the uninterrupted run's. Two hosts (NNODES=2, each host its own
cache path) without DataLoader workers, and one host with two workers.

    .venv/bin/pytest tests/toolkit/test_streaming_toolkit.py
"""

import os
import re

import boto3
import numpy as np
import pytest
from job_lines import final, resumed

pytestmark = pytest.mark.toolkit

HERE = os.path.dirname(os.path.abspath(__file__))
PROJECT = os.path.join(HERE, "streaming_project")
PLUGINS = os.path.join(os.path.dirname(HERE), "plugins")
SAMPLES, CHUNK, BATCH = 192, 10, 8  # 20 chunks, 2 of them split between ranks; whole batches, none dropped
DATA = "s3://datasets/ids"


def write_ids(folder: str) -> str:
    """SAMPLES items in litdata's optimized format, CHUNK to a chunk: an id, 16 features, a label."""
    from litdata.streaming.writer import BinaryWriter

    writer = BinaryWriter(folder, chunk_size=CHUNK)
    for i in range(SAMPLES):
        writer[i] = {"id": i, "x": np.random.default_rng(i).standard_normal(16).astype(np.float32), "y": i % 4}
    writer.done()
    writer.merge()
    return folder


@pytest.fixture(scope="session")
def ids_dir(tmp_path_factory) -> str:
    return write_ids(str(tmp_path_factory.mktemp("ids")))


@pytest.fixture
def ids_on_s3(aws, ids_dir) -> str:
    s3 = boto3.client("s3")
    s3.create_bucket(Bucket="datasets")
    for name in os.listdir(ids_dir):
        s3.upload_file(os.path.join(ids_dir, name), "datasets", f"ids/{name}")
    return DATA


def steps(output: str) -> dict[tuple[int, int], tuple[int, list[int]]]:
    """(rank, steps done before it) → (epoch, the ids of the batch) of each training step a run started."""
    found = re.findall(r"^ids rank (\d+) epoch (\d+) step (\d+): ([\d,]+)$", output, re.M)
    return {(int(r), int(s)): (int(e), [int(i) for i in ids.split(",")]) for r, e, s, ids in found}


def epoch_ends(output: str) -> list[tuple[int, int, int]]:
    return [tuple(map(int, m)) for m in re.findall(r"^epoch end rank (\d+) epoch (\d+) step (\d+)$", output, re.M)]


def resumed_at(output: str) -> int:
    return int(resumed(output).rsplit(" ", 1)[1]) if resumed(output) else 0


def faults(*named: tuple[str, dict]) -> dict:
    """The callbacks of tests/plugins/faults.py, each (its name, its arguments), after the project's own."""
    return {"trainer.callbacks+": [{"class_path": f"faults.{name}", "init_args": args} for name, args in named]}


# Every step at least 0.3 s: ranks agree on a stop at steps about StopTogether.AGREE_EVERY_S (0.25 s) of training
# apart, so a stop after fast steps (10 ms here) landed up to 25 steps late, past the epoch, and the chain resumed
# elsewhere than it asserts (1 run in 4 failed)
PACED = ("Pace", {"seconds": 0.3})


# hosts, DataLoader workers, epochs, the stops in turn, each run after the first resuming from what the one before
# left: last.ckpt every 5 steps and at each epoch's end (12 steps on two hosts, 24 on one), and the stop's. Two hosts:
# resumes from the stop's save in epoch 0, then from epoch 0's end; one host: from step 5's, then from the stop's
# (the last item: a save some run resumes from).
CHAINS = {
    "two hosts": (
        ["localhost", "127.0.0.1"],
        0,
        2,
        [faults(PACED, ("StopJob", {"step": 6})), faults(("KillRank", {"rank": 1, "step": 14}))],
        12,
    ),
    "one host, two workers": (
        ["localhost"],
        2,
        2,
        [faults(("KillRank", {"rank": 0, "step": 7})), faults(("StopJob", {"step": 30}))],
        5,
    ),
}


@pytest.mark.parametrize("chain", CHAINS)
def test_streamed_data_resumes_at_the_exact_sample(run_hosts, ids_on_s3, tmp_path, chain):
    hosts, workers, epochs, stops, resumed_from = CHAINS[chain]
    per_epoch = SAMPLES // len(hosts) // BATCH
    hps = {
        "sagemaker_program": "train.py",
        "trainer.max_epochs": epochs,
        "trainer.accelerator": "cpu",
        "trainer.enable_progress_bar": False,
        "trainer.logger": False,
        "data.data_dir": ids_on_s3,
        "data.batch_size": BATCH,
        "data.num_workers": workers,
        "last_checkpoint_every_n_steps": 5,
        "dist_timeout": 60,
        "preflight": "off",
    }

    def run(more: dict | None = None):
        env = {"PYTHONPATH": PLUGINS}  # run_job adds the image's start-up hook
        return run_hosts(hosts, {**hps, **(more or {})}, {}, code=PROJECT, env=env)

    uninterrupted = run()
    assert all(h.returncode == 0 for h in uninterrupted), [h.output[-3000:] for h in uninterrupted]
    expected = {k: v for h in uninterrupted for k, v in steps(h.output).items()}
    assert len(expected) == len(hosts) * epochs * per_epoch
    for epoch in range(epochs):  # the uninterrupted run itself: every id once an epoch, over all ranks
        ids = sorted(i for (e, batch) in expected.values() if e == epoch for i in batch)
        assert ids == list(range(SAMPLES)), f"epoch {epoch}"
    hps["checkpoint.dirpath"] = str(tmp_path / "checkpoints")  # every host's, as S3 syncs it

    chained, ends, start, starts = {}, [], 0, []
    for more in [*stops, None]:
        hosts_run = run(more)
        assert more is None or all(h.returncode != 0 for h in hosts_run), hosts_run[0].output[-3000:]
        assert resumed_at(hosts_run[0].output) == start, hosts_run[0].output[-3000:]
        starts.append(start)
        for h in hosts_run:
            started = steps(h.output)
            assert min((s for _, s in started), default=None) == start, h.output[
                -3000:
            ]  # nothing before the save again
            chained.update(started)
            ends += epoch_ends(h.output)
        saves = re.findall(r"saved last\.ckpt at epoch \d+ step (\d+)", hosts_run[0].output)
        start = int(saves[-1]) if saves else start
    assert [h.returncode for h in hosts_run] == [0] * len(hosts), hosts_run[0].output[-3000:]
    assert resumed_from in starts, starts  # an epoch end's last.ckpt (two hosts), a mid-epoch one by steps (one)
    assert chained == expected  # each rank's ids at each step, the epoch of each step too
    assert sorted(ends) == sorted((r, e, (e + 1) * per_epoch) for r in range(len(hosts)) for e in range(epochs))
    assert final(hosts_run[0].output) == final(uninterrupted[0].output)
