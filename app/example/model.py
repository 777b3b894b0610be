"""An image classifier around any torchvision classification model, as a LightningModule.

The optimizer is not chosen here: LightningCLI makes it from the command line (`--optimizer Adam --optimizer.lr
1e-3`), with defaults in trainer.yaml. The learning-rate schedule over that optimizer is the model's
(`lr_schedule`: linear warm-up, then a half cosine to zero, stepped per optimizer step), unless `--lr_scheduler`
names another.

    python -c "import torch, model; print(model.ImageClassifier('resnet18')(torch.zeros(2, 3, 32, 32)).shape)"
"""

import math
import os
import sys
from typing import Literal

import pytorch_lightning as pl
import torch
import torchvision
import yaml
from torch import nn
from torch.nn import functional as F
from torch.optim.lr_scheduler import LambdaLR
from torchmetrics import MeanMetric
from torchmetrics.classification import MulticlassAccuracy

from data import SIZE
from sagemaker_lightning import UserError


def build_network(arch: str, num_classes: int, cifar_stem: bool) -> nn.Module:
    """A torchvision model by name, untrained, that takes the data's SIZE×SIZE images; ResNets get the CIFAR stem
    when asked."""
    if arch not in torchvision.models.list_models(module=torchvision.models):
        raise UserError(f"model.arch={arch!r} is not a torchvision classification model; try resnet18, resnet50, ...")
    net = torchvision.models.get_model(arch, weights=None, num_classes=num_classes)
    if cifar_stem and isinstance(net, torchvision.models.ResNet):
        # 32×32 images: a 3×3 stride-1 first convolution and no max-pool keep layer1 at 32×32, not 8×8
        net.conv1 = nn.Conv2d(3, net.conv1.out_channels, kernel_size=3, stride=1, padding=1, bias=False)
        net.maxpool = nn.Identity()
    try:  # one image through the network now, not a traceback at the first step (ViTs: 224 only; Inception: ≥75)
        with torch.no_grad():
            net.eval()(torch.zeros(1, 3, SIZE, SIZE))
    except (RuntimeError, AssertionError, ValueError) as e:
        raise UserError(
            f"model.arch={arch!r} cannot take the data's {SIZE}×{SIZE} images ({str(e).splitlines()[0]}); "
            "pick a model that can, e.g. resnet18, resnet50, mobilenet_v3_small, efficientnet_b0"
        ) from None
    return net.train()


def warmup_cosine(step: int, total: int, warmup: int) -> float:
    """The learning rate's factor for optimizer step `step` (from 0) of `total`: rising linearly over the first
    `warmup` steps to 1 (1/warmup at step 0), then falling along half a cosine to 0 at step `total`."""
    if step < warmup:
        return (step + 1) / warmup
    return 0.5 * (1 + math.cos(math.pi * min(1.0, (step - warmup) / max(1, total - warmup))))


class WarmupCosine:
    """warmup_cosine as LambdaLR's function, with a warm-up of `fraction` of the run; the run's length is given
    when it starts (start). Until then the factor is 1. LambdaLR saves its attributes in each checkpoint."""

    def __init__(self, fraction: float):
        self.fraction, self.total, self.warmup = fraction, 0, 0

    def start(self, total: int) -> None:
        self.total, self.warmup = total, round(self.fraction * total)

    def __call__(self, step: int) -> float:
        return warmup_cosine(step, self.total, self.warmup)


