"""Which platform runs this process, and what its variables say: the hosts, this host's place among them, the
processes on each, the master, and who starts the training processes. One module per platform's variables, each a
pure function from an environment (a mapping of names to strings) to a Cluster; plan.py builds the launch plan on it.
No torch: the start-up hook runs this in every Python process of the image.

Recognised in this order (the first that matches):
  SageMaker   SM_HOSTS: a training job, whichever launcher its toolkit or SDK 3.x's driver ran (sagemaker.py)
  torchrun    TORCHELASTIC_RUN_ID: already under torchrun or hyperpodrun, on any platform (torchrun.py)
  Kubeflow    PET_NNODES: a PyTorchJob or TrainJob, run under torchrun (kubeflow.py)
  env         MASTER_ADDR, RANK and WORLD_SIZE without LOCAL_RANK: one process per pod, as a PyTorchJob without PET_*
              or any launcher that sets torch's own variables (torch_env.py)
  Slurm       SLURM_PROCID of a task srun started, or of the sbatch script's own process; not an interactive shell
              or step, nor a Jupyter kernel (slurm.py)
  none        a single process (a laptop, a notebook): the runtime's LightningCLI is Lightning's own

    PET_NNODES=2 PET_NPROC_PER_NODE=auto PET_NODE_RANK=1 PET_MASTER_ADDR=job-master-0 PET_MASTER_PORT=23456 \\
        python -c "import os; from sagemaker_lightning.launch.platforms.recognise import recognise; print(recognise(os.environ, 1))"
"""

from collections.abc import Mapping

from sagemaker_lightning.launch.platforms import kubeflow, sagemaker, slurm, torch_env, torchrun
from sagemaker_lightning.launch.platforms.cluster import Cluster


def recognise(env: Mapping[str, str], wanted: int, hostname: str = "localhost", **options) -> Cluster | None:
    """The cluster this process runs in, or None for a single process. `wanted`: the processes per host the trainer
    asks for (trainer.devices, else the GPUs, else 1); `hostname`: this host's name; `options`: the torchrun
    settings (max_restarts, timeout_s) for a platform that runs under torchrun."""
    if sagemaker.started(env):
        return sagemaker.cluster(env, wanted, **options)
    if "TORCHELASTIC_RUN_ID" in env:
        return torchrun.cluster(env, hostname)
    if "PET_NNODES" in env:
        return kubeflow.pet(env, wanted, hostname, **options)
    if all(k in env for k in ("MASTER_ADDR", "RANK", "WORLD_SIZE")) and "LOCAL_RANK" not in env:
        return torch_env.cluster(env, wanted, hostname)
    if slurm.started(env):
        return slurm.cluster(env, wanted, hostname)
    return None
