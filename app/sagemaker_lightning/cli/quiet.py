"""Which warnings reach a job's log: the ones a user can act on. One place for the whole runtime: the runtime's
LightningCLI installs it in every training process, scripts/run_sagemaker.py before it imports the SageMaker SDK.

Left out:
  - deprecation notices raised in a library's own code (torch, Lightning, jsonargparse, the SageMaker SDK, this
    runtime: LIBRARIES), e.g. Lightning's use of torch's deprecated LeafSpec: the library's business with its
    dependencies. One raised in the project's own code (it calls a deprecated API) stays: the user can fix it.
  - SageMaker SDK v2's notice that v3 exists (SAGEMAKER_SUPPRESS_V2_WARNING, the SDK's own switch: it logs the
    notice besides warning it), where the SDK runs (sdk=True: run_sagemaker.py, which runs either SDK: --sdk). The
    trainer's process leaves the environment as it found it, as Lightning's class does.
  - Lightning's warnings that the runtime makes moot (MOOT, each with its reason).
Warnings about the configuration (Lightning's, jsonargparse's, the runtime's) stay. A -W option or PYTHONWARNINGS
is the user's own choice of filters: then nothing is installed.

    PYTHONWARNINGS=default python app/example/train.py ...     # every warning, as Python would show it
"""

import os
import sys
import warnings

LIBRARIES = (
    "torch",
    "torchvision",
    "torchmetrics",
    "lightning",
    "pytorch_lightning",
    "lightning_fabric",
    "lightning_utilities",
    "jsonargparse",
    "tensorboard",
    "numpy",
    "sagemaker",
    "sagemaker_training",
    "sagemaker_lightning",  # a library to the project: its deprecations are the runtime's to fix
)
DEPRECATIONS = (DeprecationWarning, PendingDeprecationWarning, FutureWarning)
MOOT = (
    # the runtime prints a progress line after the first step, then by time as well as by log_every_n_steps
    # (progress.LogLines), and Lightning counts its logging steps across epochs: an epoch shorter than the
    # interval still shows its progress, and TensorBoard still gets points when the run is longer than it
    r".*is smaller than the logging interval",
    # the summary's size estimate in 32 bits for a mixed precision, which the runtime may have chosen itself
    r"Precision .* is not supported by the model summary",
    # the directory a job (or a rerun with checkpoint.dirpath) resumes from is meant to hold files, and a fresh job's
    # holds the goodput ledger (goodput_file.py) before ModelCheckpoint's setup looks: every job was told so
    r"Checkpoint directory .* exists and is not empty",
)


def install(sdk: bool = False) -> None:
    """Add this module's filters in front of the process's (those installed later come before them); `sdk`: the
    process runs the SageMaker SDK."""
    if sys.warnoptions:
        return
    if sdk:
        os.environ.setdefault("SAGEMAKER_SUPPRESS_V2_WARNING", "1")
    libraries = rf"({'|'.join(LIBRARIES)})(\.|$)"
    for category in DEPRECATIONS:
        warnings.filterwarnings("ignore", category=category, module=libraries)
    for message in MOOT:
        warnings.filterwarnings("ignore", message=message)
