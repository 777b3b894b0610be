"""`tune` in local mode: a tuning job cannot run there, so its first children run instead, one after another, as
local-mode training jobs of the SDK in use with the hyperparameters SageMaker gives a child (the tuner's static ones,
each tuned value as text, and _tuning_objective_metric), and what the tuner would read from their logs is printed:
the objective, found with the request's own regex, every value in the order the log gives it, and which hosts printed
it. The children run the image's toolkit as a tuning job's do on either SDK (the tuning API has no ContainerEntrypoint,
so SDK 3.x's driver never runs them): --source-dir arrives as a channel that sagemaker_submit_directory names.

Which settings: Grid's first combinations; otherwise child i of n takes each range i/(n-1) of the way from its low end
to its high end along its scale, and categorical ranges their i-th choice: the ends a search can reach, not
SageMaker's draws.

    .venv/bin/python scripts/run_sagemaker.py tune --image sagemaker-lightning:latest --input data/synthetic \\
        --output runs --objective validation:accuracy --maximize --range optimizer.lr=0.01:0.1:log \\
        --range data.batch_size=16,32 --max-jobs 2 trainer.max_epochs=2 trainer.accelerator=cpu
"""

import dataclasses
import itertools
import json
import os
import re
import sys

from jobs import outcome
from jobs.outcome import COLOUR
from jobs.tuning import Tuning, child_hyperparameters

CODE_CHANNEL = "code"  # --source-dir as a channel of its own, which the toolkit copies into /opt/ml/code
CODE_DIR = f"/opt/ml/input/data/{CODE_CHANNEL}"
CHECKPOINTS = "checkpoints"  # local mode's --checkpoints: a mounted channel (spec.make_job)
# the host in docker compose's prefix of each line (colours taken off): SDK 2.x's <project>-algo-1-xxxxx, SDK 3.x's
# algo-1_1 (docker-compose v1), algo-1 elsewhere: its SageMaker name, algo-N
HOST = re.compile(r"^\S*?(algo-\d+)\S*\s+\|")


def settings(tuning: Tuning) -> list[dict[str, str]]:
    """The tuned values of the children that run locally: --max-jobs of them (Grid without it: every combination)."""
    ranges = tuning.ranges
    if tuning.strategy == "Grid":
        grid = itertools.product(*(r.values for r in ranges))
        return [
            dict(zip([r.key for r in ranges], values, strict=True))
            for values in itertools.islice(grid, tuning.max_jobs)
        ]
    n = tuning.max_jobs
    return [{r.key: r.point(i if r.kind == "Categorical" else i / max(n - 1, 1)) for r in ranges} for i in range(n)]


def static(tuning: Tuning, code: str, region: str) -> dict[str, str]:
    """The static hyperparameters each SDK's tuner sends (StaticHyperParameters), with the code at `code`: SDK 2.x's
    Estimator JSON-encodes every value of a job with a source directory and adds its own sagemaker_* entries; SDK
    3.x's tuner adds sagemaker_program and sagemaker_submit_directory as plain text (tests/cloud/test_tuning_cloud.py
    holds both to the SDKs' requests)."""
    job = tuning.job
    hps = job.hyperparameters
    if not job.source_dir:
        return hps
    if job.sdk == "v3":
        return {**hps, "sagemaker_program": job.entry_point, "sagemaker_submit_directory": code}
    encoded = {k: v if k.startswith("sagemaker_") else json.dumps(v) for k, v in hps.items()}
    sdk = {"sagemaker_program": job.entry_point, "sagemaker_submit_directory": code, "sagemaker_job_name": tuning.name}
    sdk |= {"sagemaker_region": region, "sagemaker_container_log_level": 20}  # logging.INFO, the SDK's default
    return {**encoded, **{k: json.dumps(v) for k, v in sdk.items()}}


def child_jobs(tuning: Tuning, region: str) -> list:
    """Each local child as a training job (spec.Job) whose hyperparameters are exactly the child's; with --checkpoints,
    its own folder in it (a child resumes its own last.ckpt, never a sibling's)."""
    job, jobs = tuning.job, []
    code = {CODE_CHANNEL: f"file://{job.source_dir}"} if job.source_dir else {}
    for i, setting in enumerate(settings(tuning), start=1):
        name = f"{tuning.name}-{i:03d}"
        inputs = {**job.inputs, **code}
        if CHECKPOINTS in inputs:
            inputs[CHECKPOINTS] = f"{inputs[CHECKPOINTS]}/{name}"
        hps = child_hyperparameters(static(tuning, CODE_DIR, region), setting, tuning.objective)
        jobs.append(dataclasses.replace(job, name=name, hyperparameters=hps, inputs=inputs, source_dir=None, wait=True))
    return jobs


def objective_values(log: str, regex: str) -> list[tuple[str, float]]:
    """What the tuner reads from a child's log: (host, value) for every line the objective's regex matches."""
    found = []
    for line in COLOUR.sub("", log).splitlines():
        if match := re.search(regex, line):
            host = HOST.match(line)
            found.append((host[1] if host else "?", float(match[1])))
    return found


def run(tuning: Tuning) -> int:
    """Run the local children one after another; print each one's objective values as the tuner would read them,
    then their ranking. 1 if a child failed or printed no objective."""
    regex, ranked = tuning.job.metrics[tuning.objective], []
    for child in child_jobs(tuning, os.environ.get("AWS_DEFAULT_REGION", "")):
        tuned = " ".join(f"{r.key}={child.hyperparameters[r.key]}" for r in tuning.ranges)
        print(f"child {child.name}: {tuned}")
        if CHECKPOINTS in child.inputs:
            os.makedirs(child.inputs[CHECKPOINTS][len("file://") :], exist_ok=True)
        try:
            log = outcome.run(child).log  # the child's log as it passed, kept once: by outcome.run, which reads it too
        except (RuntimeError, ValueError) as e:
            print(
                f"error: child {child.name} failed ({str(e).strip()[:200]}); its ERROR line above says why",
                file=sys.stderr,
            )
            return 1
        values = objective_values(log, regex)
        hosts = sorted({host for host, _ in values})
        shown = " ".join(f"{v:.4f}" for _, v in values)
        print(f"child {child.name}: {tuning.objective} per epoch, as the tuner reads it: {shown or 'none'} "
              f"(printed by {', '.join(hosts) or 'no host'})")  # fmt: skip
        if not values:
            print(
                f"error: child {child.name} printed no {tuning.objective}: the tuner would rank nothing",
                file=sys.stderr,
            )
            return 1
        ranked.append((values[-1][1], child.name, tuned))
    ranked.sort(reverse=tuning.maximize)
    print(f"{tuning.objective_type} {tuning.objective}, each child's last value: "
          + "; ".join(f"{name} {value:.4f} ({tuned})" for value, name, tuned in ranked))  # fmt: skip
    return 0
