"""Start a training job on the image with the SageMaker Python SDK: local mode (docker compose) or the cloud.

SDK 2.x runs it as an Estimator (in .venv), SDK 3.x as a ModelTrainer (in .venv-sdk3); --sdk defaults to the
installed one. Hyperparameters follow the options as key=value words; they reach app/train.py as `--key value`.

    python scripts/run_sagemaker.py --image sagemaker-lightning:latest --instance-type local --instance-count 2 \
        --input data/synthetic --output runs trainer.max_epochs=1 trainer.accelerator=cpu
    .venv-sdk3/bin/python scripts/run_sagemaker.py --sdk v3 --distribution torch_distributed ...
"""

import argparse
import importlib.metadata
import json
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
# Local mode needs no AWS account: a region, a dummy role, and no telemetry calls (they fail offline)
os.environ.setdefault("AWS_DEFAULT_REGION", "us-east-1")
os.environ.setdefault("SAGEMAKER_USER_CONFIG_OVERRIDE", os.path.join(HERE, "sagemaker_config.yaml"))
LOCAL_ROLE = "arn:aws:iam::111111111111:role/service-role/LocalModeRole"
CHECKPOINTS = "/opt/ml/checkpoints"  # SageMaker syncs it with checkpoint_s3_uri; app/sagemaker_env.py trains into it
LOCAL_CHECKPOINTS = "/opt/ml/input/data/checkpoints"  # local mode has no checkpoint sync: a mounted channel instead
# SageMaker's framework hyperparameters per distribution, as SDK 2.x's PyTorch estimator sets them; the toolkit
# in the image reads them and picks its runner (tests/unit/test_run_sagemaker.py compares with the SDK's own)
# (sagemaker_instance_type: None is filled in with the job's instance type)
DISTRIBUTIONS = {
    "none": {},
    "torch_distributed": {"sagemaker_torch_distributed_enabled": True, "sagemaker_instance_type": None},  # torchrun
    "pytorchddp": {"sagemaker_pytorch_ddp_enabled": True, "sagemaker_instance_type": None},  # mpirun, native DDP
    "smdistributed": {"sagemaker_distributed_dataparallel_enabled": True, "sagemaker_instance_type": None,  # mpirun + SMDDP
                      "sagemaker_distributed_dataparallel_custom_mpi_options": ""},  # fmt: skip
    "mpi": {"sagemaker_mpi_enabled": True, "sagemaker_mpi_custom_mpi_options": ""},  # mpirun
}


def uri(path: str) -> str:
    """s3:// and file:// as given; a plain path becomes an absolute file:// URI."""
    return path if path.startswith(("s3://", "file://")) else "file://" + os.path.abspath(path)


def hyperparameters(words: list[str]) -> dict[str, str]:
    pairs = {}
    for word in words:
        key, sep, value = word.partition("=")
        if not sep or not key:
            raise SystemExit(f"error: hyperparameter {word!r} is not key=value, e.g. trainer.max_epochs=5")
        pairs[key] = value
    return pairs


def framework_hyperparameters(distribution: str, instance_type: str, processes_per_host: int | None) -> dict[str, str]:
    """The distribution as framework hyperparameters, JSON-encoded as the SDK encodes them."""
    params = {k: instance_type if v is None else v for k, v in DISTRIBUTIONS[distribution].items()}
    if processes_per_host:  # every runner of the toolkit reads its process count from this one
        params["sagemaker_mpi_num_of_processes_per_host"] = processes_per_host
    return {k: json.dumps(v) for k, v in params.items()}


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--image", required=True, help="image URI: a local tag for local mode, an ECR URI for the cloud")
    p.add_argument("--instance-type", default="local", help="local, local_gpu, or an ml.* type")
    p.add_argument("--instance-count", type=int, default=1, help="hosts (containers in local mode)")
    p.add_argument("--input", required=True, help="training data: a directory, file://... or s3://...")
    p.add_argument("--channel", default="training", help="input channel name (the trainer reads DATA_CHANNEL)")
    p.add_argument("--output", required=True, help="where each job's folder goes: a directory, file://... or s3://...")
    p.add_argument("--role", default=None, help="SageMaker execution role ARN (needed in the cloud)")
    p.add_argument("--job-name", default="lightning", help="job name prefix; a timestamp is appended")
    p.add_argument("--sdk", choices=["v2", "v3"], default=None, help="SageMaker SDK API (default: the installed major version)")
    p.add_argument("--distribution", choices=list(DISTRIBUTIONS), default="none", help="how SageMaker starts the processes")
    p.add_argument("--processes-per-host", type=int, default=None, help="for the distributions (default: one per GPU, or 1)")
    p.add_argument("--checkpoints", default=None,
                   help="where last.ckpt lives across restarts: s3://... (checkpoint_s3_uri), or a directory in local mode")  # fmt: skip
    p.add_argument("--launcher", choices=["lightning", "torchrun"], default="lightning",
                   help="without a distribution: Lightning starts the per-device processes, or torchrun (c10d) does")  # fmt: skip
    p.add_argument("hyperparameters", nargs="*", metavar="key=value", help="trainer arguments, e.g. trainer.max_epochs=5")
    return p.parse_args(argv)


