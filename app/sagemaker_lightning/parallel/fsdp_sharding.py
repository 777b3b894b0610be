"""How FSDP2 shards a LightningModule under trainer.strategy=fsdp (sharding.FullyShardedStrategy calls these in its
setup): the `fsdp` settings, the blocks sharded one by one and the roots, activation checkpointing, where unsharded
parts go, buffers kept the same on every rank, and optimizers made before sharding pointed at the sharded parameters.

    python -c "from sagemaker_lightning.parallel import fsdp_sharding; print(fsdp_sharding.mesh_shape('HYBRID_SHARD', 2, 8))"
"""

from dataclasses import dataclass
from typing import Literal

import torch
from torch import nn

try:
    from torch.distributed.fsdp import CPUOffloadPolicy, FSDPModule, MixedPrecisionPolicy, fully_shard
except ImportError:  # torch 2.4 and 2.5 (the SMDDP flavors' base) keep FSDP2 under its first name
    from torch.distributed._composable.fsdp import CPUOffloadPolicy, FSDPModule, MixedPrecisionPolicy, fully_shard

from sagemaker_lightning.failure import UserError

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


@dataclass
class FSDPSettings:
    """Settings of trainer.strategy=fsdp; other strategies ignore them.

    Args:
        sharding_strategy: FULL_SHARD: parameters, gradients and optimizer state split across all processes, each
            block's parameters gathered for its forward and again for its backward (least memory). SHARD_GRAD_OP:
            gathered parameters kept from forward to backward (one gather less, more memory). HYBRID_SHARD: split
            within each host, replicated across hosts (gathers stay on the host's fast links).
        auto_wrap_policy: class names (or module.QualName) of the blocks sharded one by one, e.g. [DecoderLayer];
            null: torchvision's blocks (TORCHVISION_BLOCKS).
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
