"""fsdp's sharded saves in the background (checkpoints/sharded_writer.py), one gloo process: a save returns before its
shards are written and holds the state as it was asked for, the save before the newest stays and older ones go, and
a write that fails is one line with the save before it kept. DCP's writes are held back by an event, not timed.

    .venv/bin/pytest tests/unit/checkpoints/test_sharded_writer.py
"""

import errno
import functools
import os
import threading

import pytest
import pytorch_lightning
import torch
from sharded_save import save
from torch.distributed.checkpoint import FileSystemWriter
from torch.distributed.checkpoint.state_dict import get_model_state_dict
from torch.distributed.fsdp import fully_shard

from sagemaker_lightning.checkpoints import sharded_saves
from sagemaker_lightning.checkpoints.io import BackgroundCheckpointIO
from sagemaker_lightning.checkpoints.sharded_writer import ShardedWriter
from sagemaker_lightning.failure import UserError
from sagemaker_lightning.toolbox.lightning_package import made

pytestmark = pytest.mark.unit
SHARDS = functools.partial(ShardedWriter, timeout_s=60)  # what checkpoints/concern.py gives the CheckpointIO under fsdp


@pytest.fixture
def net(one_process):
    torch.manual_seed(0)
    return fully_shard(torch.nn.Linear(4, 4), mesh=one_process)


@pytest.fixture
def held(monkeypatch):
    """DCP's write of each rank's shards waits for `release`; `fail` names a save (its step) whose write fails."""
    release, fail, write = threading.Event(), set(), FileSystemWriter.write_data

    def held_write(storage, plan, planner):
        assert release.wait(30), "the test never released the write"
        if any(f"step-{s:09d}-" in str(storage.path) for s in fail):
            raise OSError(errno.ENOSPC, "No space left on device")
        return write(storage, plan, planner)

    monkeypatch.setattr(FileSystemWriter, "write_data", held_write)
    return release, fail


def checkpoint(net, step: int) -> dict:
    """What Lightning hands the strategy's save under fsdp's sharded state: the shards, and the rest for meta.pt."""
    return {"global_step": step, "epoch": 0, "state_dict": get_model_state_dict(net), "optimizer_states": []}


def saved_weight(save) -> torch.Tensor:
    state = {"state_dict": {"weight": torch.zeros(4, 4)}}
    sharded_saves.read(state, save)
    return state["state_dict"]["weight"]


def test_a_save_returns_before_its_shards_are_written_and_holds_the_state_it_was_given(net, held, tmp_path):
    release, _ = held
    io = made(BackgroundCheckpointIO, pytorch_lightning)(sharded=SHARDS)
    root = tmp_path / "last.ckpt"
    before = net.weight.full_tensor().clone()
    io.save_checkpoint(checkpoint(net, 1), root)  # returns with DCP's write held back
    (first,) = os.listdir(root)
    assert sharded_saves.missing(root / first) == [".metadata"]  # not complete while written
    with torch.no_grad():
        net.weight.add_(1.0)  # training goes on while the shards are written
    release.set()
    io.wait()
    assert torch.equal(saved_weight(root / first), before)  # the weights as they were at the save, not since
    for step in (2, 3):
        io.save_checkpoint(checkpoint(net, step), root)  # each waits for the one in flight
    io.teardown()
    saves = sorted(os.listdir(root))  # the newest and the complete one before it; step 1's pruned
    assert [s[:14] for s in saves] == ["step-000000002", "step-000000003"], saves
    assert all(sharded_saves.missing(root / s) == [] for s in saves)
    assert torch.equal(saved_weight(root / saves[-1]), before + 1.0)


def test_a_sharded_write_that_fails_is_one_line_and_the_save_before_stays(net, held, tmp_path):
    release, fail = held
    release.set()
    io = made(BackgroundCheckpointIO, pytorch_lightning)(sharded=SHARDS)
    root = tmp_path / "last.ckpt"
    io.save_checkpoint(checkpoint(net, 1), root)
    fail.add(2)  # a full disk at step 2's shards
    io.save_checkpoint(checkpoint(net, 2), root)
    with pytest.raises(UserError, match=r"writing .*step-000000002-\d+ failed in the background \(OSError: .*No space"):
        io.wait()
    (kept,) = [s for s in os.listdir(root) if sharded_saves.missing(root / s) == []]
    assert kept.startswith("step-000000001-")
    assert sharded_saves.resume_path(str(tmp_path), announce=False) == str(root / kept)
    io.save_checkpoint(checkpoint(net, 3), root)  # the next save goes on: the failure was said once
    io.teardown()
    assert sorted(s[:14] for s in os.listdir(root) if not sharded_saves.missing(root / s))[-1] == "step-000000003"


def test_a_save_at_the_step_resumed_from_keeps_the_save_resumed_from(net, held, tmp_path):
    """A stop right after a resume saves at the resumed step: that save replaces no other, the one resumed from stays
    beside it (pruned, it left one save, still uploading when the job was reclaimed); the next step's save then
    keeps only the newest two."""
    release, _ = held
    release.set()
    root = tmp_path / "last.ckpt"
    root.mkdir()
    resumed = os.path.basename(save(root, 3, world_size=1))  # a complete save of step 3, as S3 gave it back
    io = made(BackgroundCheckpointIO, pytorch_lightning)(sharded=SHARDS)
    io.save_checkpoint(checkpoint(net, 3), root)
    io.wait()
    assert resumed in os.listdir(root) and len(os.listdir(root)) == 2
    io.save_checkpoint(checkpoint(net, 4), root)
    io.teardown()
    assert resumed not in os.listdir(root) and sorted(s[:14] for s in os.listdir(root)) == [
        "step-000000003",
        "step-000000004",
    ]
