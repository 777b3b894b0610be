"""The tuning job `scripts/run_sagemaker.py tune` starts, resolved from its options into one frozen Tuning around the
training job its children run (spec.Job), with SageMaker's rules checked here, before any SDK import: a bad option
fails in one line. The SDK adapters (sdk2.tune, sdk3.tune) and the local children (children.py) read the Tuning.

    from jobs import options, spec, tuning  # from scripts/

    args = options.parse_args(["tune", "--image", "i", "--input", "d", "--output", "o", "--objective",
                               "validation:accuracy", "--maximize", "--range", "optimizer.lr=1e-4:1e-1:log",
                               "--max-jobs", "2"])
    t = tuning.make_tuning(args, spec.make_job(args, installed="v2"))
    [r.request() for r in t.ranges]  # [{'Name': 'optimizer.lr', 'MinValue': '1e-4', 'MaxValue': '1e-1', ...}]
"""

import argparse
import dataclasses
import math
import re

from jobs.spec import Job

# SageMaker's limits, from the API's own shapes (botocore's sagemaker model: CreateHyperParameterTuningJob)
NAME = re.compile(r"[a-zA-Z0-9](-*[a-zA-Z0-9]){0,31}")  # HyperParameterTuningJobName: 1-32 characters
MAX_PARENTS = 5  # ParentHyperParameterTuningJobs: 1-5 (warm start)
MAX_VALUES = 30  # a categorical range's values (ParameterValues: 1-30)
MAX_RANGES = 30  # ranges of each kind (IntegerParameterRanges, ContinuousParameterRanges, ...: 0-30)
MAX_EPOCHS = 20000  # Hyperband's MaxResource at most (HyperbandStrategyConfig's documentation)
STRATEGIES = ("Bayesian", "Random", "Hyperband", "Grid")
# --range KEY=LOW:HIGH[:SCALE]: the API's ScalingType for each word (log: values > 0; reverse-log: 0 <= x < 1)
SCALES = {"auto": "Auto", "linear": "Linear", "log": "Logarithmic", "reverse-log": "ReverseLogarithmic"}
OBJECTIVE_KEY = "_tuning_objective_metric"  # what SageMaker adds to every child's hyperparameters: the objective
KEY = re.compile(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)*")  # a LightningCLI key: trainer.max_epochs, optimizer
INTEGER = re.compile(r"[+-]?\d+")  # a bound written as an integer: an integer range
EPOCHS = "trainer.max_epochs"  # Hyperband's resource: the most epochs a child trains (MaxResource)


@dataclasses.dataclass(frozen=True)
class Range:
    """One --range: what the request's ParameterRanges hold for it."""

    key: str  # the LightningCLI key, e.g. optimizer.lr
    kind: str  # "Continuous", "Integer" or "Categorical": the request's list it goes in
    low: str = ""  # bounds as written (Continuous, Integer)
    high: str = ""
    scale: str = "Auto"  # a value of SCALES
    values: tuple[str, ...] = ()  # Categorical: the choices, each sent as this text

    def request(self) -> dict:
        if self.kind == "Categorical":
            return {"Name": self.key, "Values": list(self.values)}
        return {"Name": self.key, "MinValue": self.low, "MaxValue": self.high, "ScalingType": self.scale}

    def point(self, fraction: float) -> str:
        """The value `fraction` (0..1) of the way from low to high along the range's scale, as its child gets it:
        integers as integers, other numbers to 6 significant digits; categorical ranges cycle through their values
        (fraction as an index)."""
        if self.kind == "Categorical":
            return self.values[int(fraction) % len(self.values)]
        low, high = float(self.low), float(self.high)
        if self.scale == "Logarithmic":
            value = math.exp(math.log(low) + fraction * (math.log(high) - math.log(low)))
        elif self.scale == "ReverseLogarithmic":  # dense near 1: log scale on 1 - x
            value = 1 - math.exp(math.log(1 - low) + fraction * (math.log(1 - high) - math.log(1 - low)))
        else:
            value = low + fraction * (high - low)
        return str(round(value)) if self.kind == "Integer" else f"{value:.6g}"


