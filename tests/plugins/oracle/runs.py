"""Running the oracle's job: every rank of every run a real process, forked from one server that imported torch,
Lightning and the runtime once (preloaded.py); a case's chain of runs on one job's folders, and what each run left
(Attempt).

    .venv/bin/python -c "from oracle import runs; help(runs.chain)"
"""

import dataclasses
import json
import os
import re
import signal
import time

import preloaded

from oracle import rank
from oracle.cases import AGAIN, INTERRUPTIONS, PACES, RESHAPES, TOPOLOGIES, Case
from oracle.project import IDS
from oracle.rank import Pipeline, Run

RESUMED = re.compile(r"resuming at epoch \d+ step (\d+) from ")  # checkpoints/last.py's line
RUN_TIMEOUT_S = 120  # one run of the job: a hang fails its case


class Runner:
    """Starts a run's ranks from the fork server and waits for them."""

    def __init__(self, ports):
        self.ports = ports  # a function returning a free TCP port
        self.context = preloaded.context()  # oracle.rank imported once: a run costs about a second, not seven

    def run(self, run: Run) -> list[int]:
        """Each rank's exit code; a rank still running after RUN_TIMEOUT_S is a hang, which fails the case."""
        procs = [self.context.Process(target=rank.rank_main, args=(r, run)) for r in range(run.world)]
        for p in procs:
            p.start()
        with open(os.path.join(run.workdir, "pids"), "w") as f:  # "SIGKILL all" kills these
            f.write(" ".join(str(p.pid) for p in procs))
        deadline = time.monotonic() + RUN_TIMEOUT_S
        for p in procs:
            p.join(max(0.0, deadline - time.monotonic()))
        hung = [p for p in procs if p.exitcode is None]
        for p in procs:  # each rank's process group: the DataLoader workers a SIGKILL leaves behind
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        for p in hung:
            p.join()
        assert not hung, f"a run hung for {RUN_TIMEOUT_S} s: {run}\n{logs(run.workdir)[-6000:]}"
        return [p.exitcode for p in procs]


def logs(workdir: str) -> str:
    names = sorted(n for n in os.listdir(workdir) if n.startswith("log-"))
    return "\n".join(open(os.path.join(workdir, n), errors="replace").read() for n in names)


@dataclasses.dataclass
class Attempt:
    """What one run left: each rank's exit code and records, the step rank 0 said it resumed at, its ranks' logs."""

    codes: list[int]
    records: list[list[dict]]
    resumed_at: int
    log: str

    def steps(self, rank: int) -> dict[int, dict]:
        return {r["step"]: r for r in self.records[rank] if "ids" in r} if rank < len(self.records) else {}


def attempt(runner: Runner, run: Run, index: int) -> Attempt:
    """Run `run`, then read what it left (its files renamed with `index`, kept for a failure's reading)."""
    codes, records, texts = runner.run(run), [], []
    for r in range(run.world):
        path, log = (os.path.join(run.workdir, name) for name in (f"records-{r}.jsonl", f"log-{r}"))
        with open(path) if os.path.exists(path) else open(os.devnull) as f:
            records.append([json.loads(line) for line in f if line.endswith("\n")])  # a killed write: half a line
        with open(log, errors="replace") as f:
            texts.append(f.read())
        for name in (n for n in (path, log) if os.path.exists(n)):
            os.rename(name, f"{name}.{index}")
    found = RESUMED.search(texts[0])
    return Attempt(codes, records, int(found[1]) if found else 0, "\n".join(texts))


def chain(runner: Runner, case: Case, workdir: str, pipeline: Pipeline, mutation: str | None = None) -> list[Attempt]:
    """The case's runs of one job: interrupted, (interrupted again,) then to its end, the runs after the first in
    the case's reshape."""
    faults = [case.faults()]
    if INTERRUPTIONS[case.interruption].again:
        faults.append(tuple((r, AGAIN) for r in range(case.world)))
    _, args, topology = RESHAPES[case.reshape] if case.reshape else (None, (), None)
    resumed = dataclasses.replace(pipeline, args=(*pipeline.args, *args))
    topology = topology or case.topology
    runs = [Run(workdir, case.world, case.topology, runner.ports(), pipeline, PACES[case.pace], faults[0], mutation)]
    for fault in (*faults[1:], ()):
        world = TOPOLOGIES[topology]
        runs.append(Run(workdir, world, topology, runner.ports(), resumed, PACES[case.pace], fault, mutation))
    done = []
    for index, run in enumerate(runs):
        done.append(attempt(runner, run, index))
    return done


def streamed_ids(out: str) -> str:
    """The training ids as litdata's optimize() writes a dataset, in a local folder."""
    import litdata

    litdata.optimize(fn=_sample, inputs=list(range(IDS)), output_dir=out, chunk_bytes="1KB", num_workers=1)
    return out


def _sample(i: int) -> dict:
    return {"id": i}
