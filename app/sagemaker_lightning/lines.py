"""The runtime's log lines: how one is written (`say`), the formats of the lines that SageMaker reads into CloudWatch
metrics and tuning objectives, and the regular expressions that read them (METRICS, which scripts/run_sagemaker.py
sends as the job's metric definitions). Each format stands next to its expression, so one cannot change without the
other; tests/toolkit checks them against the lines of real runs. No torch: PID 1 and the launch plan print too.

    python -c "from sagemaker_lightning import lines; print(lines.progress(0, 5, 100, 0.5, 12.5, '0:00:19', ''))"
"""

import math
import re
import sys

# SageMaker's metric definitions: name → the expression whose first group is the value, in the lines below
METRICS = {
    "train:loss": r"train/loss=([0-9.]+)",
    "train:images_per_second": r"images/s=([0-9.]+)",
    "validation:loss": r"val/loss=([0-9.]+)",
    "validation:accuracy": r"val/acc=([0-9.]+)",
    "hosts:slowest_ratio": r"hosts: slowest \S+ ([0-9.]+)x",  # the slowest host's own time per step / the median's
    "job:goodput_percent": r"goodput ([0-9.]+) %: training",  # training's share of the job's wall time, at its end
}


def metric(logged: str) -> tuple[str, str]:
    """The definition (name, expression) of a metric the project logs as `val/<name>` (self.log("val/f1", ...)): the
    validation line prints it, e.g. "val/f1" → ("validation:f1", r"val/f1=(-?[0-9.]+)")."""
    if not re.fullmatch(r"val/[\w./-]+", logged):
        raise ValueError(
            f"{logged!r} is not a metric the validation line prints; log it as val/<name> (self.log('val/f1', f1)), "
            "or give a whole definition as NAME=REGEX"
        )
    return "validation:" + logged[len("val/") :], re.escape(logged) + "=(-?[0-9.]+)"


def objective_regex(name: str) -> str | None:
    """The expression a tuning job's objective `name` is read with, where the runtime prints it: one of METRICS, or
    validation:<name> for a val/<name> the project logs (metric); None for any other name."""
    if name in METRICS:
        return METRICS[name]
    try:
        return metric("val/" + name[len("validation:") :])[1] if name.startswith("validation:") else None
    except ValueError:
        return None


def objective(name: str) -> str:
    """Global rank 0's line at a tuning job's child's start: the metric its tuner ranks, and where it reads it; or, for
    a name the runtime prints nowhere, that warning."""
    if (regex := objective_regex(name)) is None:
        return (
            f"warning: tuning objective {name} is not a metric this job prints (the runtime's: {', '.join(METRICS)}, "
            "and validation:<name> for each val/<name> the project logs); the tuner ranks this child only if a "
            "metric definition of the job's own (run_sagemaker.py --metric NAME=REGEX) reads lines the project prints"
        )
    where = "the validation line (once an epoch)" if name.startswith("validation:") else "the progress lines"
    return f"tuning objective: {name}, read from {where} of global rank 0 with {regex}"


def unprinted(name: str, line: str) -> str | None:
    """The warning when the first validation line (`line`) has no value for a validation objective `name`; None
    when it has one, or when `name` is not read from that line."""
    regex = objective_regex(name)
    if not name.startswith("validation:") or regex is None or re.search(regex, line):
        return None
    return (
        f"warning: tuning objective {name} is not a metric this job prints: {regex} finds nothing in the first "
        f"validation line ({line}); log the metric it reads in validation_step (self.log), or tune on one of the line's"
    )


def say(line: str) -> None:
    """One write per line: ranks share one stdout, and print() writes the newline separately, so lines of
    different ranks would interleave when stdout is unbuffered (PYTHONUNBUFFERED, as in the image)."""
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def saved(epoch: int, step: int) -> str:
    """The line of a last.ckpt that is complete (said once its file is there: checkpoints/writer.py)."""
    return f"saved last.ckpt at epoch {epoch} step {step}"


def behind(path: str, write_s: float, interval_s: float, waited_s: float, steps: int | None, setting: str) -> str:
    """The line said once when a save waits for the write before it (checkpoints/writer.py): saves asked for more often
    than they are written; the interval suggested leaves the write a fifth more than this one's time, room for a
    slower one."""
    apart = f"{interval_s:.1f} s ({steps} step{'s' * (steps != 1)})" if steps else f"{interval_s:.1f} s"
    fix = f"{setting}={math.ceil(steps * write_s / interval_s * 1.2)} or more" if steps else setting
    return (
        f"checkpoints are asked for faster than they are written: writing {path} took {write_s:.1f} s, and saves "
        f"come {apart} apart, so this one waited {waited_s:.1f} s for it (the training's checkpoint stall in goodput; "
        f"each save that follows waits as long); save less often: {fix}"
    )


def progress(
    epoch: int, step: int, total, loss: float | None, per_s: float, eta, spread: str, counted: str = "images"
) -> str:
    """A training progress line; `loss`: None leaves train/loss out (a step that returned none); `counted`: what
    `per_s` counts, "images" or "batches" (a batch with no tensor); `spread`: the hosts' words (spread), '' without
    them."""
    shown = f"train/loss={loss:.4f} " if loss is not None else ""
    return f"epoch {epoch} step {step}/{total}: {shown}{counted}/s={per_s:.1f} eta={eta}{spread}"


def spread(found: tuple[str, float] | None) -> str:
    """The progress line's words on the hosts' spread: the slowest host and its time per step over the median host's
    (stragglers.spread), '' without one."""
    return f" hosts: slowest {found[0]} {found[1]:.2f}x the median" if found else ""


def validation(epoch: int, step: int, metrics: dict[str, float]) -> str:
    """Rank 0's line after each validation: the `val/` metrics, sorted by name."""
    shown = " ".join(f"{k}={v:.4f}" for k, v in sorted(metrics.items()) if k.startswith("val/"))
    return f"epoch {epoch} step {step}: {shown}"


def duration(seconds: float) -> str:
    """`seconds` as a line says it: 0.4 s, 41 s, 2m10s, 1h02m."""
    if seconds < 10:
        return f"{seconds:.1f} s"
    if seconds < 60:
        return f"{seconds:.0f} s"
    minutes = int(seconds // 60)
    return f"{minutes}m{int(seconds % 60):02d}s" if minutes < 60 else f"{minutes // 60}h{minutes % 60:02d}m"


def percent(wall: float, seconds: dict) -> float:
    """Training's share of the wall time, in percent."""
    return 100.0 * seconds["training"] / wall if wall > 0 else 0.0


def goodput(wall: float, seconds: dict, steps_again: int) -> str:
    """The goodput line (goodput.py): training's share of the wall time, then where the rest went."""
    rest = ", ".join(
        f"{term} {steps_again} ({duration(s)})" if term == "steps trained again" else f"{term} {duration(s)}"
        for term, s in seconds.items()
        if term != "training"
    )
    return f"goodput {percent(wall, seconds):.1f} %: training {duration(seconds['training'])}; {rest}"
