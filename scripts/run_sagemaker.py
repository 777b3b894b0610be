"""Start a training job on the image with the SageMaker Python SDK: local mode (docker compose) or the cloud.

SDK 2.x runs it as an Estimator (in .venv), SDK 3.x as a ModelTrainer (in .venv-sdk3); --sdk defaults to the
installed one. Hyperparameters follow the options as key=value words; they reach the training script as `--key value`.

    python scripts/run_sagemaker.py --image sagemaker-lightning:latest --instance-type local --instance-count 2 \
        --input data/synthetic --output runs trainer.max_epochs=1 trainer.accelerator=cpu
    python scripts/run_sagemaker.py --image 123456789012.dkr.ecr.us-east-1.amazonaws.com/sagemaker-lightning:latest \
        --instance-type ml.g5.xlarge --instance-count 2 --role arn:aws:iam::123456789012:role/SageMakerRole \
        --input s3://bucket/cifar10 --output s3://bucket/jobs --spot --tensorboard s3://bucket/tensorboard --dry-run
"""

import argparse
import contextlib
import dataclasses
import importlib.metadata
import json
import logging
import os
import re
import sys
import tempfile
import time

from sagemaker_lightning import quiet
from sagemaker_lightning.hyperparameters import typed

HERE = os.path.dirname(os.path.abspath(__file__))
# Local mode needs no AWS account: a region, a dummy role, and no telemetry calls (they fail offline)
os.environ.setdefault("AWS_DEFAULT_REGION", "us-east-1")
os.environ.setdefault("SAGEMAKER_USER_CONFIG_OVERRIDE", os.path.join(HERE, "sagemaker_config.yaml"))
logging.getLogger("sagemaker.config").setLevel(logging.WARNING)  # its INFO lines go to stdout, --dry-run's JSON too
quiet.install()  # the SDK's own deprecation notices (SDK 2.x: that 3.x exists; --sdk runs either)
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
    "smdistributed": {
        "sagemaker_distributed_dataparallel_enabled": True,
        "sagemaker_instance_type": None,  # mpirun + SMDDP
        "sagemaker_distributed_dataparallel_custom_mpi_options": "",
    },
    "mpi": {"sagemaker_mpi_enabled": True, "sagemaker_mpi_custom_mpi_options": ""},  # mpirun
}
# What the trainer prints (the runtime's LogLines and RankReport, app/sagemaker_lightning/callbacks.py), read by SageMaker
# into CloudWatch metrics and for automatic model tuning; tests/toolkit and tests/unit/test_callbacks.py check them
# against the lines of real runs
METRICS = {
    "train:loss": r"train/loss=([0-9.]+)",
    "train:images_per_second": r"images/s=([0-9.]+)",
    "validation:loss": r"val/loss=([0-9.]+)",
    "validation:accuracy": r"val/acc=([0-9.]+)",
    "hosts:slowest_ratio": r"hosts: slowest \S+ ([0-9.]+)x",  # the slowest host's own time per step / the median's
}


class ValidationWatch:
    """Standard output that also keeps each epoch's validation accuracy from the job's log as it passes, read from the
    trainer's `epoch E step S: ... val/acc=A` lines (the runtime's RankReport) with the metric definition's regex,
    as SageMaker reads it into CloudWatch. Both SDKs write a job's log through sys.stdout, in local mode and in the
    cloud."""

    LINE = re.compile(r"epoch (\d+) step \d+: .*?" + METRICS["validation:accuracy"])

    def __init__(self, stream):
        self.stream, self.accuracy, self._partial = stream, {}, ""

    def write(self, text: str) -> int:
        *lines, self._partial = (self._partial + text).split("\n")
        for line in lines:
            if match := self.LINE.search(line):
                self.accuracy[int(match.group(1))] = float(match.group(2))
        return self.stream.write(text)

    def __getattr__(self, name):  # flush, isatty, encoding, ...: the stream's own
        return getattr(self.stream, name)

    def summary(self) -> str:
        last, best = max(self.accuracy), max(self.accuracy, key=self.accuracy.get)
        return (
            f"final validation accuracy: {self.accuracy[last]:.4f} (epoch {last}; "
            f"best {self.accuracy[best]:.4f} at epoch {best})"
        )


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