class ImageClassifier(pl.LightningModule):
    def __init__(
        self,
        arch: str = "resnet18",
        num_classes: int = 10,
        cifar_stem: bool = True,
        channels_last: bool = False,
        compile: bool | Literal["reduce-overhead", "max-autotune"] = False,
        lr_warmup: float = 0.0,
        label_smoothing: float = 0.0,
    ):
        """
        Args:
            arch: torchvision model name (torchvision.models.list_models()).
            num_classes: number of output classes; linked from the data module.
            cifar_stem: for ResNets, the 3×3 stride-1 stem without max-pool made for 32×32 images.
            channels_last: weights and inputs in NHWC memory order, the one fast convolution kernels read.
            compile: run the network through torch.compile (the first steps compile it); or a torch.compile mode:
                "reduce-overhead" also replays each step's kernels as CUDA graphs on a GPU, one launch where a
                host-bound step makes hundreds; "max-autotune" also tunes the kernels (long compile).
            lr_warmup: the fraction of all optimizer steps over which the learning rate rises to the optimizer's;
                after it, the rate falls along half a cosine to 0 at the last step.
            label_smoothing: the weight of the uniform distribution mixed into the training targets (0: none).
        """
        super().__init__()
        self.save_hyperparameters()
        self.net = build_network(arch, num_classes, cifar_stem)
        self.memory_format = torch.channels_last if channels_last else torch.contiguous_format
        self.net.to(memory_format=self.memory_format)
        if compile:  # in place: the weights keep their names, so model.pt loads into an uncompiled network
            self.net.compile(mode=None if compile is True else compile)
        # Metrics reduce by sum and count across ranks, never by ReduceOp.AVG (which SMDDP rejects). The training
        # metric skips its input checks: they read values back from the device, a GPU stall on every step
        self.train_acc = MulticlassAccuracy(num_classes, average="micro", validate_args=False)
        self.val_acc = MulticlassAccuracy(num_classes, average="micro")
        self.val_loss = MeanMetric()
        self.scheduler = None  # lr_schedule's, once the optimizers are configured

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x.contiguous(memory_format=self.memory_format))  # no copy when x is in that order already

    def training_step(self, batch, batch_idx):
        x, y = batch
        logits = self(x)
        loss = F.cross_entropy(logits, y, label_smoothing=self.hparams.label_smoothing)
        self.train_acc(logits, y)
        self.log("train/loss", loss, prog_bar=True)
        self.log("train/acc", self.train_acc)
        return loss

    def validation_step(self, batch, batch_idx):
        x, y = batch
        logits = self(x)
        self.val_loss(F.cross_entropy(logits, y))
        self.val_acc(logits, y)
        self.log("val/loss", self.val_loss, prog_bar=True)
        self.log("val/acc", self.val_acc, prog_bar=True)

    def lr_schedule(self, optimizer: torch.optim.Optimizer) -> dict:
        """The learning-rate schedule over `optimizer` (train.py's CLI asks for it when no --lr_scheduler is given),
        as Lightning's scheduler configuration: stepped after every optimizer step. Its length is set when training
        starts (on_train_start)."""
        self.scheduler = LambdaLR(optimizer, WarmupCosine(self.hparams.lr_warmup))
        return {"scheduler": self.scheduler, "interval": "step"}

    def on_train_start(self):
        """The schedule spans the optimizer steps of this run: the Trainer's estimate, max_epochs × the steps per epoch
        of each process (its share of the data at this world size, limit_train_batches, accumulate_grad_batches), or
        max_steps. Asked for here, once the data is set up and a resumed run has restored its position in the epoch
        and the schedule's step; asked for in configure_optimizers, it would set the data up before that restore,
        which Lightning then skips, and a resumed run would repeat the epoch's first batches (Lightning issue 20550).
        A resumed run continues from the step reached, on the schedule of its own length."""
        if self.scheduler is None:
            return
        total = self.trainer.estimated_stepping_batches
        if total == float("inf"):
            raise UserError(
                "the learning-rate schedule needs a finite run: set trainer.max_epochs or trainer.max_steps"
            )
        schedule = self.scheduler.lr_lambdas[0]
        schedule.start(int(total))
        factor = schedule(self.scheduler.last_epoch)  # the step reached: 0, or a resumed run's
        for group, peak in zip(self.scheduler.optimizer.param_groups, self.scheduler.base_lrs, strict=True):
            group["lr"] = peak * factor
        if self.trainer.is_global_zero:
            peaks = ", ".join(f"{peak:g}" for peak in self.scheduler.base_lrs)
            sys.stdout.write(  # one write: print() writes the newline apart, and ranks share one stream
                f"learning rate: {peaks} after a linear warm-up of {schedule.warmup} of {schedule.total} optimizer "
                "steps, then a half cosine to 0\n"
            )

    @classmethod
    def from_model_dir(cls, model_dir: str) -> "ImageClassifier":
        """The trained model from a job's model directory (model.tar.gz unpacked): config.yaml + model.pt."""
        with open(os.path.join(model_dir, "config.yaml")) as f:
            config = yaml.safe_load(f)
        # num_classes is linked from the data module (train.py), so the config holds it there; compiling is for
        # training speed, and a loaded model answers its first call at once without it
        settings = {**config["model"], "num_classes": config["data"]["init_args"]["num_classes"], "compile": False}
        model = cls(**settings)
        model.load_state_dict(torch.load(os.path.join(model_dir, "model.pt"), map_location="cpu", weights_only=True))
        return model.eval()
