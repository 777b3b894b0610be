"""Experiment tracking in MLflow (SageMaker's managed MLflow included): one run per training job, continued across
restarts, written by global rank 0 from a thread of its own (mlflow_run.py) so that tracking never costs training.

Turned on by `mlflow.tracking_uri` (a setting, so a hyperparameter too) or, on SageMaker, by MLFLOW_TRACKING_URI in
the job's environment, as AWS's examples pass it (Estimator(environment=...), ModelTrainer(environment=...),
scripts/run_sagemaker.py --mlflow): an http(s) URL, or a SageMaker MLflow tracking server's or app's ARN, whose
requests the sagemaker-mlflow plugin signs with the job's role. Unset, nothing changes; off SageMaker only the setting
turns it on (an MLFLOW_TRACKING_URI in a developer's shell is for their own tools, and Lightning's CLI ignores it).

- The run: named after the training job, in `mlflow.experiment_name`, else MLFLOW_EXPERIMENT_NAME, else the job's
  name less the SDK's timestamp; tagged with the job, its hosts, the instance type and its restarts. Its id is kept
  where a restarted job finds it: RECORD in the checkpoint directory (synced to S3) and in each checkpoint (this
  callback's state); model_dir gets RECORD too (model.tar.gz). A restart of the same job continues the run and sets
  it RUNNING, where the run agrees: in the job's experiment, its tag naming the job (its name on SageMaker, else its
  checkpoint directory: record.py); MLFLOW_RUN_ID attaches a job to another run (one that resumes another job's
  checkpoints).
- What it holds: the progress lines' metrics (train/loss and images/s every trainer.log_every_n_steps steps and at
  the first, the validation line's val/ metrics after each validation), never a step twice; the resolved
  configuration (as config.yaml holds it, secrets redacted) as parameters; with `mlflow.log_model`, model.pt and
  config.yaml as artifacts; with `mlflow.system_metrics`, each host's CPU, memory (and GPU) utilisation.
- Its end: FINISHED after a fit that ended (and its export), KILLED on a stop, FAILED on a failure.
- A project's own MLFlowLogger (`--trainer.logger`) logs into the same run, through the same thread, with the same
  rules; its own settings (tracking_uri, experiment_name) turn tracking on where nothing else does.

    python app/example/train.py fit --mlflow.tracking_uri http://127.0.0.1:5000 ...
"""

import importlib.util
import json
import os
import time

from sagemaker_lightning.checkpoints.layout import CONFIG, MODEL, MODEL_DIR
from sagemaker_lightning.failure import UserError
from sagemaker_lightning.lines import say
from sagemaker_lightning.toolbox.concern import Context, Part, Setting, declares, listed
from sagemaker_lightning.toolbox.lightning_package import attribute, made
from sagemaker_lightning.toolbox.redact import redacted, shown_url
from sagemaker_lightning.tracking.record import continued, identity, read_record, write_record
from sagemaker_lightning.tracking.uri import DEFAULT_EXPERIMENT, check_uri, experiment_name

OPEN_WAIT_S = 5.0  # the most a fit's start waits for the run's id, where it needs it (system metrics, MLFlowLogger)
STOP_WAIT_S = 5.0  # the most a stopped or failed fit waits for its last points and end state (after its checkpoint)
FINISH_WAIT_S = 300.0  # the most a finished fit waits for them and its artifacts (model.pt uploads)
SYSTEM_EVERY_S = 10.0  # between samples of a host's CPU, memory and GPU (MLflow's own default), unless the job sets
# MLflow's MLFLOW_SYSTEM_METRICS_SAMPLING_INTERVAL
TRACKING_URI = Setting(
    "mlflow.tracking_uri",
    str | None,
    None,
    "an http(s) URL or a SageMaker MLflow tracking server's or app's ARN; null: on SageMaker MLFLOW_TRACKING_URI, else "
    "no tracking",
)
EXPERIMENT = Setting(
    "mlflow.experiment_name",
    str | None,
    None,
    f"null: MLFLOW_EXPERIMENT_NAME, else the job's name less its timestamp, else {DEFAULT_EXPERIMENT}",
)
LOG_MODEL = Setting("mlflow.log_model", bool, False, "model.pt and config.yaml as the run's artifacts after fit")
SYSTEM_METRICS = Setting(
    "mlflow.system_metrics",
    bool,
    False,
    f"each host's CPU, memory and GPU utilisation in the run, every {SYSTEM_EVERY_S:g} s",
)


