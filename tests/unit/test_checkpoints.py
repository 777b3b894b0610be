"""Checkpoints a restarted job resumes from: random-number states that survive torch.load(weights_only=True),
and saves that never leave a broken file under the real name."""

import os
import pickle
import random

import numpy as np
import pytest
import pytorch_lightning
import torch

from sagemaker_lightning import checkpoints
from sagemaker_lightning.flavor import made


def test_rng_states_round_trip_through_a_weights_only_load(tmp_path):
    saved = checkpoints.rng_states()
    expected = (torch.rand(3), np.random.rand(3), random.random())
    torch.save({"rng_states": saved}, tmp_path / "c.ckpt")
    checkpoints.set_rng_states(torch.load(tmp_path / "c.ckpt", weights_only=True)["rng_states"])  # as Lightning loads
    again = (torch.rand(3), np.random.rand(3), random.random())
    assert torch.equal(expected[0], again[0]) and np.array_equal(expected[1], again[1]) and expected[2] == again[2]


def test_atomic_save_replaces_the_file_whole(tmp_path):
    io, path = made(checkpoints.AtomicCheckpointIO, pytorch_lightning)(), tmp_path / "last.ckpt"
    io.save_checkpoint({"global_step": 1}, path)
    io.save_checkpoint({"global_step": 2}, path)
    assert torch.load(path, weights_only=True) == {"global_step": 2} and os.listdir(tmp_path) == ["last.ckpt"]


def test_a_save_that_fails_midway_leaves_the_last_good_file(tmp_path):
    io, path = made(checkpoints.AtomicCheckpointIO, pytorch_lightning)(), tmp_path / "last.ckpt"
    io.save_checkpoint({"global_step": 1}, path)
    with pytest.raises((AttributeError, pickle.PicklingError)):  # a local lambda cannot be pickled
        io.save_checkpoint({"global_step": 2, "unpicklable": lambda: None}, path)  # fails while writing
    assert torch.load(path, weights_only=True) == {"global_step": 1} and os.listdir(tmp_path) == ["last.ckpt"]
