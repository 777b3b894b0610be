"""fsdp's sharded saves through torch's DCP, 2 ranks on gloo: dcp.save (what Lightning's ModelParallelStrategy and
the runtime's sharded saves called before) against dcp.async_save with a writer thread and with a writer process,
each with a stager kept across saves (its host buffers reused) and cached save plans, and against the runtime's own
save (checkpoints/sharded_writer.py), while FSDP2 training steps run; and the snapshot a save must block for (the
shards copied into kept host buffers), the target's measure.

Each rank holds its shard of the state (FSDP2's fully_shard over state.model, Adam's moments sharded alike); the
stall is the time the async_save call blocks the rank, the total the time until its future completes. Async saves use
a gloo group of their own: a writer thread's planning collectives on the group the training steps use would
interleave with theirs (checked on torch 2.14.1: see the design note).

    python scripts/bench_checkpoint.py --only sharded
"""

import json
import math
import os
import socket
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing

from checkpoint_bench import state

LABELS = {  # the ways, by their key in the figures
    "dcp_sync": "dcp.save (sync, today)",
    "dcp_thread": "dcp.async_save, writer thread",
    "dcp_process": "dcp.async_save, writer process",
    "runtime": "the runtime's save (sharded_writer)",
}
ALONE_STEPS = 3  # training steps timed alone just before each background save: its baseline
CPU_RANKS = 2  # on a CPU: 2 processes on gloo; on GPUs one process a GPU (gloo for the CPU, NCCL for the GPUs)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def sharded(params: float, device: str):
    """An FSDP2-sharded state.model after one Adam step, its optimizer, and the DCP state dict of both (DTensors whose
    local shards are the model's and the optimizer's own storage)."""
    from torch.distributed.checkpoint.state_dict import get_model_state_dict, get_optimizer_state_dict
    from torch.distributed.fsdp import fully_shard

    net = state.model(params, device)
    for layer in net:
        fully_shard(layer)
    fully_shard(net)
    optimizer = torch.optim.Adam(net.parameters(), lr=1e-3)
    width = net[0].in_features
    x = torch.randn(4, width, device=device)

    def step():
        net(x).square().mean().backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    step()
    return step, {"model": get_model_state_dict(net), "optim": get_optimizer_state_dict(net, optimizer)}


def until(step, future) -> tuple[int, float]:
    """Training steps until `future` completes (at least one): the same count on every rank, as collectives need."""
    steps, start = 0, time.perf_counter()
    while True:
        step()
        steps += 1
        flag = torch.tensor([float(future.done())])
        dist.all_reduce(flag, op=dist.ReduceOp.MIN)
        if flag.item():
            return steps, (time.perf_counter() - start) / steps


