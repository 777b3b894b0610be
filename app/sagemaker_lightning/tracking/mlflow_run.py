"""The MLflow run of one training job, written from a thread of its own so that tracking never costs training: the
training thread only queues (`log`, `params`, `artifacts`), and the thread sends, in order, what it was given.

Opening the run continues the one the job recorded (its checkpoint directory, its checkpoints: only a run in the job's
experiment whose tag names the job, record.refusal; or MLFLOW_RUN_ID's, as it is) or creates one named after the job,
sets it RUNNING and reads what it already holds: each metric's highest step (a
point at or below it is never sent again: MLflow appends a repeated step, it cannot replace one, so every metric's
history keeps unique, increasing steps) and its parameters (one unchanged passes; a changed one, which MLflow refuses
with INVALID_PARAMETER_VALUE, is kept as it was and the new value goes into a tag `changed.<key>`).

A server that is down or slow is said once and retried, the points kept up to QUEUE_MAX (then dropped, counted); one
that refuses the job's credentials drops tracking for the job; a request it rejects is skipped, said in one line.
Each request is bounded (MLFLOW_HTTP_REQUEST_TIMEOUT, MLFLOW_HTTP_REQUEST_MAX_RETRIES: mlflow_client.DEFAULTS unless the job
sets them), and the end (`finish`) waits a bounded time: a stop's checkpoint, saved before it, is never held up.
No torch; mlflow is imported by the thread.

    python -c "from sagemaker_lightning.tracking import mlflow_run; help(mlflow_run.Run)"
"""

import threading
import time
from collections import deque
from collections.abc import Callable, Mapping

from sagemaker_lightning.lines import say
from sagemaker_lightning.toolbox.redact import shown_url
from sagemaker_lightning.tracking.mlflow_client import MAX_VALUE, connect, key, kind, why
from sagemaker_lightning.tracking.record import JOB, refusal

QUEUE_MAX = 10_000  # metric points waiting for the server; past that, new ones are dropped (counted, said)
BATCH = 1000  # metric points a request carries: MLflow's limit for log_batch; params and tags go 100 at a time
# between two requests of metric points: about one a second, whatever the step rate (a request costs the training
# process about a millisecond of CPU in Python's HTTP client; one a step cost 750 µs a step: docs/tracking.md)
SEND_EVERY_S = 1.0
BACKOFF_S = (1, 2, 5, 10, 30)  # between tries of a request the server did not answer, the last one repeated
CHANGED = "changed."  # a changed parameter's tag: changed.<key> = "<the run's value> -> <this job's value>"
RESTARTS = "sagemaker.restarts"  # the tag that counts how often the run was continued
METRICS, OPEN = "log the metrics", "open the run"  # what two of the thread's requests do, as its lines say


