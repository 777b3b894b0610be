"""Fixtures of the unit tier: a gloo process group of one process, as FSDP2 needs one to shard (parallel/test_fsdp.py,
checkpoints/test_checkpoint_trust.py)."""

import os

import pytest


@pytest.fixture
def one_process(free_port):
    """A gloo process group of one process, as FSDP2 needs one to shard (an in-process fit may have left one)."""
    import torch.distributed as dist  # here: pytest-xdist's controller loads this file too, and runs no test (1.7 s)
    from torch.distributed.device_mesh import init_device_mesh

    mine = not dist.is_initialized()
    if mine:
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
        dist.init_process_group("gloo", rank=0, world_size=1)
    yield init_device_mesh("cpu", (1,))
    if mine:
        dist.destroy_process_group()
