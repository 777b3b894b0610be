"""The random-number generators a training step draws from (torch's on the CPU and on this process's GPU, numpy's,
Python's), as one state: seeded from one integer, read and set, every rank's gathered for a checkpoint, and held
while a validation draws, so that what training draws next is what it would have drawn without that validation.

ResumableEpoch (resumable.py) seeds them at an epoch's first batch and saves every rank's state with its position;
a resumed run sets them back at its first batch. Between the two the steps draw on, as in a run never stopped.

    python -c "from sagemaker_lightning.data import draws; draws.seed_all(0); print(draws.training()['python'][1][:3])"
"""

import random

import numpy as np
import torch

_held: dict | None = None  # training's state while a validation draws (hold, release)


def seed_all(seed: int) -> None:
    """Seed the generators from one integer, each through its own direct call. torch.manual_seed would also walk every
    other device's generators and, on a machine with CUDA not (yet) initialised, record a stack trace for a lazy call:
    168 µs a call against 1.3 µs for the CPU generator alone (2-core AMD EPYC, torch 2.14.1; scripts/bench_overhead.py),
    and torch.cuda.is_available() reads NVML on each call there (0.3 ms). A step draws on the GPU its model is on,
    which Lightning made current, CUDA initialised, before the first batch; with CUDA not initialised, nothing does."""
    seed &= 0xFFFF_FFFF_FFFF_FFFF
    torch.default_generator.manual_seed(seed)
    if torch.cuda.is_initialized():
        torch.cuda.default_generators[torch.cuda.current_device()].manual_seed(seed)
    np.random.seed(seed % 2**32)
    random.seed(seed)


def current() -> dict:
    """The generators' state now, in types a checkpoint loads with weights_only=True (tensors, tuples, numbers)."""
    kind, keys, position, has_gauss, gauss = np.random.get_state()
    state = {
        "torch": torch.get_rng_state(),
        "numpy": (kind, torch.from_numpy(keys.astype(np.int64)), position, has_gauss, gauss),
        "python": random.getstate(),
    }
    if torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state(torch.cuda.current_device())
    return state


def restore(state: dict) -> None:
    """The generators set to a state `current` read (the GPU's only where CUDA is initialised here too)."""
    torch.set_rng_state(state["torch"])
    kind, keys, position, has_gauss, gauss = state["numpy"]
    np.random.set_state((kind, keys.numpy().astype(np.uint32), position, has_gauss, gauss))
    version, words, gauss_next = state["python"]
    random.setstate((version, tuple(words), gauss_next))
    if "cuda" in state and torch.cuda.is_initialized():
        torch.cuda.set_rng_state(state["cuda"], torch.cuda.current_device())


def training() -> dict:
    """Training's state: held during a validation, else the generators' own."""
    return _held if _held is not None else current()


def hold() -> None:
    """At a validation's start: training's state kept aside while the validation draws."""
    global _held
    _held = current()


def release() -> None:
    """At a validation's end: the generators back to training's state (nothing if none is held)."""
    global _held
    if _held is not None:
        restore(_held)
        _held = None


def every_rank(state: dict) -> list[dict]:
    """Every rank's `state`, in rank order: a collective where a process group runs, so every rank calls it at the
    same save (Lightning's save_checkpoint runs on every rank, each loop's state_dict with it)."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return [state]
    gathered = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, state)
    return gathered