class Tracker:
    """The job's run from the trainer's hooks (module docstring); a run on global rank 0 only."""

    BASE = "callbacks.Callback"

    def __init__(
        self,
        *,
        uri,
        experiment,
        job,
        tags,
        host,
        model_dir,
        log_model,
        system_metrics,
        config_yaml,
        loggers=(),
        goodput=None,
    ):
        """tags: the run's (the job, its hosts, its instance type); host: this one's name (its system metrics');
        config_yaml: the resolved configuration as model_dir's config.yaml holds it (a function); goodput: the
        attempt's (goodput.Attempt), whose figures the run gets at its end."""
        self.uri, self.experiment, self.job, self.tags, self.host = uri, experiment, job, dict(tags), host
        self.model_dir, self.log_model, self.system_metrics = model_dir, log_model, system_metrics
        self.config_yaml = config_yaml
        self.loggers = list(loggers)  # the project's MLFlowLoggers, which log through this run
        self.goodput = goodput
        self.run = None  # mlflow_run.Run, on global rank 0 during a fit
        self.identity: str | None = None  # what names this job to its run (record.identity), on global rank 0
        self._state: dict = {}  # the run a checkpoint named
        self._monitor = None

    def state_dict(self) -> dict:
        run_id = self.run.run_id if self.run else None
        return {"run_id": run_id, "job": self.identity} if run_id else dict(self._state)

    def load_state_dict(self, state_dict: dict) -> None:
        self._state = dict(state_dict)

    def on_fit_start(self, trainer, pl_module):
        from sagemaker_lightning.tracking import mlflow_client, mlflow_run

        if trainer.is_global_zero:
            dirpath = getattr(trainer.checkpoint_callback, "dirpath", None)  # the job's checkpoint directory
            record = read_record(dirpath)
            self.identity = identity(self.job, dirpath)
            continues, explicit = continued(os.environ, record, self._state, self.identity)

            def opened(run_id: str, experiment_id: str) -> None:
                kept = {"run_id": run_id, "experiment_id": experiment_id, "job": self.identity}
                kept["tracking_uri"] = shown_url(self.uri)
                for directory in filter(None, (dirpath, self.model_dir)):
                    write_record(directory, kept)

            self.run = mlflow_run.Run(
                uri=self.uri,
                experiment=self.experiment,
                name=self.job,
                tags=self.tags,
                continues=continues,
                opened=opened,
                job=self.identity,
                explicit=explicit,
            )
            self.run.params(mlflow_client.flat(_loaded(self.config_yaml())))
        if self.loggers or self.system_metrics:
            run_id = self.run.is_open.wait(OPEN_WAIT_S) and self.run.run_id if self.run else None
            for logger in self.loggers:
                logger._run_id, logger._experiment_id = run_id, self.run.experiment_id if self.run else None
            if self.system_metrics:
                self._start_system_metrics(trainer, trainer.strategy.broadcast(run_id, src=0))

    def _start_system_metrics(self, trainer, run_id: str | None) -> None:
        """Each host's CPU, memory and GPU, from its local rank 0, under system/<host>/ (MLflow's monitor)."""
        if trainer.local_rank != 0:
            return
        if not run_id:
            say("mlflow: no system metrics: the run was not open in time")
            return
        from sagemaker_lightning.tracking.mlflow_client import connect

        connect(self.uri)  # on this host too: the process's tracking URI, MLflow's settings
        try:  # psutil (which the image has: sagemaker-training's), and NVML's pynvml for GPUs where installed
            from mlflow.system_metrics.system_metrics_monitor import SystemMetricsMonitor

            every = float(os.environ.get("MLFLOW_SYSTEM_METRICS_SAMPLING_INTERVAL") or SYSTEM_EVERY_S)
            self._monitor = SystemMetricsMonitor(
                run_id, sampling_interval=every, node_id=self.host, resume_logging=True, tracking_uri=self.uri
            )
            self._monitor.start()
        except Exception as e:
            say(f"mlflow: no system metrics on {self.host} ({type(e).__name__}: {e})")

    def on_train_start(self, trainer, pl_module):
        self._since = (time.monotonic(), trainer.global_step)  # images/s from here, as the progress lines count it

    def step_end(self, trainer, step, outputs, batch):  # toolbox/concern.py's Steps calls it
        n = trainer.log_every_n_steps
        if self.run is None or not (step == 1 or (n and step % n == 0)):
            return
        from sagemaker_lightning.progress import loss, rate

        now, logged = time.monotonic(), {}
        if (value := loss(outputs)) is not None:
            logged["train/loss"] = value
        if step > self._since[1]:
            counted, per_s = rate(batch, trainer.world_size, step - self._since[1], now - self._since[0])
            logged[f"{counted}/s"] = per_s
        self._since = (now, step)
        self.run.log(logged, step)

    def on_validation_epoch_end(self, trainer, pl_module):
        if self.run is not None and not trainer.sanity_checking:  # the validation line's metrics (lines.validation)
            metrics = trainer.callback_metrics
            self.run.log({k: float(v) for k, v in metrics.items() if k.startswith("val/")}, trainer.global_step)

    def on_fit_end(self, trainer, pl_module):
        if self.run is not None and self.log_model and self.model_dir:
            self.run.artifacts([os.path.join(self.model_dir, name) for name in (MODEL, CONFIG)])
        self._end("FINISHED", FINISH_WAIT_S, trainer.global_step)

    def on_exception(self, trainer, pl_module, exception):
        stopped = (attribute(self.pl, "utilities.exceptions.SIGTERMException"), KeyboardInterrupt)
        self._end("KILLED" if isinstance(exception, stopped) else "FAILED", STOP_WAIT_S, trainer.global_step)

    def _end(self, status: str, wait_s: float, step: int) -> None:
        if self.run is not None and self.goodput is not None and self.goodput.training:
            self.run.log(self.goodput.figures(), step)  # where the job's time went (goodput.py)
        if self._monitor is not None:
            self._monitor.finish()
            self._monitor = None
        if self.run is not None:
            self.run.finish(status, wait_s)
            self.run = None


