"""The job scripts/run_sagemaker.py starts, resolved from its options (options.py) into one frozen Job, with
SageMaker's rules and either SDK's checked here, before any SDK import: a bad option fails in one line, without the
seconds the SDK takes to import. The SDK adapters (sdk2.py, sdk3.py) read the Job and nothing else.

    from jobs import options, spec  # from scripts/ (python scripts/run_sagemaker.py puts it first on sys.path)

    job = spec.make_job(options.parse_args(["--image", "i", "--input", "data", "--output", "runs"]), installed="v2")
    job.name, job.inputs, job.role  # 'lightning-20250101-120000', {'training': 'file:///.../data'}, LOCAL_ROLE
"""

import argparse
import dataclasses
import importlib.metadata
import json
import os
import re
import sys
import time

from jobs import metric_regex
from sagemaker_lightning import lines
from sagemaker_lightning.failure import UserError
from sagemaker_lightning.launch import paths
from sagemaker_lightning.lines import METRICS  # the runtime's lines, read into CloudWatch metrics
from sagemaker_lightning.tracking.uri import check_uri

LOCAL_ROLE = "arn:aws:iam::111111111111:role/service-role/LocalModeRole"  # local mode needs a role ARN, checks none
# the container's checkpoint directory: SageMaker syncs it with checkpoint_s3_uri; the runtime's plan makes it the
# trainer's checkpoint.dirpath
CHECKPOINTS = paths.default_checkpoint_dir({})
LOCAL_CHECKPOINTS = "/opt/ml/input/data/checkpoints"  # local mode has no checkpoint sync: a mounted channel instead
# SageMaker's input modes for S3 channels: File copies a channel whole to the volume before the job starts, FastFile
# mounts it and reads objects as they are opened (docs/streaming.md); local mode has File only
INPUT_MODES = ("File", "FastFile")
LOCAL_FASTFILE = "local mode copies the channels whole (File): FastFile runs in the cloud only"
MAX_METRICS, MAX_REGEX = 40, 500  # MetricDefinitions: 40 at most, each Regex 500 characters (the API's shapes)
KEEP_ALIVE_MAX_S = 3600  # SageMaker's longest KeepAlivePeriodInSeconds for one job (its warm pools' documentation)
# SageMaker's framework hyperparameters per distribution, as SDK 2.x's PyTorch estimator sets them; the toolkit
# in the image reads them and picks its runner (tests/unit/scripts/test_run_sagemaker.py compares with the SDK's own)
# (sagemaker_instance_type: None is filled in with the job's instance type)
DISTRIBUTIONS = {
    "none": {},
    "torch_distributed": {"sagemaker_torch_distributed_enabled": True, "sagemaker_instance_type": None},  # torchrun
    "pytorchddp": {"sagemaker_pytorch_ddp_enabled": True, "sagemaker_instance_type": None},  # mpirun, native DDP
    "smdistributed": {
        "sagemaker_distributed_dataparallel_enabled": True,
        "sagemaker_instance_type": None,  # mpirun + SMDDP
        "sagemaker_distributed_dataparallel_custom_mpi_options": "",
    },
    "mpi": {"sagemaker_mpi_enabled": True, "sagemaker_mpi_custom_mpi_options": ""},  # mpirun
}


@dataclasses.dataclass(frozen=True)
class Job:
    """One training job, resolved: all that either SDK's adapter sends, nothing left to check."""

    sdk: str  # "v2": SDK 2.x's Estimator (sdk2.py); "v3": SDK 3.x's ModelTrainer (sdk3.py)
    name: str  # --job-name and a timestamp
    image: str
    role: str  # the execution role: LOCAL_ROLE in local mode unless one is given
    instance_type: str  # local, local_gpu, or ml.*
    instance_count: int
    output: str  # URI, without a trailing slash
    inputs: dict[str, str]  # channel: URI
    input_mode: str  # of the data channel: a key of INPUT_MODES, as asked (local mode sends File: channel_input_mode)
    hyperparameters: dict[str, str]  # the key=value words, then the framework ones (JSON-encoded)
    environment: dict[str, str]
    source_dir: str | None  # the user's code (absolute), else the image's example
    entry_point: str  # with source_dir: its script that trains
    distribution: str  # a key of DISTRIBUTIONS
    processes_per_host: int | None
    checkpoints: str | None  # checkpoint_s3_uri in the cloud, ending in "/"
    spot: bool
    max_run: int  # seconds
    max_wait: int | None  # with spot
    max_retry_attempts: int | None
    keep_alive: int | None  # seconds the instances stay in a warm pool after the job (KeepAlivePeriodInSeconds)
    network_isolation: bool
    subnets: list[str] | None  # VPC
    security_groups: list[str] | None
    tags: dict[str, str]
    metrics: dict[str, str]  # CloudWatch's metric definitions: name → regex (the runtime's lines.METRICS and --metric)
    dry_run: bool  # print the CreateTrainingJob request and send nothing (dry_run.py)
    wait: bool  # wait for the job and stream its logs: never in a dry run, which starts no job to wait for

    @property
    def local(self) -> bool:
        return self.instance_type.startswith("local")

    @property
    def channel_input_mode(self) -> str:
        """What the job's channels get: local mode has no FastFile (LOCAL_FASTFILE)."""
        return "File" if self.local else self.input_mode


