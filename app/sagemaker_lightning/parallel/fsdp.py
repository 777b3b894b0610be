"""Sharded training, `trainer.strategy=fsdp`: parameters, gradients and optimizer state split across the processes
(PyTorch FSDP2, `fully_shard`), with the guarantees `ddp` has here: the launcher's cluster environment,
`dist_timeout`, NCCL on GPUs and gloo on CPUs, a `last` checkpoint every N steps, at each epoch end and on SIGTERM
that resumes exactly, and a consolidated `model.pt` that loads into the plain model. For lightning.pytorch and
pytorch_lightning projects alike: FullyShardedStrategy is a mixin made into a subclass of the project's package's
ModelParallelStrategy (lightning_package.made).

Why FSDP2 through Lightning's ModelParallelStrategy, not its FSDPStrategy: docs/fsdp.md.

Interface (the rest of the runtime wires these; docs/fsdp.md is the user's side):
    FSDPSettings                        the `fsdp` argument group (settings.py; how a model is sharded: fsdp_sharding.py)
    strategy(pl, settings, cluster_environment, timeout, trainer_config)   the strategy for Trainer(strategy=)
                                        (strategy.py, for trainer.strategy=fsdp)
    FullyShardedStrategy.sharded_state()   context: checkpoints saved inside it are sharded (checkpoints/last.py)
    FullyShardedStrategy.full_state_dict(module)   every rank calls it; rank 0 gets the consolidated weights (export.py)
    (the checkpoints ask a strategy for these two by their names, layout.sharding: they import nothing of this room)
    progress.weights_digest             gathers sharded weights (DTensor.full_tensor), so every rank calls it

Checkpoint layout, how a save is read, which one a job resumes from: checkpoints/sharded_saves.py; how one is written
(every rank hands its shards to the CheckpointIO, which writes them in the background): checkpoints/sharded_writer.py.

    python app/example/train.py --trainer.strategy fsdp --trainer.devices 2 --trainer.accelerator cpu \\
        --model.arch convnext_tiny --fsdp.activation_checkpointing true --checkpoint.dirpath ckpts --model_dir out
"""

import contextlib
from datetime import timedelta
from pathlib import Path

import torch
from torch import nn
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict, get_optimizer_state_dict

try:
    from torch.distributed.fsdp import FSDPModule
except ImportError:  # torch 2.4 and 2.5 (the SMDDP flavors' base) keep FSDP2 under its first name
    from torch.distributed._composable.fsdp import FSDPModule

from sagemaker_lightning.checkpoints import sharded_saves as layout
from sagemaker_lightning.checkpoints.io import admitted
from sagemaker_lightning.failure import UserError
from sagemaker_lightning.launch.plan import DEFAULT_TIMEOUT_S
from sagemaker_lightning.lines import say
from sagemaker_lightning.parallel.fsdp_sharding import (
    FSDPSettings,
    broadcast_buffers,
    mesh_shape,
    rebind,
    shard,
    to_device_unsharded,
)
from sagemaker_lightning.toolbox.lightning_package import attribute, made

PRECISIONS = ("32-true", "32", "bf16-mixed", "bf16-true")  # 16-mixed needs a sharded gradient scaler: none for FSDP2
SMDDP = (
    "SMDDP does not run trainer.strategy=fsdp (AWS documents it with FSDP1 and SMP v2 on P4d/P4de; FSDP2 reduces "
    "with ReduceOp.AVG, which SMDDP refuses); use distribution torch_distributed or pytorchddp (NCCL)"
)


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

    def teardown(self) -> None:
        self.checkpoint_io.teardown()  # the saves in flight end (ModelParallelStrategy's own teardown skips it)
        super().teardown()

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
        if not self._save_distributed_checkpoint:
            return super().lightning_module_state_dict()  # gathered into rank 0's host memory
        return get_model_state_dict(self.model)  # the shards where they are: the save copies them (sharded_writer)

    def optimizer_state(self, optimizer) -> dict:
        if not self._save_distributed_checkpoint:
            return super().optimizer_state(optimizer)
        return get_optimizer_state_dict(self.model, getattr(optimizer, "_optimizer", optimizer))

    @contextlib.contextmanager
    def sharded_state(self):
        """Checkpoints saved inside hold the shards, each rank's (last.ckpt); outside one file, gathered (the best)."""
        self._save_distributed_checkpoint = True
        try:
            yield
        finally:
            self._save_distributed_checkpoint = False

    def full_state_dict(self, module: nn.Module) -> dict[str, torch.Tensor]:
        """The module's consolidated weights with the plain model's keys: every rank must call it (the shards are
        gathered, one tensor at a time, into rank 0's host memory) and the others get an empty dict."""
        return get_model_state_dict(module, options=StateDictOptions(full_state_dict=True, cpu_offload=True))

    def save_checkpoint(self, checkpoint: dict, filepath, storage_options=None) -> None:
        if not self._save_distributed_checkpoint:
            return super().save_checkpoint(checkpoint, filepath, storage_options)  # one file, written by rank 0
        self.checkpoint_io.save_checkpoint(checkpoint, filepath)  # every rank: its shards (sharded_writer.py)

    def load_checkpoint(self, checkpoint_path, weights_only=None) -> dict:
        path = Path(self.broadcast(str(checkpoint_path)))  # rank 0's choice (resume.ResumePoint)
        weights_only = weights_only is not False  # torch before 2.6 (the SMDDP flavors') loads any pickle by default
        if path.is_dir():  # a sharded save, read so that nothing in it runs
            return layout.load(self, path, weights_only)
        with admitted(str(path)):  # a best checkpoint: one file
            return super().load_checkpoint(path, weights_only)
