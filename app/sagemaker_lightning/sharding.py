"""Sharded training, `trainer.strategy=fsdp`: parameters, gradients and optimizer state split across the processes
(PyTorch FSDP2, `fully_shard`), with the guarantees `ddp` has here: the launcher's cluster environment,
`dist_timeout`, NCCL on GPUs and gloo on CPUs, a `last` checkpoint every N steps, at each epoch end and on SIGTERM
that resumes exactly, and a consolidated `model.pt` that loads into the plain model. For lightning.pytorch and
pytorch_lightning projects alike: FullyShardedStrategy is a mixin made into a subclass of the project's package's
ModelParallelStrategy (flavor.made).

Why FSDP2 through Lightning's ModelParallelStrategy, not its FSDPStrategy: docs/fsdp.md.

Interface (the rest of the runtime wires these; docs/fsdp.md is the user's side):
    FSDPSettings                        the `fsdp` argument group (cli.py)
    strategy(pl, settings, cluster_environment, timeout, trainer_config)   the strategy for Trainer(strategy=)
                                        (strategy.py, for trainer.strategy=fsdp)
    sharded_saves(strategy)             context: checkpoints saved inside it are sharded (checkpoints.LastCheckpoint)
    full_state_dict(strategy, module)   every rank calls it; rank 0 gets the consolidated weights (export.py)
    callbacks.weights_digest            gathers sharded weights (DTensor.full_tensor), so every rank calls it

Checkpoint layout, how a save is written and read, which one a job resumes from: checkpoints/sharded.py.

    python app/example/train.py --trainer.strategy fsdp --trainer.devices 2 --trainer.accelerator cpu \\
        --model.arch convnext_tiny --fsdp.activation_checkpointing true --checkpoint.dirpath ckpts --model_dir out
"""

import contextlib
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Literal

import torch
from torch import nn
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

try:
    from torch.distributed.fsdp import CPUOffloadPolicy, FSDPModule, MixedPrecisionPolicy, fully_shard
except ImportError:  # torch 2.4 and 2.5 (the SMDDP flavors' base) keep FSDP2 under its first name
    from torch.distributed._composable.fsdp import CPUOffloadPolicy, FSDPModule, MixedPrecisionPolicy, fully_shard

from sagemaker_lightning.checkpoints import sharded as layout
from sagemaker_lightning.failure import UserError
from sagemaker_lightning.flavor import attribute, made
from sagemaker_lightning.lines import say
from sagemaker_lightning.plan import DEFAULT_TIMEOUT_S

# Blocks of torchvision's classification models, each sharded as one unit (gathered for its forward and backward,
# then freed): ResNet/Wide ResNet/ResNeXt, ViT, ConvNeXt, Swin (v1, v2), EfficientNet (v1, v2) and MaxViT,
# MobileNet v2/v3 and ShuffleNet v2, MNASNet, RegNet, DenseNet. A model with none of these (VGG, AlexNet) is
# sharded as a whole: parameters, gradients and optimizer state still split, the full model gathered at once.
TORCHVISION_BLOCKS = (
    "BasicBlock",
    "Bottleneck",
    "EncoderBlock",
    "CNBlock",
    "SwinTransformerBlock",
    "SwinTransformerBlockV2",
    "MBConv",
    "FusedMBConv",
    "InvertedResidual",
    "_InvertedResidual",
    "ResBottleneckBlock",
    "_DenseLayer",
)
PRECISIONS = ("32-true", "32", "bf16-mixed", "bf16-true")  # 16-mixed needs a sharded gradient scaler: none for FSDP2
SMDDP = (
    "SMDDP does not run trainer.strategy=fsdp (AWS documents it with FSDP1 and SMP v2 on P4d/P4de; FSDP2 reduces "
    "with ReduceOp.AVG, which SMDDP refuses); use distribution torch_distributed or pytorchddp (NCCL)"
)