def uri(path: str) -> str:
    """s3:// and file:// as given; a plain path becomes an absolute file:// URI."""
    return path if path.startswith(("s3://", "file://")) else "file://" + os.path.abspath(path)


def key_values(words: list[str], example: str) -> dict[str, str]:
    pairs = {}
    for word in words:
        key, sep, value = word.partition("=")
        if not sep or not key:
            raise SystemExit(f"error: {word!r} is not key=value, e.g. {example}")
        pairs[key] = value
    return pairs


def framework_hyperparameters(distribution: str, instance_type: str, processes_per_host: int | None) -> dict[str, str]:
    """The distribution as framework hyperparameters, JSON-encoded as the SDK encodes them."""
    params = {k: instance_type if v is None else v for k, v in DISTRIBUTIONS[distribution].items()}
    if processes_per_host:  # every runner of the toolkit reads its process count from this one
        params["sagemaker_mpi_num_of_processes_per_host"] = processes_per_host
    return {k: json.dumps(v) for k, v in params.items()}


def installed_sdk() -> str:
    """The SageMaker SDK installed here, "v2" or "v3": its package's metadata, without importing it."""
    return f"v{importlib.metadata.version('sagemaker').split('.')[0]}"


def make_job(args: argparse.Namespace, installed: str | None = None) -> Job:
    """The job the options describe, with SageMaker's and the SDK's rules checked before anything is imported or sent:
    a broken rule is a SystemExit with one line. No side effects; it reads the clock (the name), the working directory
    (relative paths) and --source-dir. `installed`: the SDK installed here (default: installed_sdk())."""
    installed = installed or installed_sdk()
    sdk = args.sdk or installed
    if sdk != installed:
        venv = ".venv-sdk3" if sdk == "v3" else ".venv"
        raise SystemExit(
            f"error: --sdk {sdk} needs SageMaker SDK {sdk[1]}.x, but {installed[1]}.x is installed here; "
            f"run {venv}/bin/python {sys.argv[0]} (make install makes it)"
        )
    local = args.instance_type.startswith("local")
    name = f"{args.job_name}-{time.strftime('%Y%m%d-%H%M%S')}"
    output = uri(args.output).rstrip("/")
    hps = key_values(args.hyperparameters, "trainer.max_epochs=5")
    inputs = {args.channel: uri(args.input)}
    if local:
        if args.dry_run or args.spot:
            raise SystemExit("error: --dry-run and --spot are for cloud jobs (an ml.* --instance-type)")
        checkpoints = None
        if args.checkpoints:  # a host directory mounted as a channel, where the trainer keeps last.ckpt
            if args.checkpoints.startswith("s3://"):
                raise SystemExit("error: local mode keeps --checkpoints in a local directory, not s3://")
            inputs["checkpoints"] = uri(args.checkpoints)
            hps.setdefault("checkpoint.dirpath", LOCAL_CHECKPOINTS)
    else:
        if not args.role:
            raise SystemExit("error: a cloud job needs --role, the ARN of a SageMaker execution role")
        if not output.startswith("s3://") or not inputs[args.channel].startswith("s3://"):
            raise SystemExit("error: a cloud job reads --input from and writes --output to s3:// URIs")
        # always a trailing slash: without one, SageMaker's sync also matches sibling prefixes (run-1, run-10)
        checkpoints = (args.checkpoints or f"{output}/{name}/checkpoints").rstrip("/") + "/"
    max_wait = None
    if args.spot:
        max_wait = args.max_wait or 2 * args.max_run
        if max_wait < args.max_run:
            raise SystemExit(
                f"error: --max-wait {max_wait} is below --max-run {args.max_run}; spot jobs need max_wait ≥ max_run"
            )
    if args.keep_alive is not None:
        if local or args.spot:
            raise SystemExit(
                "error: --keep-alive is for cloud jobs on demand: local mode keeps no instance, and SageMaker keeps no "
                "warm pool of spot instances"
            )
        if not 0 <= args.keep_alive <= KEEP_ALIVE_MAX_S:
            raise SystemExit(
                f"error: --keep-alive {args.keep_alive} is outside SageMaker's range: give 0 to {KEEP_ALIVE_MAX_S} "
                "seconds (0: no warm pool)"
            )
    if args.tensorboard:
        hps.setdefault("logger.save_dir", args.tensorboard)
    source_dir = None
    if args.source_dir:
        source_dir = os.path.abspath(args.source_dir)
        if not os.path.isfile(os.path.join(source_dir, args.entry_point)):
            raise SystemExit(f"error: --entry-point {args.entry_point} is not a file of --source-dir {args.source_dir}")
    hps.update(framework_hyperparameters(args.distribution, args.instance_type, args.processes_per_host))
    env = {"DATA_CHANNEL": args.channel, **({"LAUNCHER": "torchrun"} if args.launcher == "torchrun" else {})}
    env.update(key_values(args.env, "NCCL_DEBUG=INFO"))
    if args.mlflow:
        try:
            env["MLFLOW_TRACKING_URI"] = check_uri(args.mlflow)
        except UserError as e:
            raise SystemExit(f"error: --mlflow: {e}") from None
        if args.network_isolation:
            raise SystemExit("error: --mlflow needs the network, which --network-isolation takes from the job")
    tags = key_values(args.tag, "project=cifar10")
    metrics = dict(METRICS)
    for given in args.metric:
        try:
            metric, regex = given.split("=", 1) if "=" in given else lines.metric(given)
            re.compile(regex)
        except (ValueError, re.error) as e:
            raise SystemExit(f"error: --metric {given}: {e}") from None
        if problem := metric_regex.problem(regex):
            raise SystemExit(f"error: --metric {given}: {problem}")
        if len(regex) > MAX_REGEX:
            raise SystemExit(
                f"error: --metric {given}: its regex has {len(regex)} characters; SageMaker takes {MAX_REGEX}"
            )
        metrics[metric] = regex
    if len(metrics) > MAX_METRICS:
        raise SystemExit(f"error: {len(metrics)} metric definitions with the runtime's; SageMaker takes {MAX_METRICS}")
    if sdk == "v3" and local and not output.startswith("file://"):
        raise SystemExit("error: SDK 3.x local mode writes its artifacts to a local --output directory")
    if sdk == "v3" and source_dir and args.distribution not in ("none", "torch_distributed"):
        raise SystemExit(
            f"error: SDK 3.x runs --source-dir code with --distribution none or torch_distributed, not {args.distribution}"
        )
    retries = args.max_retry_attempts if args.max_retry_attempts is not None else (3 if args.spot else None)
    return Job(
        sdk=sdk,
        name=name,
        image=args.image,
        role=args.role or LOCAL_ROLE,
        instance_type=args.instance_type,
        instance_count=args.instance_count,
        output=output,
        inputs=inputs,
        input_mode=args.input_mode,
        hyperparameters=hps,
        environment=env,
        source_dir=source_dir,
        entry_point=args.entry_point,
        distribution=args.distribution,
        processes_per_host=args.processes_per_host,
        checkpoints=checkpoints,
        spot=args.spot,
        max_run=args.max_run,
        max_wait=max_wait,
        max_retry_attempts=retries,
        keep_alive=args.keep_alive,
        network_isolation=args.network_isolation,
        subnets=args.subnets.split(",") if args.subnets else None,
        security_groups=args.security_groups.split(",") if args.security_groups else None,
        tags=tags,
        metrics=metrics,
        dry_run=args.dry_run,
        wait=args.wait and not args.dry_run,
    )
