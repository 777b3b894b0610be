"""SageMaker's paths and files inside a training container, with their defaults: the one module that knows where
SageMaker puts things. Every function takes the environment (a mapping of variable names to strings) and reads no
file but the one it names, so PID 1, the start-up hook and the trainer ask the same questions the same way, and tests
move the whole tree with SAGEMAKER_BASE_DIR as the training toolkit does. No torch.

Before the toolkit runs (PID 1) only SAGEMAKER_BASE_DIR may be set; under it, the toolkit and SDK 3.x's driver export
the SM_* variables read here, each the path this module would derive from the base.

    SAGEMAKER_BASE_DIR=/tmp/ml python -c "import os; from sagemaker_lightning.launch import paths; print(paths.code_dir(os.environ))"
"""

import json
import os
from collections.abc import Mapping

DEFAULT_BASE = "/opt/ml"  # SageMaker's root in every training container; SAGEMAKER_BASE_DIR moves it (the toolkit's)
# the one path sagemaker-training's host-name preload library reads, whatever SAGEMAKER_BASE_DIR says
HOSTNAME_LIBRARY_READS = "/opt/ml/input/config/resourceconfig.json"
CHECKPOINT_CONFIG = "checkpointconfig.json"  # the job's CheckpointConfig, when it has one (AWS's smdebug reads it)
FLIGHT_RECORDER = "flight_recorder"  # torch's flight-recorder dumps, under the output data directory
# litdata's chunk cache (streaming.py), under the base: on the job's storage volume, the same path on every host and
# after every restart, and outside the checkpoint directory, which SageMaker would upload (a warm pool's job keeps it
# in the warm-pool cache instead: warmpool.py)
STREAMING_CACHE = "streaming-cache"
# a warm pool's instance keeps this folder from one job to the next (SageMaker mounts it there, and names it in
# SAGEMAKER_MANAGED_WARMPOOL_CACHE_DIRECTORY); under the base, as SAGEMAKER_BASE_DIR moves it in tests
WARM_POOL_CACHE = os.path.join("sagemaker", "warmpoolcache")


def base(env: Mapping[str, str]) -> str:
    return env.get("SAGEMAKER_BASE_DIR", DEFAULT_BASE)


def config_dir(env: Mapping[str, str]) -> str:
    """input/config: resourceconfig.json, hyperparameters.json, checkpointconfig.json."""
    return env.get("SM_INPUT_CONFIG_DIR") or os.path.join(base(env), "input", "config")


def resource_config(env: Mapping[str, str]) -> str:
    """The job's hosts and network interface; its presence means the container runs a SageMaker job."""
    return os.path.join(config_dir(env), "resourceconfig.json")


def hyperparameters_file(env: Mapping[str, str]) -> str:
    """What the SDK sent as hyperparameters, a JSON string per key (hyperparameters.py)."""
    return os.path.join(config_dir(env), "hyperparameters.json")


def code_dir(env: Mapping[str, str]) -> str:
    """Where the toolkit runs the job's code from."""
    return os.path.join(base(env), "code")


def output_dir(env: Mapping[str, str]) -> str:
    """Where the failure file goes (its first 1024 characters: the job's FailureReason)."""
    return env.get("SM_OUTPUT_DIR") or os.path.join(base(env), "output")


def failure_dir(env: Mapping[str, str]) -> str | None:
    """The failure file's directory as a training process sees it: the toolkit's and SDK 3.x's SM_OUTPUT_DIR; None
    off SageMaker, where a failure is a line on stderr only."""
    return env.get("SM_OUTPUT_DIR")


def default_checkpoint_dir(env: Mapping[str, str]) -> str:
    """Synced to checkpoint_s3_uri and restored on a restarted job, unless the job names another (checkpoint_dir)."""
    return os.path.join(base(env), "checkpoints")


def checkpoint_dir(env: Mapping[str, str]) -> str | None:
    """The checkpoint directory the job's CheckpointConfig names (checkpoint_local_path in the SDKs): its LocalPath
    in checkpointconfig.json, the file SageMaker writes beside hyperparameters.json; None when there is none."""
    try:
        with open(os.path.join(config_dir(env), CHECKPOINT_CONFIG)) as f:
            return json.load(f).get("LocalPath") or None
    except (OSError, ValueError, AttributeError):
        return None


def child_checkpoint_dir(checkpoint_dir: str, job_name: str | None, objective: str | None) -> str:
    """Where a job keeps its checkpoint-directory files: a tuning job's child (`objective` given) in a folder of its
    own, <checkpoint dir>/<TRAINING_JOB_NAME>, since SageMaker gives all children of a tuning job one CheckpointConfig
    and restores its whole prefix into each; a spot restart of the same child keeps its name, and resumes its own.
    Any other job (and a child without a name) uses the directory itself. A name that is not one folder's (`..`,
    `/etc`: SageMaker's own names cannot hold them, a hand-made environment or local mode can) would put the folder
    outside the directory SageMaker syncs: ValueError (this module imports nothing of the runtime's)."""
    if not (objective and job_name):
        return checkpoint_dir
    if job_name in (".", "..") or "/" in job_name or "\0" in job_name:
        raise ValueError(
            f"TRAINING_JOB_NAME={job_name!r} is not one folder's name, the folder of the checkpoint directory a tuning "
            "job's child keeps its files in: name the job with letters, digits and hyphens, as SageMaker does"
        )
    return os.path.join(checkpoint_dir, job_name)


def model_dir(env: Mapping[str, str]) -> str | None:
    """Packed into model.tar.gz."""
    return env.get("SM_MODEL_DIR")


def output_data_dir(env: Mapping[str, str]) -> str | None:
    """Packed into output.tar.gz: logs, TensorBoard, flight-recorder dumps."""
    return env.get("SM_OUTPUT_DATA_DIR")


def channels(env: Mapping[str, str]) -> dict[str, str]:
    """The job's input channels: name → directory."""
    return {name: env[f"SM_CHANNEL_{name.upper()}"] for name in json.loads(env.get("SM_CHANNELS") or "[]")}


def streaming_cache_dir(env: Mapping[str, str]) -> str:
    """Where streamed datasets keep their chunks on this host (litdata's LITDATA_CACHE_DIR)."""
    return os.path.join(base(env), STREAMING_CACHE)


def flight_recorder_dir(output_data_dir: str) -> str:
    return os.path.join(output_data_dir, FLIGHT_RECORDER)


def warm_pool_cache(env: Mapping[str, str]) -> str:
    """The folder a warm pool keeps between jobs, whether or not this job has one (warmpool.py checks)."""
    return env.get("SAGEMAKER_MANAGED_WARMPOOL_CACHE_DIRECTORY") or os.path.join(base(env), WARM_POOL_CACHE)
