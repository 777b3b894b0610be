"""The runtime's settings on the parser, beside Lightning's (`trainer`, `model`, `data`, ...): `checkpoint`
(ModelCheckpoint), `logger` (TensorBoard) and `fsdp` (sharding.FSDPSettings) as their classes' groups, and in a group
of their own the settings each concern declares beside it (toolbox/concern.py: `declares`), in the hub's order. Each
can be given as `--key value`, in a YAML config or as a SageMaker hyperparameter.

    python app/example/train.py fit --help | grep -A2 -- --dist_timeout
"""

from collections.abc import Iterable

from sagemaker_lightning.parallel.fsdp_sharding import FSDPSettings
from sagemaker_lightning.toolbox import lightning_package

GROUP = "sagemaker-lightning (the runtime's settings)"
FILLED_IN = (  # the help's words on what a SageMaker job gives the runtime, before the user's own settings
    "On SageMaker the job fills in checkpoint.dirpath (the checkpoint directory SageMaker syncs: /opt/ml/checkpoints), "
    "model_dir (SM_MODEL_DIR, packed into model.tar.gz), trainer.default_root_dir and logger.save_dir (under "
    "SM_OUTPUT_DATA_DIR) and the data module's data_dir (the training channel; LightningCLI(data_channels=...) names "
    "another argument); settings given here win. Off SageMaker nothing is filled in: resuming and last.ckpt start "
    "with checkpoint.dirpath, the export with model_dir (README: Off SageMaker)."
)


def add_to(parser, pl, concerns: Iterable) -> None:
    """The runtime's arguments on a LightningCLI parser of Lightning package `pl`: `checkpoint` and `logger` as their
    classes' groups, the settings `concerns` declare in one group of their own (GROUP) that says what SageMaker fills
    in."""
    parser.add_lightning_class_args(lightning_package.attribute(pl, "callbacks.ModelCheckpoint"), "checkpoint")
    # TensorBoard, the trainer's logger unless trainer.logger names another (or false), as Lightning's default is
    # (lightning_logs/ under trainer.default_root_dir) unless logger.save_dir says where
    tensorboard = lightning_package.attribute(pl, "loggers.TensorBoardLogger")
    parser.add_class_arguments(tensorboard, "logger", instantiate=False, skip={"save_dir"})
    group = parser.add_argument_group(GROUP, FILLED_IN)
    group.add_argument("--logger.save_dir", type=str | None, default=None, help="TensorBoard's root directory")
    for setting in (setting for concern in concerns for setting in getattr(concern, "settings", ())):
        group.add_argument(f"--{setting.key}", type=setting.type, default=setting.default, help=setting.help)
    parser.add_class_arguments(FSDPSettings, "fsdp")  # trainer.strategy=fsdp's settings (parallel/fsdp_sharding.py)