class Run:
    """The run of the job on `uri`, from global rank 0 (module docstring). `continues`: the run id to continue, if
    any, MLFLOW_RUN_ID's when `explicit`; `opened(run_id, experiment_id)`: called on the thread once the run is open
    (the record is written there); `job`: the job's identity (record.identity), the tag JOB of a run it makes."""

    def __init__(
        self,
        *,
        uri: str,
        experiment: str,
        name: str | None,
        tags: Mapping[str, str],
        continues: str | None,
        opened: Callable[[str, str], None],
        job: str | None = None,
        explicit: bool = False,
    ):
        self.uri, self.experiment, self.name, self.tags = uri, experiment, name, dict(tags)
        self.shown = shown_url(uri)  # as the lines name the server
        self.continues, self.opened, self.job, self.explicit = continues, opened, job, explicit
        self.run_id: str | None = None
        self.experiment_id: str | None = None
        self.client = None  # MlflowClient, made on the thread
        self.is_open = threading.Event()
        self._ops: deque = deque()  # (what, function, payload) in order
        self._points = 0  # metric points queued
        self._dropped = 0  # metric points dropped: the queue was full
        self._last: dict[str, int] = {}  # each metric's highest step the run holds
        self._params: dict[str, str] = {}  # the run's parameters
        self._cv = threading.Condition()
        self._ending = False  # finish() was called: each request is tried once more, not retried
        self._gone: str | None = None  # why tracking was dropped
        self._trouble: str | None = None  # the server's problem, said once, until it answers again
        self._thread = threading.Thread(target=self._work, name="mlflow", daemon=True)
        self._submit(OPEN, self._open, None)
        self._thread.start()

    # ---- the training thread --------------------------------------------------------------------------------------

    def _submit(self, what: str, function, payload) -> None:
        with self._cv:
            if self._gone is None:
                self._ops.append((what, function, payload))
                self._cv.notify()

    def log(self, metrics: Mapping[str, float], step: int) -> None:
        """Metric points at `step` (the values as floats); queued, dropped when QUEUE_MAX are waiting."""
        stamp = int(time.time() * 1000)
        with self._cv:
            if self._gone is not None:
                return
            if self._points + len(metrics) > QUEUE_MAX:
                self._dropped += len(metrics)
                return
            points = [(key(name), float(value), stamp, step) for name, value in metrics.items()]
            self._points += len(points)
            if self._ops and self._ops[-1][0] == METRICS:  # one request for every point that waits
                self._ops[-1][2].extend(points)
            else:  # the thread is woken for a new request only, not at every step
                self._ops.append((METRICS, self._metrics, points))
                self._cv.notify()

    def params(self, values: Mapping[str, str]) -> None:
        self._submit("log the parameters", self._log_params, dict(values))

    def artifacts(self, paths: list[str]) -> None:
        self._submit("log the artifacts", self._log_artifacts, list(paths))

    def finish(self, status: str, wait_s: float) -> None:
        """The run's end state ("FINISHED", "KILLED", "FAILED") after everything queued; waits at most `wait_s`."""
        self._submit(f"set the run {status}", self._end, status)
        with self._cv:
            self._ending = True
            self._cv.notify()
        self._thread.join(wait_s)
        if self._thread.is_alive():
            say(
                f"mlflow: gave up after {wait_s:g} s waiting for {self.shown}: the run's last points and its end "
                f"state {status} were not sent; training's results are not affected"
            )

    # ---- the thread ----------------------------------------------------------------------------------------------

    def _work(self) -> None:
        tries = 0
        while True:
            with self._cv:
                while not self._ops:
                    if self._ending:
                        return
                    self._cv.wait()
                # taken out: points queued meanwhile go into a request of their own, never into this one
                what, function, payload = self._ops.popleft()
            try:
                if self.client is None:
                    self.client = connect(self.uri)
                function(payload)
            except Exception as e:
                problem, line = kind(e), why(e)
                if problem == "unreachable" and not self._ending:
                    with self._cv:
                        self._ops.appendleft((what, function, payload))  # tried again first
                    if self._trouble is None:
                        self._trouble = line
                        say(
                            f"mlflow: {self.shown} does not answer ({line}): tracking retried, up to {QUEUE_MAX} points "
                            "kept meanwhile; training goes on"
                        )
                    with self._cv:  # finish() cuts the wait short
                        self._cv.wait_for(lambda: self._ending, BACKOFF_S[min(tries, len(BACKOFF_S) - 1)])
                    tries += 1
                    continue
                if problem == "rejected" and what != OPEN:
                    say(f"mlflow: {self.shown} rejected the request to {what} ({line}): skipped; training goes on")
                else:
                    said = {
                        "refused": "refused the job's credentials, or it has none",
                        "rejected": f"rejected the request to {what}",
                    }
                    self._drop(f"{self.shown} {said.get(problem, 'did not answer at the end')} ({line})")
                    return
            tries = 0
            if self._trouble is not None:
                self._trouble = None
                say(f"mlflow: {self.shown} answers again: tracking goes on ({self._dropped} points dropped meanwhile)")
            if what == METRICS:
                with self._cv:
                    self._points -= len(payload)
                    self._cv.wait_for(lambda: self._ending, SEND_EVERY_S)  # the points of the next second gather

    def _drop(self, why: str) -> None:
        with self._cv:
            self._gone = why
            self._ops.clear()
        say(f"mlflow: {why}: tracking dropped for this job; training goes on")

    def _open(self, _) -> None:
        client = self.client
        experiment = client.get_experiment_by_name(self.experiment)
        experiment_id = experiment.experiment_id if experiment is not None else None
        run = self._continued(experiment_id) if self.continues else None
        if run is None:
            if experiment_id is None:
                experiment_id = client.create_experiment(self.experiment)
            made = {**self.tags, RESTARTS: "0", **({JOB: self.job} if self.job else {})}
            run = client.create_run(experiment_id, run_name=self.name, tags=made)
            tags, named = {}, self.experiment
        else:  # the line names the run's experiment: MLFLOW_RUN_ID's run may be in another
            named = self.experiment
            if run.info.experiment_id != experiment_id:
                named = client.get_experiment(run.info.experiment_id).name
            client.update_run(run.info.run_id, status="RUNNING")
            self._params = dict(run.data.params)
            # each metric's point at its largest step, as the run holds it: MLflow's own system metrics monitor reads
            # its resume step there too (a metric's whole history can be long: mlflow#22991)
            self._last = {metric.key: metric.step for metric in run.data._metric_objs}
            tags = {**self.tags, RESTARTS: str(int(run.data.tags.get(RESTARTS, "0")) + 1)}
        self.run_id, self.experiment_id = run.info.run_id, run.info.experiment_id
        self._log(tags=tags)
        try:
            self.opened(self.run_id, run.info.experiment_id)
        except Exception as e:  # the run is tracked all the same; a restart makes another
            say(f"mlflow: could not record the run id ({type(e).__name__}: {e}): a restarted job starts a new run")
        self.is_open.set()
        continued = f"continued (restart {tags[RESTARTS]})" if tags else "created"
        say(f"mlflow: run {self.run_id} {continued} in experiment {named!r} on {self.shown}")

    def _continued(self, experiment_id: str | None):
        """The run to continue (self.continues), or None: one the server does not hold; one the record proposed that is
        not this job's (record.refusal: another experiment, another job's tag), said in one line. MLFLOW_RUN_ID's
        (self.explicit) is taken as it is: whoever starts the job chose it."""
        from mlflow.exceptions import MlflowException

        try:
            run = self.client.get_run(self.continues)
        except MlflowException as e:
            if e.error_code != "RESOURCE_DOES_NOT_EXIST":
                raise
            say(f"mlflow: the run {self.continues} the job recorded is not on {self.shown}: a new run")
            return None
        if not self.explicit and (why := refusal(run.info.experiment_id, run.data.tags, experiment_id, self.job)):
            say(
                f"mlflow: run {self.continues}, which the checkpoints name, is not continued: {why}; this job starts a "
                "run of its own and leaves that one as it is"
            )
            return None
        return run

    def _log(self, metrics=(), params=None, tags=None) -> None:
        """One log_batch call per MLflow's limits (BATCH metrics, 100 params, 100 tags a request)."""
        from mlflow.entities import Metric, Param, RunTag

        metrics = [Metric(*point) for point in metrics]
        params = [Param(k, v) for k, v in (params or {}).items()]
        tags = [RunTag(k, v[:MAX_VALUE]) for k, v in (tags or {}).items()]
        for i in range(0, len(metrics), BATCH):
            self.client.log_batch(self.run_id, metrics=metrics[i : i + BATCH])
        for i in range(0, max(len(params), len(tags)), 100):
            self.client.log_batch(self.run_id, params=params[i : i + 100], tags=tags[i : i + 100])

    def _metrics(self, points: list) -> None:
        """The points of steps above the run's highest for their metric, each step once."""
        fresh, last = [], dict(self._last)
        for name, value, stamp, step in points:
            if step > last.get(name, -1):
                last[name] = step
                fresh.append((name, value, stamp, step))
        self._log(metrics=fresh)
        self._last = last  # once sent: a request tried again sends the same points

    def _log_params(self, values: dict[str, str]) -> None:
        new = {k: v for k, v in values.items() if k not in self._params}
        changed = {k: v for k, v in values.items() if k in self._params and self._params[k] != v}
        self._log(params=new, tags={f"{CHANGED}{k}": f"{self._params[k]} -> {v}" for k, v in changed.items()})
        self._params.update(new)
        if changed:
            say(
                f"mlflow: {len(changed)} parameter(s) differ from the run's ({', '.join(sorted(changed)[:5])}): the "
                f"run keeps its values, this job's are in its tags {CHANGED}<key>"
            )

    def _log_artifacts(self, paths: list[str]) -> None:
        for path in paths:
            self.client.log_artifact(self.run_id, path)

    def _end(self, status: str) -> None:
        self.client.set_terminated(self.run_id, status)