@dataclass
class FSDPSettings:
    """Settings of trainer.strategy=fsdp; other strategies ignore them.

    Args:
        sharding_strategy: FULL_SHARD: parameters, gradients and optimizer state split across all processes, each
            block's parameters gathered for its forward and again for its backward (least memory). SHARD_GRAD_OP:
            gathered parameters kept from forward to backward (one gather less, more memory). HYBRID_SHARD: split
            within each host, replicated across hosts (gathers stay on the host's fast links).
        auto_wrap_policy: class names (or module.QualName) of the blocks sharded one by one, e.g. [DecoderLayer];
            null: torchvision's blocks (sharding.TORCHVISION_BLOCKS).
        activation_checkpointing: recompute each block's activations in the backward pass instead of keeping them.
        cpu_offload: keep the parameter, gradient and optimizer-state shards in host memory (GPUs only); the
            optimizer steps on the CPU.
        mixed_precision: bf16: gather parameters and compute in bfloat16, reduce gradients in float32 (halves the
            gather traffic); null: the dtype trainer.precision gives.
    """

    sharding_strategy: Literal["FULL_SHARD", "SHARD_GRAD_OP", "HYBRID_SHARD"] = "FULL_SHARD"
    auto_wrap_policy: list[str] | None = None
    activation_checkpointing: bool = False
    cpu_offload: bool = False
    mixed_precision: Literal["bf16"] | None = None


def strategy(
    pl, settings: FSDPSettings, cluster_environment, timeout: timedelta, trainer_config
) -> "FullyShardedStrategy":
    """The strategy for trainer.strategy=fsdp in Lightning package `pl`; bad combinations fail here, before any
    process starts."""
    precision = trainer_config.get("precision")
    if precision is not None and str(precision) not in PRECISIONS:
        raise UserError(
            f"trainer.precision={precision} does not work with trainer.strategy=fsdp (no sharded gradient scaler); "
            "use bf16-mixed (GPUs from A100/A10G/L4 on, and CPUs) or 32-true, or trainer.strategy=ddp"
        )
    if settings.cpu_offload and trainer_config.get("accelerator") == "cpu":
        raise UserError("fsdp.cpu_offload moves shards off the GPU; with trainer.accelerator=cpu set it to false")
    return made(FullyShardedStrategy, pl)(settings, cluster_environment=cluster_environment, timeout=timeout)


def mesh_shape(sharding_strategy: str, num_nodes: int, processes_per_node: int) -> tuple[int, ...]:
    """The device mesh: one dimension to shard over, or (replicate across hosts, shard within a host)."""
    if sharding_strategy == "HYBRID_SHARD":
        return (num_nodes, processes_per_node)
    return (num_nodes * processes_per_node,)


def matches(module: nn.Module, names: list[str] | tuple[str, ...]) -> bool:
    cls = type(module)
    return cls.__name__ in names or f"{cls.__module__}.{cls.__qualname__}" in names


def blocks(model: nn.Module, names: list[str] | tuple[str, ...]) -> list[nn.Module]:
    """The modules to shard one by one, innermost first (FSDP2 shards bottom-up)."""
    found = [m for m in model.modules() if matches(m, names)]
    return found[::-1]  # modules() lists parents before their children


def shard(module: nn.Module, settings: FSDPSettings, mesh, offload: bool) -> tuple[list[nn.Module], list[str]]:
    """Shard a LightningModule in place: each block of the wrap policy, then each child that holds parameters
    (a root: the LightningModule itself is never sharded, its hooks are not forward). Returns the blocks and
    the roots' names."""
    names = settings.auto_wrap_policy or TORCHVISION_BLOCKS
    found = blocks(module, names)
    if settings.auto_wrap_policy and not found:
        classes = sorted({type(m).__name__ for m in module.modules()})
        raise UserError(
            f"fsdp.auto_wrap_policy={settings.auto_wrap_policy} names no module of the model; its classes are "
            f"{', '.join(classes[:30])}"
        )
    own = [name for name, _ in module.named_parameters(recurse=False)]
    if own:
        raise UserError(
            f"{type(module).__name__} holds parameters itself ({', '.join(own[:5])}); trainer.strategy=fsdp shards "
            "submodules: move them into one (an nn.Module attribute)"
        )
    for p in module.parameters():
        if not p.is_contiguous():  # FSDP2 shards contiguous tensors only (channels-last weights are not)
            p.data = p.data.contiguous()
    if settings.activation_checkpointing:
        found = checkpointed(module, found)
    kwargs = {
        "mesh": mesh,
        "reshard_after_forward": settings.sharding_strategy != "SHARD_GRAD_OP",
        "mp_policy": MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
        if settings.mixed_precision == "bf16"
        else MixedPrecisionPolicy(),
    }
    if offload:
        kwargs["offload_policy"] = CPUOffloadPolicy()
    for block in found:
        fully_shard(block, **kwargs)
    roots = []
    for name, child in module.named_children():
        if not isinstance(child, FSDPModule) and any(p.requires_grad for p in child.parameters()):
            fully_shard(child, **kwargs)
            roots.append(name)
    return found, roots


