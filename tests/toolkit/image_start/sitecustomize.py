"""What the image's .pth file does at every Python start (docker/Dockerfile): the launch plan's variables as the
environment's defaults (sagemaker_lightning/boot/autoenv.py). A job given this folder on PYTHONPATH starts its processes as
the image starts them: a project that imports litdata before the runtime's LightningCLI runs reads LITDATA_CACHE_DIR
and NNODES then."""

import sagemaker_lightning.boot.autoenv  # noqa: F401
