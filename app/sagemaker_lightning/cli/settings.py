"""The runtime's own settings, each declared once with its type, default and help, the help built from the constant of
the module that owns its rule. The runtime's LightningCLI adds them to its parser beside Lightning's (`trainer`,
`model`, `data`, ...), with `checkpoint` (ModelCheckpoint), `logger` (TensorBoard) and `fsdp` (sharding.FSDPSettings).
Each can be given as `--key value`, in a YAML config or as a SageMaker hyperparameter.

    python app/example/train.py fit --help | grep -A2 -- --dist_timeout
"""

from dataclasses import dataclass
from typing import Any, Literal

from jsonargparse.typing import NonNegativeInt, PositiveFloat

from sagemaker_lightning.checkpoints import compile_cache
from sagemaker_lightning.checkpoints.interval import AUTO_INTERVAL_S
from sagemaker_lightning.data import decoders
from sagemaker_lightning.health import preflight, watchdog
from sagemaker_lightning.launch.plan import DEFAULT_TIMEOUT_S
from sagemaker_lightning.launch.platforms import kubeflow, sagemaker
from sagemaker_lightning.parallel.fsdp_sharding import FSDPSettings
from sagemaker_lightning.toolbox import lightning_package
from sagemaker_lightning.tracking import tracker, uri


@dataclass(frozen=True)
class Setting:
    key: str
    type: Any
    default: Any
    help: str


SETTINGS = (
    Setting("model_dir", str | None, None, "where rank 0 writes model.pt and config.yaml after fit"),
    Setting(
        "last_checkpoint_every_n_steps",
        int | None,
        None,
        "last.ckpt every N optimizer steps (after the validation that follows, if one does), besides each epoch's "
        "end and SIGTERM (0: not by steps; null: not by steps "
        f"where SIGTERM reaches the trainer, else about every {AUTO_INTERVAL_S} s of training)",
    ),
    Setting("dist_timeout", int, DEFAULT_TIMEOUT_S, "seconds a rank waits for the others"),
    Setting(
        "training_timeout",
        PositiveFloat | None,
        None,
        f"seconds a collective may take once training runs (null: {watchdog.TIMES_MEDIAN}x the median step, at least "
        f"{watchdog.FLOOR_S:g} s)",
    ),
    Setting(
        "preflight",
        Literal["warn", "fail", "off"],
        "warn",
        "checks before the first step (preflight.py): device and EFA problems fail; a busbw below the floor warns "
        "(warn) or fails (fail); off: none",
    ),
    Setting(
        "preflight_min_busbw",
        float | None,
        None,
        f"all-reduce busbw floor in GB/s; null: {preflight.FLOOR_FRACTION * 100:.0f} percent of the published figure for the "
        "instance type and host count, where there is one (instances.py)",
    ),
    Setting("scale_lr_by_world_size", bool, False, "optimizer lr × number of processes"),
    # experiment tracking in MLflow (tracking/): one run per job, continued across restarts
    Setting(
        "mlflow.tracking_uri",
        str | None,
        None,
        "an http(s) URL or a SageMaker MLflow tracking server's or app's ARN; null: on SageMaker MLFLOW_TRACKING_URI, "
        "else no tracking",
    ),
    Setting(
        "mlflow.experiment_name",
        str | None,
        None,
        "null: MLFLOW_EXPERIMENT_NAME, else the job's name less its timestamp, else " + uri.DEFAULT_EXPERIMENT,
    ),
    Setting("mlflow.log_model", bool, False, "model.pt and config.yaml as the run's artifacts after fit"),
    Setting(
        "mlflow.system_metrics",
        bool,
        False,
        f"each host's CPU, memory and GPU utilisation in the run, every {tracker.SYSTEM_EVERY_S:g} s",
    ),
    # compiled once per job, not once per restart (checkpoints/compile_cache.py)
    Setting(
        "compile_cache",
        bool,
        False,
        f"torch.compile's cache saved with the checkpoints ({compile_cache.FILE}) and loaded when the job resumes: "
        "it holds code torch runs, so turn it on only where no one else can write the checkpoint location",
    ),
    # data streamed with litdata (data/decoders.py)
    Setting(
        decoders.SETTING,
        list[str],
        [],
        "litdata decoders a streamed dataset may use beyond numbers, arrays, text and images "
        f"({', '.join(sorted(decoders.ADMITTED))}), e.g. [pickle]: each can run code that whoever can write the data's "
        "prefix or channel chose, so name one only where no one else can write it",
    ),
    # platforms beyond SageMaker's training jobs (docs/platforms.md)
    Setting(
        "max_restarts",
        NonNegativeInt | None,
        None,
        "where the runtime starts torchrun (LAUNCHER=torchrun, a PyTorchJob or TrainJob): times every rank restarts "
        "from last.ckpt when one fails (null: the job's PET_MAX_RESTARTS, else 0)",
    ),
    Setting(
        "stop_grace_s",
        PositiveFloat | None,
        None,
        f"seconds from a stop's SIGTERM to SIGKILL (null: {sagemaker.GRACE_S} on SageMaker, "
        f"{kubeflow.TERMINATION_GRACE_S} elsewhere: Kubernetes' terminationGracePeriodSeconds); a first save of "
        "last.ckpt that would not fit is said",
    ),
)


GROUP = "sagemaker-lightning (the runtime's settings)"
FILLED_IN = (  # the help's words on what a SageMaker job gives the runtime, before the user's own settings
    "On SageMaker the job fills in checkpoint.dirpath (the checkpoint directory SageMaker syncs: /opt/ml/checkpoints), "
    "model_dir (SM_MODEL_DIR, packed into model.tar.gz), trainer.default_root_dir and logger.save_dir (under "
    "SM_OUTPUT_DATA_DIR) and the data module's data_dir (the training channel; LightningCLI(data_channels=...) names "
    "another argument); settings given here win. Off SageMaker nothing is filled in: resuming and last.ckpt start "
    "with checkpoint.dirpath, the export with model_dir (README: Off SageMaker)."
)


def add_to(parser, pl) -> None:
    """The runtime's arguments on a LightningCLI parser of Lightning package `pl`: `checkpoint` and `logger` as their
    classes' groups, the others in one group of their own (GROUP) that says what SageMaker fills in."""
    parser.add_lightning_class_args(lightning_package.attribute(pl, "callbacks.ModelCheckpoint"), "checkpoint")
    # TensorBoard, the trainer's logger unless trainer.logger names another (or false), as Lightning's default is
    # (lightning_logs/ under trainer.default_root_dir) unless logger.save_dir says where
    tensorboard = lightning_package.attribute(pl, "loggers.TensorBoardLogger")
    parser.add_class_arguments(tensorboard, "logger", instantiate=False, skip={"save_dir"})
    group = parser.add_argument_group(GROUP, FILLED_IN)
    group.add_argument("--logger.save_dir", type=str | None, default=None, help="TensorBoard's root directory")
    for setting in SETTINGS:
        group.add_argument(f"--{setting.key}", type=setting.type, default=setting.default, help=setting.help)
    parser.add_class_arguments(FSDPSettings, "fsdp")  # trainer.strategy=fsdp's settings (parallel/fsdp_sharding.py)