def checkpointed(module: nn.Module, found: list[nn.Module]) -> list[nn.Module]:
    """Each block wrapped in a CheckpointWrapper (state dict keys unchanged); the wrappers, innermost first."""
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import (
        CheckpointWrapper,
        apply_activation_checkpointing,
    )

    targets = set(map(id, found))
    apply_activation_checkpointing(module, check_fn=lambda m: id(m) in targets)
    wrappers = [m for m in module.modules() if isinstance(m, CheckpointWrapper)]
    return wrappers[::-1]


def to_device_unsharded(module: nn.Module, device: torch.device) -> None:
    """Move what FSDP does not manage (metrics, buffers outside sharded modules) to the device, leaving the
    sharded modules where their offload policy keeps them."""
    for child in module.children():
        if any(isinstance(m, FSDPModule) for m in child.modules()):
            if not isinstance(child, FSDPModule):
                to_device_unsharded(child, device)
        else:
            child.to(device)  # torchmetrics' Metric.to moves its states too
    for key, buffer in module._buffers.items():
        if buffer is not None:
            module._buffers[key] = buffer.to(device)


def broadcast_buffers(buffers: list[torch.Tensor]) -> None:
    """Rank 0's buffers (BatchNorm running statistics) to every rank, as DDP does before each forward: FSDP does
    not shard buffers and would otherwise let each rank's drift apart (and a checkpoint keeps only one copy)."""
    by_dtype: dict[torch.dtype, list[torch.Tensor]] = {}
    for b in buffers:
        by_dtype.setdefault(b.dtype, []).append(b)
    for group in by_dtype.values():
        flat = torch.cat([b.reshape(-1) for b in group])
        torch.distributed.broadcast(flat, src=0)
        for b, value in zip(group, flat.split([b.numel() for b in group]), strict=True):
            b.copy_(value.view_as(b))


