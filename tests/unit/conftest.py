"""Fixtures of the unit tier: torch's threads shared out among pytest-xdist's workers; a gloo process group of one
process, as FSDP2 needs one to shard (parallel/test_fsdp.py, checkpoints/test_checkpoint_trust.py).

Under pytest-xdist each worker's torch, and the processes its tests start, run on the worker's share of the cores. By
default each takes a thread a core, and OpenMP's threads spin while they wait: `make test-unit`'s 2 workers on 2 cores
took 68-72 s (user CPU 97-100 s), and take 52-56 s (user 68-74 s) with a thread each, back to back on this machine (2 Xeon
cores, torch 2.14.1)."""

import os

import pytest

WORKERS = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))  # 1: a plain run, which has the cores to itself
SHARE = max(1, len(os.sched_getaffinity(0)) // WORKERS)  # threads a worker's torch uses


@pytest.fixture(scope="session", autouse=True)
def threads_per_worker():
    """This worker's torch: set once (each change restarts its thread pool)."""
    if WORKERS > 1:
        import torch  # here: pytest-xdist's controller loads this file too, and runs no test (1.7 s)

        torch.set_num_threads(SHARE)


@pytest.fixture(autouse=True)
def threads_of_children(monkeypatch):
    """The processes a unit test starts: a job's processes, which another tier's tests start, keep their own."""
    if WORKERS > 1:
        monkeypatch.setenv("OMP_NUM_THREADS", str(SHARE))


@pytest.fixture
def one_process(free_port):
    """A gloo process group of one process, as FSDP2 needs one to shard (an in-process fit may have left one)."""
    import torch.distributed as dist  # as above: not in the controller
    from torch.distributed.device_mesh import init_device_mesh

    mine = not dist.is_initialized()
    if mine:
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
        dist.init_process_group("gloo", rank=0, world_size=1)
    yield init_device_mesh("cpu", (1,))
    if mine:
        dist.destroy_process_group()
