"""The state a checkpoint holds, the snapshot a background save takes of it, and a training-like loop that runs while
a save is written.

The state is what Lightning's checkpoint holds for a model trained with Adam: the weights and the optimizer's two
moments per parameter (12 bytes a parameter in fp32), plus a few small entries, as a nested dict. The model is a stack
of square Linear layers (`layout`); its size is chosen by the parameter count (the issue's project: about 25M, last.ckpt
about 300 MB).

    python -c "import sys; sys.path.insert(0, 'scripts'); from checkpoint_bench import state; print(state.layout(25e6))"
"""

import math
import time

import torch

from sagemaker_lightning.checkpoints import writer

WIDTH = 2048  # the layers' width: 4.2M parameters a layer, so the default 25M is 6 layers


def layout(params: float) -> tuple[int, int]:
    """(width, layers) of square Linear layers (weight and bias) holding about `params` parameters: WIDTH wide, fewer
    layers than one only for a state smaller than one such layer (then narrower)."""
    width = min(WIDTH, max(8, math.isqrt(int(params))))
    return width, max(1, round(params / (width * width + width)))


def parameters(width: int, layers: int) -> int:
    """The parameters of `layers` Linear(width, width) layers."""
    return layers * (width * width + width)


def model(params: float, device: str = "cpu") -> torch.nn.Module:
    width, layers = layout(params)
    return torch.nn.Sequential(*(torch.nn.Linear(width, width) for _ in range(layers))).to(device)


def checkpoint(net: torch.nn.Module) -> dict:
    """A Lightning-shaped checkpoint of `net` after one Adam step (the moments exist from the first step on): its
    tensors are the model's and the optimizer's own, as trainer.save_checkpoint's dump holds them, not copies."""
    optimizer = torch.optim.Adam(net.parameters(), lr=1e-3)
    for p in net.parameters():
        p.grad = torch.randn_like(p)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return {
        "epoch": 0,
        "global_step": 1,
        "pytorch-lightning_version": "2.6.6",
        "state_dict": net.state_dict(),
        "optimizer_states": [optimizer.state_dict()],
        "lr_schedulers": [],
        "loops": {"fit_loop": {"epoch_progress": {"current": {"completed": 0}}}},
    }


def tensors(tree) -> list[torch.Tensor]:
    """Every tensor in a nested dict/list, in a fixed order: the runtime's own walk (checkpoints/writer.py)."""
    return [t for _, t in writer.tensors(tree)]


def nbytes(tree) -> int:
    """The bytes of the tensors in `tree` (views counted at their own size)."""
    return sum(t.numel() * t.element_size() for t in tensors(tree))


def mapped(tree, fn):
    """`tree` with each tensor replaced by fn(tensor); other leaves as they are."""
    if isinstance(tree, torch.Tensor):
        return fn(tree)
    if isinstance(tree, dict):
        return {key: mapped(value, fn) for key, value in tree.items()}
    if isinstance(tree, (list, tuple)):
        return type(tree)(mapped(item, fn) for item in tree)
    return tree


class Snapshot:
    """Host copies of a state's tensors, made once and filled again at each save (`take`): the copy a background save
    must block for. `shared`: in shared memory, so that a writer process reads them without a copy of its own; `pinned`:
    page-locked, so that a GPU's copy into them is a DMA that does not stage through a pageable bounce buffer."""

    def __init__(self, tree, shared: bool = False, pinned: bool = False):
        pinned = pinned and torch.cuda.is_available()

        def buffer(t: torch.Tensor) -> torch.Tensor:
            host = torch.empty(t.shape, dtype=t.dtype, pin_memory=pinned and not shared)
            if shared:
                host.share_memory_()
                if pinned:  # shared memory page-locked in place: pin_memory=True would allocate private memory
                    torch.cuda.cudart().cudaHostRegister(host.data_ptr(), max(1, host.nbytes), 0)
            return host

        self.buffers = [buffer(t) for t in tensors(tree)]
        self.copy = None

    def take(self, tree):
        """`tree` with its tensors' values copied into the buffers, returned once the copy is complete."""
        sources = iter(tensors(tree))
        buffers = iter(self.buffers)
        self.copy = mapped(tree, lambda t: next(buffers).copy_(next(sources).detach(), non_blocking=t.is_cuda))
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        return self.copy


def cloned(tree):
    """A fresh host copy of `tree`'s tensors: Lightning's AsyncCheckpointIO's snapshot (detach().clone() on the caller
    thread), memory allocated at every save."""
    return mapped(tree, lambda t: t.detach().to("cpu", copy=True))


class Trainer:
    """A training-like loop on the same threads as the save under test, so that a writer's contention shows in its
    steps' time. "compute": a small MLP whose steps keep the cores busy in torch's kernels (a CPU's training);
    "launch": a deep stack of tiny layers whose steps are Python and dispatch, each op taking the GIL back (a GPU's
    training, whose host thread launches kernels)."""

    SHAPES = {"compute": (512, 4, 64), "launch": (16, 100, 4)}  # (width, layers, batch)

    def __init__(self, device: str = "cpu", kind: str = "compute"):
        width, layers, batch = self.SHAPES[kind]
        self.net = torch.nn.Sequential(*(torch.nn.Linear(width, width) for _ in range(layers))).to(device)
        self.optimizer = torch.optim.SGD(self.net.parameters(), lr=1e-3)
        self.x = torch.randn(batch, width, device=device)
        self.cuda = device != "cpu"

    def step(self) -> None:
        loss = self.net(self.x).square().mean()
        loss.backward()
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        if self.cuda:
            torch.cuda.synchronize()

    def mean_s(self, steps: int) -> float:
        """Seconds a step, the mean of `steps` steps with nothing else running here."""
        start = time.perf_counter()
        for _ in range(steps):
            self.step()
        return (time.perf_counter() - start) / steps

    def until(self, done) -> tuple[int, float]:
        """Steps until done() (at least one), and their mean seconds: the training a background write overlaps."""
        steps, start = 0, time.perf_counter()
        while steps == 0 or not done():
            self.step()
            steps += 1
        return steps, (time.perf_counter() - start) / steps