class FullyShardedStrategy:
    """FSDP2 for any LightningModule: blocks of the wrap policy and the module's children sharded in setup()."""

    BASE = "strategies.ModelParallelStrategy"

    def __init__(
        self,
        settings: FSDPSettings,
        cluster_environment=None,
        timeout: timedelta = timedelta(seconds=DEFAULT_TIMEOUT_S),
    ) -> None:
        super().__init__(save_distributed_checkpoint=False, timeout=timeout)  # best checkpoints: one full file
        self.settings = settings
        self.cluster_environment = cluster_environment
        self._buffers: list[torch.Tensor] = []
        self._previous: str | None = None  # the newest complete save in last.ckpt/ this run wrote or resumed from

    def setup_environment(self) -> None:
        # Lightning's data_parallel × tensor_parallel mesh, all data-parallel; the sharding mesh is made in setup()
        self._data_parallel_size, self._tensor_parallel_size = self.num_nodes * self.num_processes, 1
        super().setup_environment()

    @property
    def distributed_sampler_kwargs(self) -> dict:
        return {"num_replicas": self.world_size, "rank": self.global_rank}

    def setup(self, trainer) -> None:
        from torch.distributed.device_mesh import init_device_mesh

        lightning = attribute(self.pl, "strategies.model_parallel")  # with the fabric of the same package
        fitting = trainer.state.fn == attribute(self.pl, "trainer.states.TrainerFn").FITTING
        self.accelerator.setup(trainer)
        offload = self.settings.cpu_offload
        if offload and self.root_device.type != "cuda":
            raise UserError("fsdp.cpu_offload moves shards off the GPU; this process has none: set it to false")
        # LightningCLI makes the optimizer before fit, over the parameters sharding replaces
        self._unsharded = {id(p): (name, p) for name, p in self.model.named_parameters()}
        if any(isinstance(m, FSDPModule) for m in self.model.modules()):
            if self.global_rank == 0:
                say("fsdp: the model's configure_model sharded it; fsdp.auto_wrap_policy is not applied")
        else:
            shape = mesh_shape(self.settings.sharding_strategy, self.num_nodes, self.num_processes)
            names = ("replicate", "shard") if len(shape) == 2 else ("shard",)
            mesh = init_device_mesh(self.root_device.type, shape, mesh_dim_names=names)
            found, roots = shard(self.model, self.settings, mesh, offload)
            if self.global_rank == 0:
                say(
                    f"fsdp: {self.settings.sharding_strategy} over {self.world_size} processes, {len(found)} blocks "
                    f"and {len(roots)} roots ({', '.join(roots)}) sharded"
                )
        lightning._materialize_distributed_module(self.model, self.root_device)
        self.model = self.precision_plugin.convert_module(self.model)
        if offload:
            to_device_unsharded(self.model, self.root_device)
        else:
            self.model_to_device()
        self._buffers = list(self.model.buffers())
        self.barrier()
        if fitting:
            self.setup_optimizers(trainer)
        self.setup_precision_plugin()
        if fitting and not offload:
            lightning._optimizers_to_device(self.optimizers, self.root_device)

    def setup_optimizers(self, trainer) -> None:
        super().setup_optimizers(trainer)
        rebind(self.optimizers, self._unsharded, dict(self.model.named_parameters()))
        self._unsharded = {}  # the unsharded parameters go, with the last reference to them

    def _sync_buffers(self) -> None:
        if self._buffers and self.world_size > 1:
            with torch.no_grad():
                broadcast_buffers(self._buffers)

    # before each forward, as DDP does (its broadcast_buffers=True), in training and in evaluation
    def training_step(self, *args, **kwargs):
        self._sync_buffers()
        return super().training_step(*args, **kwargs)

    def validation_step(self, *args, **kwargs):
        self._sync_buffers()
        return super().validation_step(*args, **kwargs)

    def test_step(self, *args, **kwargs):
        self._sync_buffers()
        return super().test_step(*args, **kwargs)

    def predict_step(self, *args, **kwargs):
        self._sync_buffers()
        return super().predict_step(*args, **kwargs)

    def lightning_module_state_dict(self) -> dict:
        # rank 0's buffers, those the next forward broadcasts: DCP writes each unsharded tensor from one rank, not
        # always rank 0 (its plans balance the writes), so a save could mix both ranks' BatchNorm statistics and a
        # resumed run would drift from an uninterrupted one (seen with MobileNet-V3, 2 processes)
        self._sync_buffers()
        return super().lightning_module_state_dict()

    def save_checkpoint(self, checkpoint: dict, filepath, storage_options=None) -> None:
        if not self._save_distributed_checkpoint:
            return super().save_checkpoint(checkpoint, filepath, storage_options)  # one file, written by rank 0
        self._previous = layout.save(self, checkpoint, Path(filepath), self._previous)

    def load_checkpoint(self, checkpoint_path, weights_only=None) -> dict:
        path = Path(self.broadcast(str(checkpoint_path)))  # rank 0's choice (resume.ResumePoint)
        self._previous = path.name  # complete: kept beside the next save
        return layout.load(self, path, lambda: super(FullyShardedStrategy, self).load_checkpoint(path, weights_only))


def rebind(optimizers: list, unsharded: dict[int, tuple[str, nn.Parameter]], params: dict[str, nn.Parameter]) -> None:
    """Point optimizers made before sharding at the sharded parameters of the same names (an activation-checkpoint
    wrapper's part of a name does not count); optimizers made after are left as they are."""
    by_name = {name.replace("_checkpoint_wrapped_module.", ""): p for name, p in params.items()}
    for optimizer in optimizers:
        for group in optimizer.param_groups:
            group["params"] = [
                by_name[unsharded[id(p)][0]] if unsharded.get(id(p), (None, None))[1] is p else p
                for p in group["params"]
            ]


def sharded(strategy) -> bool:
    return isinstance(strategy, FullyShardedStrategy)


@contextlib.contextmanager
def sharded_saves(strategy):
    """Checkpoints saved inside are sharded (one file per rank) under trainer.strategy=fsdp; unchanged otherwise."""
    if not sharded(strategy):
        yield
        return
    strategy._save_distributed_checkpoint = True
    try:
        yield
    finally:
        strategy._save_distributed_checkpoint = False


def full_state_dict(strategy, module: nn.Module) -> dict[str, torch.Tensor]:
    """The module's consolidated weights with the plain model's keys. Under fsdp every rank must call it (the shards
    are gathered, one tensor at a time, into rank 0's host memory) and the others get an empty dict; elsewhere it is
    module.state_dict()."""
    if not sharded(strategy):
        return module.state_dict()
    return get_model_state_dict(module, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