def estimator_hyperparameters(hyperparameters: dict[str, str], source_dir: str | None) -> dict:
    """What SDK 2.x's Estimator is given so that it sends `hyperparameters`: with a source_dir it JSON-encodes every
    value itself, so the framework ones (encoded already) go in decoded; an empty custom_mpi_options encoded twice
    reached mpirun as the argument '""', which it took for the program."""
    if not source_dir:
        return hyperparameters
    return {k: json.loads(v) if k.startswith("sagemaker_") else v for k, v in hyperparameters.items()}


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n")[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter
    )
    p.add_argument("--image", required=True, help="image URI: a local tag for local mode, an ECR URI for the cloud")
    p.add_argument("--instance-type", default="local", help="local, local_gpu, or an ml.* type")
    p.add_argument("--instance-count", type=int, default=1, help="hosts (containers in local mode)")
    p.add_argument("--input", required=True, help="training data: a directory, file://... or s3://...")
    p.add_argument("--channel", default="training", help="input channel name (the trainer reads DATA_CHANNEL)")
    p.add_argument("--output", required=True, help="where each job's folder goes: a directory, file://... or s3://...")
    p.add_argument("--role", default=None, help="SageMaker execution role ARN (needed in the cloud)")
    p.add_argument("--job-name", default="lightning", help="job name prefix; a timestamp is appended")
    p.add_argument(
        "--source-dir",
        default=None,
        help="your project's directory, shipped with the job (default: the image's example)",
    )
    p.add_argument("--entry-point", default="train.py", help="with --source-dir: the script in it that trains")
    p.add_argument(
        "--sdk", choices=["v2", "v3"], default=None, help="SageMaker SDK API (default: the installed major version)"
    )
    p.add_argument(
        "--distribution", choices=list(DISTRIBUTIONS), default="none", help="how SageMaker starts the processes"
    )
    p.add_argument(
        "--processes-per-host", type=int, default=None, help="for the distributions (default: one per GPU, or 1)"
    )
    p.add_argument(
        "--launcher",
        choices=["lightning", "torchrun"],
        default="lightning",
        help="without a distribution: Lightning starts the per-device processes, or torchrun (c10d) does",
    )
    p.add_argument(
        "--checkpoints",
        default=None,
        help="where last.ckpt lives across restarts: s3://... (checkpoint_s3_uri; "
        "default: <output>/<job>/checkpoints/), or a directory in local mode",
    )
    p.add_argument(
        "--spot", action="store_true", help="managed spot training: resumes from --checkpoints when interrupted"
    )
    p.add_argument("--max-run", type=int, default=24 * 3600, help="seconds of training before SageMaker stops the job")
    p.add_argument(
        "--max-wait",
        type=int,
        default=None,
        help="with --spot: seconds including waits for capacity (≥ --max-run; default 2 × it)",
    )
    p.add_argument(
        "--max-retry-attempts",
        type=int,
        default=None,
        help="restarts after interruptions or internal errors (--spot: default 3)",
    )
    p.add_argument(
        "--tensorboard",
        default=None,
        help="s3://... for TensorBoard logs written during training (else in output.tar.gz)",
    )
    p.add_argument(
        "--network-isolation",
        action="store_true",
        help="no network access from the containers (data through channels only)",
    )
    p.add_argument("--subnets", default=None, help="comma-separated VPC subnet IDs")
    p.add_argument(
        "--security-groups",
        default=None,
        help="comma-separated security group IDs (multi-node: one that admits itself)",
    )
    p.add_argument("--tag", action="append", default=[], metavar="KEY=VALUE", help="a tag of the job (repeatable)")
    p.add_argument(
        "--env",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="an environment variable of the job (repeatable)",
    )
    p.add_argument(
        "--wait", action=argparse.BooleanOptionalAction, default=True, help="wait for the job and stream its logs"
    )
    p.add_argument(
        "--dry-run", action="store_true", help="print the CreateTrainingJob request as JSON and send nothing (cloud)"
    )
    p.add_argument(
        "hyperparameters", nargs="*", metavar="key=value", help="trainer arguments, e.g. trainer.max_epochs=5"
    )
    return p.parse_args(argv)


