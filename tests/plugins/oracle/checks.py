"""The oracle's judgement of a chain of runs against the uninterrupted run (`problems`): each promise it breaks, in
one line. The steps that count are each run's from where it said it resumed to where the next one resumed.

    .venv/bin/python -c "from oracle import checks; help(checks.problems)"
"""

import collections
import os
import re

import torch

from oracle.cases import INTERRUPTIONS, NOT_RESUMABLE, Case
from oracle.runs import Attempt

# training_loader.restarted's line: a loader that cannot resume mid-epoch starts the epoch again
RESTARTED = re.compile(r"resumed epoch (\d+) at batch (\d+), but the training loader .* cannot resume mid-epoch")
# resumable.continued's line: a resume with another batch or world size
RESHAPED = re.compile(r"resumed epoch (\d+) with .*: the epoch (continues exactly|restarts) at sample (\d+)")


def problems(case: Case, expected: Attempt, weights: list[dict], attempts: list[Attempt], workdir: str) -> list[str]:
    """Each promise the chain breaks (an empty list: it kept them all). `expected`, `weights`: the uninterrupted run
    and each rank's final weights (fsdp: its shards)."""
    interruption, last = INTERRUPTIONS[case.interruption], attempts[-1]
    if last.codes != [0] * len(last.codes):
        return [f"the chain's last run ended with exit codes {last.codes}: {last.log[-4000:]}"]
    found = []
    for k, run in enumerate(attempts[:-1]):
        if (set(run.codes) != {143}) if interruption.sigterm else (0 in run.codes):
            found.append(f"run {k} ended with exit codes {run.codes}, for {interruption.what}")
    if case.reshape:
        return found + reshape_problems(expected, attempts, case.world)
    restarts = [(k, int(m[1]), int(m[2])) for k, run in enumerate(attempts) if (m := RESTARTED.search(run.log))]
    if restarts and case.pipeline not in NOT_RESUMABLE:
        found.append(f"runs {[k for k, _, _ in restarts]} said the loader starts its epoch again")
    for rank in range(case.world):
        if restarts:  # the steps shift from there: each epoch's ids, trained again only where a line says
            found += restart_problems(expected.steps(rank), attempts, rank, restarts)
            continue
        found += trained_problems(expected.steps(rank), attempts, rank, interruption.sigterm)
        final = torch.load(os.path.join(workdir, f"weights-{rank}.pt"), weights_only=True)
        if final.keys() != weights[rank].keys() or not all(torch.equal(final[k], weights[rank][k]) for k in final):
            found.append(f"rank {rank}'s final weights are not the uninterrupted run's")
    if not restarts:  # else the validations shift with the steps
        found += validation_problems(expected, attempts, interruption.sigterm)
    if interruption.sigterm:
        found += stop_problems(case, attempts)
    if partial := [n for n in os.listdir(os.path.join(workdir, "checkpoints")) if n.endswith(".partial")]:
        found.append(f"partial files left in the checkpoint directory: {partial}")
    return found


def kept_steps(attempts: list[Attempt], rank: int) -> dict[int, dict]:
    """The steps of the chain that count on `rank`: each run's from where it resumed to where the next resumed."""
    kept = {}
    for k, run in enumerate(attempts):
        end = attempts[k + 1].resumed_at if k + 1 < len(attempts) else None
        kept.update({step: r for step, r in run.steps(rank).items() if end is None or step < end})
    return kept


def trained_problems(expected: dict, attempts: list[Attempt], rank: int, sigterm: bool) -> list[str]:
    """The steps that count are the uninterrupted run's, ids and loss, each id once an epoch; each run trains from the
    step it said it resumed at; after a SIGTERM nothing is trained again."""
    found, kept = [], kept_steps(attempts, rank)
    for k, run in enumerate(attempts):
        steps = sorted(run.steps(rank))
        if steps and steps[0] != run.resumed_at:
            found.append(
                f"run {k} said it resumed at step {run.resumed_at}, but rank {rank} trained step {steps[0]} first"
            )
        if sigterm and k + 1 < len(attempts) and steps and steps[-1] >= attempts[k + 1].resumed_at:
            found.append(f"run {k} trained step {steps[-1]} on rank {rank}, and the stop's save did not keep it")
    found += [f"step {s} was never trained on rank {rank}" for s in sorted(expected.keys() - kept.keys())]
    found += [
        f"step {s} was trained on rank {rank} beyond the uninterrupted run"
        for s in sorted(kept.keys() - expected.keys())
    ]
    for step in sorted(expected.keys() & kept.keys()):
        a, b = kept[step], expected[step]
        if (a["epoch"], a["ids"]) != (b["epoch"], b["ids"]):
            found.append(
                f"step {step} on rank {rank} trained ids {a['ids']} of epoch {a['epoch']}, not {b['ids']} of {b['epoch']}"
            )
        elif a["loss"] != b["loss"]:
            found.append(f"step {step} on rank {rank}: loss {a['loss']!r}, not {b['loss']!r}")
    epochs = collections.defaultdict(collections.Counter)
    for record in kept.values():
        epochs[record["epoch"]].update(record["ids"])
    for epoch, ids in sorted(epochs.items()):
        if twice := sorted(i for i, n in ids.items() if n > 1):
            found.append(f"epoch {epoch} trained ids {twice} more than once on rank {rank}")
    return found