def rank_main(rank: int, port: int, params: float, device: str, folder: str, repeat: int) -> None:
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.default_planner import DefaultSavePlanner
    from torch.distributed.checkpoint.staging import DefaultStager, StagingOptions
    from torch.distributed.checkpoint.state_dict_saver import AsyncCheckpointerType

    from sagemaker_lightning.checkpoints.sharded_writer import ShardedWriter
    from sagemaker_lightning.checkpoints.writer import Writer

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))  # the writer process's own group finds it
    # DCP's writer process logs each save at INFO on the root logger, to the stderr it inherits: kept in a file
    log = os.open(os.path.join(folder, f"rank{rank}.log"), os.O_WRONLY | os.O_CREAT | os.O_APPEND)
    os.dup2(log, 2)
    cuda = device != "cpu"
    if cuda:
        torch.cuda.set_device(rank)
        device = f"cuda:{rank}"
    dist.init_process_group("cpu:gloo,cuda:nccl" if cuda else "gloo", rank=rank, world_size=ranks(device))
    step, tree = sharded(params, device)
    side = dist.new_group(backend="gloo")  # the async saves' collectives, apart from the training steps'
    saves = iter(range(10**6))
    local = [t.to_local() if hasattr(t, "to_local") else t for t in state.tensors(tree)]  # DTensors: this rank's shard
    results = {"rank": rank, "bytes": state.nbytes(local)}

    def target() -> str:
        return os.path.join(folder, f"save-{next(saves)}")

    def sync():
        start = time.perf_counter()
        dcp.save(tree, checkpoint_id=target())
        took = time.perf_counter() - start
        return {"stall_s": took, "total_s": took, "steps": 0, "step_s": math.nan, "alone_s": math.nan}

    def background(start_save):
        """A save that start_save() begins and whose future it returns, timed while training steps run."""
        alone_s = sum(timed(step) for _ in range(ALONE_STEPS)) / ALONE_STEPS  # this moment's baseline
        dist.barrier()
        start = time.perf_counter()
        future = start_save()
        stall = time.perf_counter() - start
        steps, step_s = until(step, future)
        future.result()
        took = time.perf_counter() - start
        return {"stall_s": stall, "total_s": took, "steps": steps, "step_s": step_s, "alone_s": alone_s}

    def dcp_async(kind, stager):
        return lambda: dcp.async_save(
            tree,
            checkpoint_id=target(),
            process_group=side,
            async_checkpointer_type=kind,
            async_stager=stager,
            planner=DefaultSavePlanner(enable_plan_caching=True),
        )

    runtime = ShardedWriter(Writer(), timeout_s=600)

    def runtime_save():  # a checkpoint as Lightning's dump makes it: the shards, and loops and callbacks for meta.pt
        checkpoint = {"state_dict": tree["model"], "optimizer_states": [tree["optim"]], "epoch": 0, "loops": {}}
        return runtime.save({**checkpoint, "global_step": next(saves)}, Path(folder, "last.ckpt"))

    def snapshot():
        """The copy a save must block for: the rank's shards into host buffers kept from the copy before."""
        start = time.perf_counter()
        snapshot_stager.stage(tree)
        return time.perf_counter() - start

    thread_stager = DefaultStager(StagingOptions(cuda, False, False, False))
    process_stager = DefaultStager(StagingOptions(cuda, True, False, False))
    snapshot_stager = DefaultStager(StagingOptions(cuda, False, False, False))
    ways = {
        "dcp_sync": sync,
        "dcp_thread": lambda: background(dcp_async(AsyncCheckpointerType.THREAD, thread_stager)),
        "dcp_process": lambda: background(dcp_async(AsyncCheckpointerType.PROCESS, process_stager)),
        "runtime": lambda: background(runtime_save),
    }
    for name, save in ways.items():
        results["first " + name] = save()  # the stager's buffers made, the plan cached, the writer process started
        results[name] = [save() for _ in range(repeat)]
    snapshot()  # its buffers made
    results["snapshot_s"] = [snapshot() for _ in range(repeat)]
    for stager in (thread_stager, process_stager, snapshot_stager):
        stager.close()
    runtime.close()
    with open(os.path.join(folder, f"rank{rank}.json"), "w") as f:
        json.dump(results, f)
    dist.barrier()
    dist.destroy_process_group()


def timed(step) -> float:
    start = time.perf_counter()
    step()
    return time.perf_counter() - start


def ranks(device: str) -> int:
    return CPU_RANKS if device == "cpu" else torch.cuda.device_count()


def saves(params: float, device: str, folder: str, repeat: int) -> list[dict]:
    """Each rank's figures: {"rank", "bytes", "log_lines", key: [run, ...], "first " + key: run}, a run being
    {"stall_s", "total_s", "steps", "step_s", "alone_s"}, the keys LABELS'."""
    n = ranks(device)
    torch.multiprocessing.spawn(rank_main, args=(free_port(), params, device, folder, repeat), nprocs=n)
    figures = []
    for rank in range(n):
        with open(os.path.join(folder, f"rank{rank}.json")) as f:
            figures.append(json.load(f))
        with open(os.path.join(folder, f"rank{rank}.log")) as f:
            figures[-1]["log_lines"] = sum(1 for _ in f)
    return figures
