"""The training toolkit's framework module in this image (SAGEMAKER_TRAINING_MODULE, docker/Dockerfile): the PyTorch
toolkit's own (sagemaker_pytorch_container.training: its runners, torch_distributed and SMDataParallel among them, as
in AWS's images), less its one import of torch. That import only puts torch's version in SM_DLC_TORCH_VERSION (which
the MPI runner reads for model-parallel jobs, and the job's script inherits), and it held the toolkit's process
1.9-2.4 s before the job's script started, on 2 AMD EPYC cores (docs/performance.md). The version is read from
torch's version.py, torch.__version__'s own source, without importing torch. No torch.

    SAGEMAKER_TRAINING_MODULE=sagemaker_lightning.boot.toolkit:main train      # what the image's `train` runs
"""

import importlib.metadata
import importlib.util
import os
import re


def torch_version() -> str | None:
    """torch.__version__ (with its local part, e.g. 2.14.1+cu130), read from torch/version.py; its package's version
    where that file says nothing; None without torch."""
    spec = importlib.util.find_spec("torch")  # finds the package, runs none of it
    if spec is None:
        return None
    try:
        with open(os.path.join(spec.submodule_search_locations[0], "version.py")) as f:
            return re.search(r"^__version__(?:: str)? = ['\"]([^'\"]+)['\"]", f.read(), re.M)[1]
    except (OSError, TypeError, IndexError):
        return importlib.metadata.version("torch")


def set_torch_version() -> None:
    if version := torch_version():
        os.environ["SM_DLC_TORCH_VERSION"] = version


def main() -> None:
    from sagemaker_pytorch_container import training

    training._set_torch_version_environment = set_torch_version
    training.main()
