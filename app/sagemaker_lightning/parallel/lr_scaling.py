"""The linear learning-rate scaling rule, `scale_lr_by_world_size`: a mixin made into a Callback of the project's
Lightning package (lightning_package.made).

    python app/example/train.py ... --scale_lr_by_world_size true   # lr × number of processes, logged once
"""

from sagemaker_lightning.lines import say
from sagemaker_lightning.toolbox.concern import Context, Part, Setting, declares
from sagemaker_lightning.toolbox.lightning_package import made

SCALE_LR = Setting("scale_lr_by_world_size", bool, False, "optimizer lr × number of processes")


class LinearLRScaling:
    """The linear scaling rule (Goyal et al., 2017): with batch_size per process, the global batch grows with
    the world size, and so does the learning rate. Applied once, before a resumed checkpoint restores the
    optimizers (whose saved learning rates are already scaled)."""

    BASE = "callbacks.Callback"

    def on_fit_start(self, trainer, pl_module):
        factor = trainer.world_size
        for optimizer in trainer.optimizers:
            for group in optimizer.param_groups:
                for key in ("lr", "initial_lr"):  # initial_lr: where a scheduler starts from
                    if key in group:
                        group[key] *= factor
        for config in trainer.lr_scheduler_configs:
            config.scheduler.base_lrs = [lr * factor for lr in config.scheduler.base_lrs]
        if trainer.is_global_zero and trainer.optimizers:  # the peak: a scheduler's initial_lr, else the lr
            lrs = ", ".join(f"{g.get('initial_lr', g['lr']):g}" for g in trainer.optimizers[0].param_groups)
            say(f"learning rate × world size {factor} (linear scaling): {lrs}")


@declares(SCALE_LR)
def concern(ctx: Context) -> Part:
    """LinearLRScaling when scale_lr_by_world_size is on."""
    return Part(callbacks=[made(LinearLRScaling, ctx.pl)()] if SCALE_LR.of(ctx.config) else [])