@dataclasses.dataclass
class Job:
    """One training job, whichever SDK starts it."""

    name: str
    args: argparse.Namespace
    output: str  # URI
    inputs: dict[str, str]  # channel: URI
    hyperparameters: dict[str, str]
    environment: dict[str, str]
    checkpoints: str | None  # checkpoint_s3_uri in the cloud
    max_wait: int | None  # with spot
    max_retry_attempts: int | None
    tags: dict[str, str]
    subnets: list[str] | None  # VPC
    security_groups: list[str] | None
    source_dir: str | None  # the user's code, else the image's example

    @property
    def local(self) -> bool:
        return self.args.instance_type.startswith("local")

    @property
    def wait(self) -> bool:
        """Whether to wait for the job and stream its logs: a dry run starts no job to wait for."""
        return self.args.wait and not self.args.dry_run


def make_job(args: argparse.Namespace) -> Job:
    """The job the arguments describe, with SageMaker's rules checked before anything is sent."""
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
    retries = args.max_retry_attempts if args.max_retry_attempts is not None else (3 if args.spot else None)
    return Job(
        name,
        args,
        output,
        inputs,
        hps,
        env,
        checkpoints,
        max_wait,
        retries,
        key_values(args.tag, "project=cifar10"),
        args.subnets.split(",") if args.subnets else None,
        args.security_groups.split(",") if args.security_groups else None,
        source_dir,
    )


def nested(hyperparameters: dict[str, str]) -> dict:
    """Dotted settings as nested groups, the form SDK 3.x's driver accepts: it exports each top-level key as a shell
    variable, and a dot stops it ("not a valid identifier") before any code runs. A value and settings under the
    same key are a class and its arguments: data=X data.batch_size=32 → {"data": {"class_path": "X", "init_args":
    {"batch_size": 32}}}. Values are typed as the runtime types them (JSON, else a Python literal, else a string)."""
    tree: dict = {}
    for key, value in hyperparameters.items():
        *groups, last = key.replace(".init_args.", ".").split(".")  # data.init_args.x is data.x to jsonargparse
        node = tree
        for group in groups:
            node = _settings_of(node, group)
        value, current = typed(value), node.get(last)
        if isinstance(current, dict) and isinstance(value, dict):
            node[last] = {**value, **current}
        elif isinstance(current, dict):  # its settings came first: `value` is their class
            node[last] = {"class_path": value, "init_args": current.get("init_args", current)}
        else:
            node[last] = value
    return tree


def _settings_of(node: dict, key: str) -> dict:
    """The dict where settings under node[key] go: node[key] itself, or its init_args when it names a class."""
    current = node.get(key)
    if current is None or not isinstance(current, dict):
        node[key] = {} if current is None else {"class_path": current, "init_args": {}}
    return node[key].setdefault("init_args", {}) if "class_path" in node[key] else node[key]


def intercept_create_training_job(boto_session) -> None:
    """--dry-run: print the CreateTrainingJob request (as the API receives it) and answer it here, and the
    DescribeTrainingJob that SDK 3.x sends after it: nothing leaves this machine."""
    from botocore.awsrequest import AWSResponse

    def show(params, **kwargs):
        print(json.dumps(params, indent=2, sort_keys=True, default=str))

    def answer(model, params, **kwargs):
        job = {
            "TrainingJobName": "dry-run",
            "TrainingJobArn": "arn:aws:sagemaker:dry-run:000000000000:training-job/dry-run",
        }
        return AWSResponse("https://dry-run", 200, {}, None), {**job, "TrainingJobStatus": "InProgress"}

    boto_session.events.register("before-parameter-build.sagemaker.CreateTrainingJob", show)
    for operation in ("CreateTrainingJob", "DescribeTrainingJob"):
        boto_session.events.register(f"before-call.sagemaker.{operation}", answer)