def _loaded(config_yaml: str) -> dict:
    import yaml

    loaded = yaml.safe_load(config_yaml)
    return loaded if isinstance(loaded, dict) else {}


def _through(tracker: Tracker, logger) -> None:
    """A project's MLFlowLogger logs into the tracker's run, through its thread: its metrics with the same rule on
    steps, its hyperparameters as parameters (a changed one never fails the fit), its end state the tracker's; its
    `experiment` is a client of the tracker's server, its run_id the tracker's run once open (OPEN_WAIT_S)."""
    from sagemaker_lightning.tracking import mlflow_client

    def log_metrics(metrics, step=None):
        if tracker.run is not None:
            prefix = f"{logger._prefix}{logger.LOGGER_JOIN_CHAR}" if logger._prefix else ""
            tracker.run.log({prefix + k: float(v) for k, v in metrics.items()}, step or 0)

    def log_hyperparams(params):
        if tracker.run is not None:  # redacted as the configuration is (redact.py)
            params = json.loads(json.dumps(params if isinstance(params, dict) else vars(params), default=str))
            tracker.run.params(mlflow_client.flat(redacted(params)))

    logger._tracking_uri = tracker.uri
    logger._initialized = True  # Lightning touches `experiment` before the fit: no run of its own is made there
    logger._mlflow_client = mlflow_client.connect(tracker.uri)
    logger.log_metrics, logger.log_hyperparams = log_metrics, log_hyperparams
    logger.finalize = lambda status="success": None  # the tracker sets the end state


@declares(TRACKING_URI, EXPERIMENT, LOG_MODEL, SYSTEM_METRICS)
def concern(ctx: Context) -> Part:
    """The Tracker when tracking is on (module docstring), after every checkpoint callback: a stop's wait for the
    server comes after its checkpoint. A project's MLFlowLogger (trainer.logger: one or a list) logs through it."""
    pl, plan, config = ctx.pl, ctx.plan, ctx.config
    mlflow_logger = attribute(pl, "loggers.MLFlowLogger")
    own = [item for item in listed(ctx.trainer.get("logger")) if isinstance(item, mlflow_logger)]
    uri = TRACKING_URI.of(config) or (os.environ.get("MLFLOW_TRACKING_URI") if plan.on_sagemaker else None)
    if not uri and own and plan.on_sagemaker and own[0]._tracking_uri.startswith(("http", "arn:")):
        uri = own[0]._tracking_uri
    if not uri:
        return Part()
    check_uri(uri)
    needed = {"mlflow": "mlflow-skinny", **({"sagemaker_mlflow": "sagemaker-mlflow"} if uri.startswith("arn:") else {})}
    for module, package in needed.items():
        if importlib.util.find_spec(module) is None:  # imported on the run's thread, not at every rank's start
            raise UserError(f"tracking in MLflow needs {package}, which is not installed: pip install {package}")
    model_dir, log_model = MODEL_DIR.of(config), LOG_MODEL.of(config)
    if log_model and not model_dir:
        say("mlflow: mlflow.log_model logs model_dir's model.pt and config.yaml, but model_dir is not set: none")
    job = plan.job_name
    tags = {}
    if plan.on_sagemaker:
        tags = {"sagemaker.job_name": job or "", "sagemaker.hosts": ",".join(plan.hosts)}
        tags["sagemaker.instance_type"] = plan.instance_type
    experiment = experiment_name(EXPERIMENT.of(config), os.environ, own[0]._experiment_name if own else None, job)
    tracker = made(Tracker, pl)(
        uri=uri,
        experiment=experiment,
        job=job,
        tags={k: v for k, v in tags.items() if v},
        host=plan.host,
        model_dir=model_dir,
        log_model=log_model,
        system_metrics=SYSTEM_METRICS.of(config),
        config_yaml=ctx.config_yaml,
        loggers=own,
        goodput=ctx.goodput,
    )
    for item in own:
        _through(tracker, item)
    if own and ctx.plan.rank_zero:
        say(f"mlflow: trainer.logger's MLFlowLogger logs into the job's run on {shown_url(uri)} (the runtime's rules)")
        if any(item._log_model for item in own):
            say(
                "mlflow: MLFlowLogger(log_model=...) uploads checkpoints itself, on the training thread, unbounded: "
                "mlflow.log_model=true logs model.pt and config.yaml from the run's thread instead"
            )
    return Part(after_checkpoints=[tracker])