def restart_problems(expected: dict, attempts: list[Attempt], rank: int, restarts: list) -> list[str]:
    """A loader that cannot resume mid-epoch (the runtime said so: RESTARTED): each epoch trains all its ids, and the
    ids the lines name as trained again (the restarted epoch's first batches, trained after the line) are exactly
    those trained twice: a line not said, or said where nothing is trained again, fails."""
    found, epochs, wanted = [], collections.defaultdict(collections.Counter), collections.defaultdict(set)
    for record in kept_steps(attempts, rank).values():
        epochs[record["epoch"]].update(record["ids"])
    for record in expected.values():
        wanted[record["epoch"]].update(record["ids"])
    named = collections.defaultdict(list)  # epoch → the ids of its first batches trained after the line
    kept = kept_steps(attempts, rank)
    for k, epoch, batches in restarts:
        after = [r for step, r in sorted(kept.items()) if step >= attempts[k].resumed_at and r["epoch"] == epoch]
        named[epoch] += sorted(i for r in after[:batches] for i in r["ids"])
    for epoch, ids in sorted(wanted.items()):
        if missing := sorted(ids - epochs[epoch].keys()):
            found.append(f"epoch {epoch} never trained ids {missing} on rank {rank}")
        twice = sorted(i for i, n in epochs[epoch].items() for _ in range(n - 1))
        if twice != named[epoch]:
            found.append(f"epoch {epoch} trained ids {twice} again on rank {rank}; the line named {named[epoch]}")
    return found


def reshape_problems(expected: Attempt, attempts: list[Attempt], world: int) -> list[str]:
    """A resume with another shape (RESHAPED's line): every id of every epoch trained, and trained twice exactly the
    samples the line names: none where it says the epoch continues exactly at the samples done, else those from the
    sample it restarts at to the samples done, in the epoch's order (the interrupted run's, every rank's)."""
    first, resumed = attempts[0], attempts[1]
    said = RESHAPED.search(resumed.log)
    if not said:
        return ["the resume with another shape was not said"]
    epoch, exactly, at = int(said[1]), said[2] == "continues exactly", int(said[3])
    order = {}  # position in the epoch's order → id, as DistributedSampler deals it: batch after batch, rank by rank
    for r in range(world):
        steps = [
            rec for step, rec in sorted(first.steps(r).items()) if rec["epoch"] == epoch and step < resumed.resumed_at
        ]
        for j, rec in enumerate(steps):
            for i, sample in enumerate(rec["ids"]):
                order[(j * len(rec["ids"]) + i) * world + r] = sample
    done, trained = len(order), collections.defaultdict(collections.Counter)
    for k, run in enumerate(attempts):
        end = attempts[k + 1].resumed_at if k + 1 < len(attempts) else None
        for r in range(len(run.records)):
            for step, rec in run.steps(r).items():
                if end is None or step < end:
                    trained[rec["epoch"]].update(rec["ids"])
    found = []
    if exactly != (at == done):
        found.append(f"the line says the epoch {said[2]} at sample {at}, with {done} samples done")
    named = sorted(order[p] for p in range(at, done))
    for e in sorted({rec["epoch"] for r in range(world) for rec in expected.steps(r).values()}):
        ids = {i for r in range(world) for rec in expected.steps(r).values() if rec["epoch"] == e for i in rec["ids"]}
        if missing := sorted(ids - trained[e].keys()):
            found.append(f"epoch {e} never trained ids {missing}")
        twice = sorted(i for i, n in trained[e].items() for _ in range(n - 1))
        if twice != (named if e == epoch else []):
            found.append(f"epoch {e} trained ids {twice} twice; the line named {named if e == epoch else []}")
    return found


def stop_problems(case: Case, attempts: list[Attempt]) -> list[str]:
    """A SIGTERM's promises: it stops at the first step the ranks agree at after the signal (slow steps: each step
    agrees, so no step after the one it came in; fast steps: at the next validation's or epoch's end at the latest),
    and no epoch starts after it."""
    found = []
    for k, run in enumerate(attempts[:-1]):
        sent = [r for records in run.records for r in records if "signal" in r]
        if not sent:
            found.append(f"run {k} was never signalled")
            continue
        at = min(s["step"] + s["in_step"] for s in sent)
        saved, late = attempts[k + 1].resumed_at, (0 if case.pace == "slow" else 2)
        if case.boundary != "save-in-flight" and not at <= saved <= at + late:  # the writer thread's step: racy
            found.append(f"run {k} was signalled at step {at} and stopped at step {saved}")
        for rank, records in enumerate(run.records):
            after = next((i for i, r in enumerate(records) if "signal" in r), len(records))
            if started := [r["epoch start"] for r in records[after:] if "epoch start" in r]:
                found.append(f"run {k} started epoch {started[0]} on rank {rank} after the signal")
    return found


def validation_problems(expected: Attempt, attempts: list[Attempt], sigterm: bool) -> list[str]:
    """Every validation of the uninterrupted run completes in the chain (its metrics, the best checkpoint's choice, a
    tuning job's objective line), after a SIGTERM once, one the stop cut short again in the resumed run."""
    wanted = [r["validated"] for r in expected.records[0] if "validated" in r]
    ran = [r["validated"] for run in attempts for r in run.records[0] if "validated" in r]
    if ran == wanted or not sigterm and set(ran) >= set(wanted):
        return []
    return [f"validations completed at steps {ran}, not {wanted}"]
