"""A sharded save as FullyShardedStrategy writes one, for the unit tests of fsdp and of its sharded saves."""

import torch
import torch.distributed.checkpoint as dcp

from sagemaker_lightning.checkpoints import layout


def save(folder, step: int, world_size: int = 2) -> str:
    """A sharded save as FullyShardedStrategy writes it, from one process (DCP without a process group)."""
    path = folder / f"step-{step:09d}-{step}"
    dcp.save({"state_dict": {"w": torch.full((4,), float(step))}}, checkpoint_id=path, no_dist=True)
    torch.save({"global_step": step, "world_size": world_size}, path / layout.META)
    return str(path)