@dataclasses.dataclass(frozen=True)
class Tuning:
    """One tuning job, resolved: all that either SDK's tuner sends, nothing left to check."""

    job: Job  # what each child runs: its static hyperparameters (none of them tuned), instances, channels, spot
    objective: str  # a metric definition's name (job.metrics): what SageMaker ranks the children by
    maximize: bool
    ranges: tuple[Range, ...]
    strategy: str  # a value of STRATEGIES
    max_jobs: int | None  # None: Grid, whose size SageMaker computes
    max_parallel_jobs: int
    early_stopping: str  # "Auto" or "Off" (the API's TrainingJobEarlyStoppingType)
    warm_start: tuple[str, ...]  # parent tuning jobs (IdenticalDataAndAlgorithm)
    hyperband: tuple[int, int] | None  # (MinResource, MaxResource) in epochs, with the Hyperband strategy

    @property
    def objective_type(self) -> str:
        return "Maximize" if self.maximize else "Minimize"

    @property
    def name(self) -> str:
        """The tuning job's: the job's (--job-name and a timestamp); its children are <name>-NNN-xxxxxxxx."""
        return self.job.name

    def sdk_ranges(self, categorical, continuous, integer) -> dict:
        """The ranges as an SDK's tuner takes them, given its three parameter classes (both SDKs' take the same
        arguments); bounds sent as written (their to_string)."""
        kinds = {"Continuous": continuous, "Integer": integer}
        return {
            r.key: categorical(list(r.values)) if r.kind == "Categorical" else kinds[r.kind](r.low, r.high, r.scale)
            for r in self.ranges
        }


def fail(message: str):
    raise SystemExit(f"error: {message}")


def parse_range(word: str) -> Range:
    """--range KEY=LOW:HIGH[:SCALE] (Integer when both bounds are integers, else Continuous) or KEY=A,B,C
    (Categorical: each choice sent as its text)."""
    key, sep, spec = word.partition("=")
    if not sep or not KEY.fullmatch(key):
        fail(
            f"--range {word}: give KEY=LOW:HIGH[:SCALE] or KEY=A,B,C with a LightningCLI key, e.g. optimizer.lr=1e-4:1e-1:log"
        )
    if key.startswith("sagemaker_") or key == OBJECTIVE_KEY:
        fail(f"--range {word}: {key} is SageMaker's own hyperparameter, not a setting of the project")
    if ":" not in spec:
        values = tuple(v for v in spec.split(","))
        if len(values) < 2 or "" in values or len(set(values)) < len(values):
            fail(f"--range {word}: a categorical range needs two or more different, non-empty choices (A,B,C)")
        if len(values) > MAX_VALUES:
            fail(f"--range {word}: {len(values)} choices; SageMaker takes {MAX_VALUES} at most")
        return Range(key, "Categorical", values=values)
    low, high, *rest = spec.split(":")
    scale = rest[0] if rest else "auto"
    if len(rest) > 1 or scale not in SCALES:
        fail(f"--range {word}: the scale after LOW:HIGH is one of {', '.join(SCALES)}")
    try:
        lo, hi = float(low), float(high)
    except ValueError:
        fail(f"--range {word}: LOW and HIGH are numbers (LOW:HIGH), or give choices as A,B,C")
    if not lo < hi:
        fail(f"--range {word}: {'an empty' if lo == hi else 'an inverted'} range; give LOW < HIGH")
    if scale == "log" and lo <= 0:
        fail(f"--range {word}: a log scale needs values above 0; raise LOW above 0 or use :linear")
    integer = bool(INTEGER.fullmatch(low) and INTEGER.fullmatch(high))
    if scale == "reverse-log" and (integer or lo < 0 or hi >= 1):
        fail(f"--range {word}: a reverse-log scale is for continuous values with 0 <= LOW < HIGH < 1")
    return Range(key, "Integer" if integer else "Continuous", low, high, SCALES[scale])