def run_v2(job: Job) -> str | None:
    """SDK 2.x: Estimator(image_uri=...), LocalSession for local instance types. Returns the model.tar.gz URI."""
    import boto3
    from sagemaker.estimator import Estimator  # slow imports: after the argument checks
    from sagemaker.local import LocalSession
    from sagemaker.session import Session

    args, output = job.args, job.output
    if job.local:
        session = LocalSession()
        # The SDK leaves each job's container root in the temp dir, a copy of the model in it (107 MB for the example's
        # ResNet-18): ours instead, removed after the job. realpath: Docker Desktop mounts /private/var, not /var (macOS)
        scratch = tempfile.TemporaryDirectory(prefix="sagemaker-local-", ignore_cleanup_errors=True)
        session.config = {"local": {"local_code": True, "container_root": os.path.realpath(scratch.name)}}
        if output.startswith("file://"):
            output = f"{output}/{job.name}"  # local mode writes straight into the path; SageMaker adds the job folder
        cloud = {}
    else:
        boto_session = boto3.Session()
        if args.dry_run:
            intercept_create_training_job(boto_session)
        session = Session(boto_session=boto_session)
        scratch = contextlib.nullcontext()
        cloud = dict(
            checkpoint_s3_uri=job.checkpoints,
            checkpoint_local_path=CHECKPOINTS,
            metric_definitions=[{"Name": n, "Regex": r} for n, r in METRICS.items()],
            use_spot_instances=args.spot,
            max_run=args.max_run,
            max_wait=job.max_wait,
            max_retry_attempts=job.max_retry_attempts,
            enable_network_isolation=args.network_isolation,
            subnets=job.subnets,
            security_group_ids=job.security_groups,
            tags=[{"Key": k, "Value": v} for k, v in job.tags.items()] or None,
            disable_profiler=True,
            debugger_hook_config=False,
        )  # SageMaker Debugger: not for this image
    code = dict(entry_point=args.entry_point, source_dir=job.source_dir) if job.source_dir else {}
    estimator = Estimator(
        **code,
        image_uri=args.image,
        role=args.role or LOCAL_ROLE,
        instance_count=args.instance_count,
        instance_type=args.instance_type,
        output_path=output,
        hyperparameters=estimator_hyperparameters(job.hyperparameters, job.source_dir),
        environment=job.environment,
        sagemaker_session=session,
        **cloud,
    )
    with scratch:
        estimator.fit(job.inputs, job_name=job.name, wait=job.wait, logs="All" if job.wait else "None")
    return estimator.model_data if job.wait else None


