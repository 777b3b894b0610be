"""What the image's .pth file does at every Python start (docker/Dockerfile): the launch plan's variables as the
environment's defaults (sagemaker_lightning/boot/autoenv.py). Every job of the toolkit tier has this folder on
PYTHONPATH (conftest.run_job), so its processes start as the image starts them: a project that imports litdata before
the runtime's LightningCLI runs reads LITDATA_CACHE_DIR and NNODES then, and each host's torch has its share of the
cores, as in local mode (the toolkit's instance type is "local")."""

import sagemaker_lightning.boot.autoenv  # noqa: F401
