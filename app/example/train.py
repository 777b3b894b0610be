"""Train the image classifier with the runtime's LightningCLI: the same command line on a laptop, in Docker and on
SageMaker. This file is the example's whole training script: a user's project has the same one line.

Defaults come from trainer.yaml; every one can be overridden (`--key value`, as SageMaker passes hyperparameters).

    python scripts/make_dataset.py synthetic data/synthetic
    python app/example/train.py --data.data_dir data/synthetic --trainer.max_epochs 1 --trainer.accelerator cpu --model_dir out
"""

import os

from data import CIFAR10Base
from device_data import DeviceCIFAR10DataModule  # noqa: F401 (imported, so that --data finds it by its short name)
from model import ImageClassifier
from sagemaker_lightning import LightningCLI
from streaming_data import StreamingCIFAR10DataModule  # noqa: F401 (--data=StreamingCIFAR10DataModule: data from S3)

TRAINER_YAML = os.path.join(os.path.dirname(os.path.abspath(__file__)), "trainer.yaml")


class CLI(LightningCLI):
    def add_arguments_to_parser(self, parser) -> None:
        parser.link_arguments("data.init_args.num_classes", "model.num_classes")  # the model has the data's classes

    def configure_optimizers(self, lightning_module, optimizer, lr_scheduler=None):
        """The optimizer from the configuration (--optimizer); its schedule from --lr_scheduler when given (stepped
        once per epoch, as LightningCLI does), else the model's own (ImageClassifier.lr_schedule, per step)."""
        if lr_scheduler is None and hasattr(lightning_module, "lr_schedule"):
            return {"optimizer": optimizer, "lr_scheduler": lightning_module.lr_schedule(optimizer)}
        return super().configure_optimizers(lightning_module, optimizer, lr_scheduler)


def main(args: list[str] | None = None, run: bool = True) -> CLI:
    """run=False: parse and build everything, train nothing (as tests and benchmarks use it)."""
    defaults = {"default_config_files": [TRAINER_YAML]}
    return CLI(
        ImageClassifier,
        CIFAR10Base,  # --data picks a pipeline by class name: Device-, Streaming- or CIFAR10DataModule
        subclass_mode_data=True,
        args=args,
        run=run,
        parser_kwargs={command: defaults for command in ("fit", "validate", "test")} if run else defaults,
        save_config_kwargs={"overwrite": True},
    )


if __name__ == "__main__":
    main()