def run_v3(job: Job) -> str | None:
    """SDK 3.x: ModelTrainer(training_image=...), Mode.LOCAL_CONTAINER for local instance types."""
    import boto3
    from sagemaker.core.helper.session_helper import Session
    from sagemaker.core.training.configs import (
        CheckpointConfig,
        Compute,
        InputData,
        MetricDefinition,
        Networking,
        OutputDataConfig,
        RetryStrategy,
        StoppingCondition,
        Tag,
    )
    from sagemaker.train import ModelTrainer
    from sagemaker.train.configs import SourceCode
    from sagemaker.train.distributed import Torchrun
    from sagemaker.train.model_trainer import Mode

    args = job.args
    if args.dry_run:
        os.environ["SAGEMAKER_VALIDATE_ROLE"] = "false"  # SDK 3.x checks the role through IAM: not in a dry run
    if job.local:
        if not job.output.startswith("file://"):
            raise SystemExit("error: SDK 3.x local mode writes its artifacts to a local --output directory")
        root = os.path.join(job.output[len("file://") :], job.name)
        os.makedirs(root, exist_ok=True)
        settings = dict(
            training_mode=Mode.LOCAL_CONTAINER,
            local_container_root=root,
            compute=Compute(
                instance_type="local_cpu" if args.instance_type == "local" else args.instance_type,
                instance_count=args.instance_count,
            ),
        )
    else:
        boto_session = boto3.Session()
        if args.dry_run:
            intercept_create_training_job(boto_session)
        settings = dict(
            sagemaker_session=Session(boto_session=boto_session),
            compute=Compute(
                instance_type=args.instance_type,
                instance_count=args.instance_count,
                enable_managed_spot_training=args.spot,
            ),
            stopping_condition=StoppingCondition(
                max_runtime_in_seconds=args.max_run, max_wait_time_in_seconds=job.max_wait
            ),
            output_data_config=OutputDataConfig(s3_output_path=job.output),
            checkpoint_config=CheckpointConfig(s3_uri=job.checkpoints, local_path=CHECKPOINTS),
            networking=Networking(
                enable_network_isolation=args.network_isolation,
                subnets=job.subnets,
                security_group_ids=job.security_groups,
            ),
            tags=[Tag(key=k, value=v) for k, v in job.tags.items()] or None,
        )
    hyperparameters = job.hyperparameters
    if job.source_dir:  # SDK 3.x's own driver runs the code (sm_train.sh): nested settings, its distributions
        hyperparameters = nested({k: v for k, v in hyperparameters.items() if not k.startswith("sagemaker_")})
        requirements = "requirements.txt" if os.path.isfile(os.path.join(job.source_dir, "requirements.txt")) else None
        settings["source_code"] = SourceCode(
            source_dir=job.source_dir, entry_script=args.entry_point, requirements=requirements
        )
        if args.distribution == "torch_distributed":
            settings["distributed"] = Torchrun(process_count_per_node=args.processes_per_host)
        elif args.distribution != "none":
            raise SystemExit(
                f"error: SDK 3.x runs --source-dir code with --distribution none or torch_distributed, not {args.distribution}"
            )
    trainer = ModelTrainer(
        training_image=args.image,
        role=args.role or LOCAL_ROLE,
        base_job_name=job.name,
        hyperparameters=hyperparameters,
        environment=job.environment,
        **settings,
    )
    if not job.local:
        trainer = trainer.with_metric_definitions([MetricDefinition(name=n, regex=r) for n, r in METRICS.items()])
        if job.max_retry_attempts is not None:
            trainer = trainer.with_retry_strategy(RetryStrategy(maximum_retry_attempts=job.max_retry_attempts))
    inputs = [
        InputData(channel_name=name, data_source=source if source.startswith("s3://") else source[len("file://") :])
        for name, source in job.inputs.items()
    ]
    trainer.train(input_data_config=inputs, wait=job.wait, logs=job.wait)
    if job.local:
        return f"file://{root}/compressed_artifacts/model.tar.gz"  # where SDK 3.x local mode packs it
    return trainer._latest_training_job.model_artifacts.s3_model_artifacts if job.wait else None


def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    installed = f"v{importlib.metadata.version('sagemaker').split('.')[0]}"
    sdk = args.sdk or installed
    if sdk != installed:
        venv = ".venv-sdk3" if sdk == "v3" else ".venv"
        raise SystemExit(
            f"error: --sdk {sdk} needs SageMaker SDK {sdk[1]}.x, but {installed[1]}.x is installed here; "
            f"run {venv}/bin/python {sys.argv[0]} (make install makes it)"
        )
    job = make_job(args)
    if job.local and "checkpoints" in job.inputs:
        os.makedirs(job.inputs["checkpoints"][len("file://") :], exist_ok=True)
    watch = ValidationWatch(sys.stdout)
    try:
        with contextlib.redirect_stdout(watch):
            model = (run_v2 if sdk == "v2" else run_v3)(job)
    except (RuntimeError, ValueError) as e:  # the SDKs' "job failed" (local mode; UnexpectedStatusException): one line
        reason = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        print(f"error: job {job.name} failed ({reason[:300]}); the job's ERROR line above says why", file=sys.stderr)
        return 1
    if model:
        print(f"model.tar.gz: {model[len('file://') :] if model.startswith('file://') else model}")
    elif not args.dry_run:
        print(f"started {job.name}; model.tar.gz will be under {job.output}")
    if watch.accuracy:  # the last line: what the job's model reached
        print(watch.summary())
    return 0


if __name__ == "__main__":
    sys.exit(main())