def checkpoint_s3_uri(checkpoints: str | None) -> str | None:
    """Always with a trailing slash: without one, SageMaker's sync also matches sibling prefixes (run-1, run-10)."""
    return checkpoints.rstrip("/") + "/" if checkpoints else None


def channels(args) -> dict[str, str]:
    inputs = {args.channel: uri(args.input)}
    if args.checkpoints and args.instance_type.startswith("local"):
        inputs["checkpoints"] = uri(args.checkpoints)
        os.makedirs(inputs["checkpoints"][len("file://"):], exist_ok=True)
    return inputs


def run_v2(args, job_name: str, output: str, hps: dict, env: dict) -> str:
    """SDK 2.x: Estimator(image_uri=...), LocalSession for local instance types. Returns the model.tar.gz URI."""
    from sagemaker.estimator import Estimator  # slow imports: after the argument checks
    from sagemaker.local import LocalSession
    from sagemaker.session import Session

    local = args.instance_type.startswith("local")
    if local and output.startswith("file://"):
        output = f"{output}/{job_name}"  # local mode writes straight into the path; SageMaker adds the job folder
    session = LocalSession() if local else Session()
    if local:
        session.config = {"local": {"local_code": True}}
    cloud_checkpoints = {} if local else {"checkpoint_s3_uri": checkpoint_s3_uri(args.checkpoints), "checkpoint_local_path": CHECKPOINTS}
    estimator = Estimator(image_uri=args.image, role=args.role or LOCAL_ROLE, instance_count=args.instance_count,
                          instance_type=args.instance_type, output_path=output, hyperparameters=hps,
                          environment=env, sagemaker_session=session, **cloud_checkpoints)  # fmt: skip
    estimator.fit(channels(args), job_name=job_name)
    return estimator.model_data


def run_v3(args, job_name: str, output: str, hps: dict, env: dict) -> str:
    """SDK 3.x: ModelTrainer(training_image=...), Mode.LOCAL_CONTAINER for local instance types."""
    from sagemaker.train import ModelTrainer
    from sagemaker.train.configs import CheckpointConfig, Compute, InputData, OutputDataConfig
    from sagemaker.train.model_trainer import Mode

    local = args.instance_type.startswith("local")
    kwargs = {}
    if local:
        if not output.startswith("file://"):
            raise SystemExit("error: SDK 3.x local mode writes its artifacts to a local --output directory")
        kwargs["local_container_root"] = root = os.path.join(output[len("file://"):], job_name)
        os.makedirs(root, exist_ok=True)
    else:
        kwargs["output_data_config"] = OutputDataConfig(s3_output_path=output)
        if args.checkpoints:
            kwargs["checkpoint_config"] = CheckpointConfig(s3_uri=checkpoint_s3_uri(args.checkpoints), local_path=CHECKPOINTS)
    trainer = ModelTrainer(training_image=args.image, role=args.role or LOCAL_ROLE, base_job_name=job_name,
                           training_mode=Mode.LOCAL_CONTAINER if local else Mode.SAGEMAKER_TRAINING_JOB,
                           compute=Compute(instance_type="local_cpu" if args.instance_type == "local" else args.instance_type,
                                           instance_count=args.instance_count),
                           hyperparameters=hps, environment=env, **kwargs)  # fmt: skip
    inputs = [InputData(channel_name=name, data_source=source if source.startswith("s3://") else source[len("file://"):])
              for name, source in channels(args).items()]  # fmt: skip
    trainer.train(input_data_config=inputs)
    if local:
        return f"file://{root}/compressed_artifacts/model.tar.gz"  # where SDK 3.x local mode packs it
    return trainer._latest_training_job.model_artifacts.s3_model_artifacts


def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    hps = hyperparameters(args.hyperparameters)
    installed = f"v{importlib.metadata.version('sagemaker').split('.')[0]}"
    sdk = args.sdk or installed
    if sdk != installed:
        venv = ".venv-sdk3" if sdk == "v3" else ".venv"
        raise SystemExit(f"error: --sdk {sdk} needs SageMaker SDK {sdk[1]}.x, but {installed[1]}.x is installed here; "
                         f"run {venv}/bin/python {sys.argv[0]} (make install makes it)")  # fmt: skip
    if not args.instance_type.startswith("local") and not args.role:
        raise SystemExit("error: a cloud job needs --role, the ARN of a SageMaker execution role")
    if args.checkpoints and args.instance_type.startswith("local"):
        if args.checkpoints.startswith("s3://"):
            raise SystemExit("error: local mode keeps --checkpoints in a local directory, not s3://")
        hps.setdefault("checkpoint.dirpath", LOCAL_CHECKPOINTS)
    hps.update(framework_hyperparameters(args.distribution, args.instance_type, args.processes_per_host))
    env = {"DATA_CHANNEL": args.channel, **({"LAUNCHER": "torchrun"} if args.launcher == "torchrun" else {})}
    job_name = f"{args.job_name}-{time.strftime('%Y%m%d-%H%M%S')}"
    model = (run_v2 if sdk == "v2" else run_v3)(args, job_name, uri(args.output).rstrip("/"), hps, env)
    print(f"model.tar.gz: {model[len('file://'):] if model.startswith('file://') else model}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