def make_tuning(args: argparse.Namespace, job: Job) -> Tuning:
    """The tuning job the options describe around `job`, with SageMaker's rules checked: a broken rule is a SystemExit
    with one line. Pure: no side effects, nothing imported."""
    ranges = tuple(parse_range(word) for word in args.range)
    if not ranges:
        fail("tune needs at least one --range KEY=LOW:HIGH or KEY=A,B,C")
    keys = [r.key for r in ranges]
    if repeated := sorted({k for k in keys if keys.count(k) > 1}):
        fail(f"--range {repeated[0]} is given twice; one range a key")
    if given := [k for k in keys if k in job.hyperparameters]:
        fail(
            f"{given[0]} is both a hyperparameter ({given[0]}={job.hyperparameters[given[0]]}) and a --range; drop one"
        )
    for kind in ("Continuous", "Integer", "Categorical"):
        if sum(r.kind == kind for r in ranges) > MAX_RANGES:
            fail(f"more than {MAX_RANGES} {kind.lower()} ranges; SageMaker takes {MAX_RANGES} of each kind")
    if len(job.name) > 32 or not NAME.fullmatch(job.name):
        fail(
            f"the tuning job's name {job.name} ({len(job.name)} characters) is longer than SageMaker's 32 or not "
            "letters, digits and single hyphens; give a shorter --job-name (a timestamp of 15 characters follows it)"
        )
    objective = args.objective
    if objective not in job.metrics:
        fail(
            f"--objective {objective} is not a metric the job prints; give one of {', '.join(job.metrics)}, or add "
            "yours with --metric val/NAME (a val/ metric the project logs) or --metric NAME=REGEX"
        )
    strategy, early_stopping = args.strategy, args.early_stopping.capitalize()
    per_epoch = strategy == "Hyperband" or early_stopping == "Auto"
    if per_epoch and not objective.startswith("validation:"):
        fail(
            f"--objective {objective} is printed every few steps, not once per epoch as {strategy} with early "
            "stopping compares it; choose a validation: metric (the validation line prints each once per epoch)"
        )
    hyperband = None
    if strategy == "Hyperband":
        if early_stopping == "Auto":
            fail("Hyperband stops children itself: leave out --early-stopping auto (SageMaker refuses both)")
        if EPOCHS in keys:
            fail(f"Hyperband spends {EPOCHS} itself (its MaxResource): give {EPOCHS}=N, not a --range of it")
        epochs = job.hyperparameters.get(EPOCHS, "")
        if not epochs.isdigit() or not 1 <= int(epochs) <= MAX_EPOCHS:
            fail(f"Hyperband needs {EPOCHS}=N (1 to {MAX_EPOCHS}): the most epochs a child trains, its MaxResource")
        hyperband = (1, int(epochs))
    if strategy == "Grid":
        if kinds := sorted({r.kind for r in ranges} - {"Categorical"}):
            fail(f"Grid runs every combination of categorical ranges (A,B,C); a {kinds[0].lower()} range has none")
        if args.max_jobs is not None and not job.local:
            fail("Grid runs every combination of its ranges: leave out --max-jobs (SageMaker counts them)")
    elif args.max_jobs is None:
        fail("give --max-jobs N: how many children the tuning job starts")
    if (args.max_jobs is not None and args.max_jobs < 1) or args.max_parallel_jobs < 1:
        fail("--max-jobs and --max-parallel-jobs count children: 1 or more")
    if args.max_jobs is not None and args.max_parallel_jobs > args.max_jobs:
        fail(f"--max-parallel-jobs {args.max_parallel_jobs} is above --max-jobs {args.max_jobs}")
    parents = tuple(p for p in (args.warm_start or "").split(",") if p)
    if len(parents) > MAX_PARENTS:
        fail(f"--warm-start names {len(parents)} parent tuning jobs; SageMaker takes {MAX_PARENTS} at most")
    if bad := [p for p in parents if not NAME.fullmatch(p)]:
        fail(f"--warm-start {bad[0]} is not a tuning job's name (1-32 letters, digits and hyphens)")
    if job.keep_alive is not None:
        fail(
            "--keep-alive is for training jobs: neither SDK's tuner sends KeepAlivePeriodInSeconds for a tuning "
            "job's children (SDK 2.x's HyperParameterTuningResourceConfig has no such field), so it would be dropped"
        )
    if job.local and parents:
        fail("--warm-start is for tuning jobs in the cloud: local mode runs children, with no tuner to warm-start")
    return Tuning(
        job=job,
        objective=objective,
        maximize=args.maximize,
        ranges=ranges,
        strategy=strategy,
        max_jobs=args.max_jobs,
        max_parallel_jobs=args.max_parallel_jobs,
        early_stopping=early_stopping,
        warm_start=parents,
        hyperband=hyperband,
    )


def child_hyperparameters(static: dict[str, str], setting: dict[str, str], objective: str) -> dict[str, str]:
    """What one child's CreateTrainingJob holds: the static hyperparameters, the tuned values as text and the
    objective's name under OBJECTIVE_KEY, as SageMaker adds it to every child."""
    return {**static, **setting, OBJECTIVE_KEY: objective}
