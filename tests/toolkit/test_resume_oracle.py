"""Exact resume, proved by sweeping (tests/plugins/oracle/): a small job is interrupted at every boundary by every
interruption, resumed to its end, and the chain held to the uninterrupted run's record (each step's ids and loss on
each rank, each id once an epoch, the final weights: torch.equal); a SIGTERM loses no step, stops at the first step
the ranks agree at after its signal and lets no epoch start after it; where a resume cannot be exact, one true line
says so. The matrix: docs/resume-matrix.md. Then the oracle against four defects put into the runtime: it fails each.

    .venv/bin/pytest tests/toolkit/test_resume_oracle.py -k "epoch-end-hooks and sigterm-one"
"""

import os
import re

import pytest
import torch
from oracle import cases, checks, runs
from oracle.project import IDS, VAL_IDS

import make_dataset

pytestmark = pytest.mark.toolkit


@pytest.fixture(scope="module")
def oracle(tmp_path_factory, free_port):
    """A runner, each pipeline, and a function that gives a case's uninterrupted run (once per pipeline and topology)."""
    folder = tmp_path_factory.mktemp("oracle-data")
    archive = make_dataset.synthetic(str(folder / "cifar"), train=IDS, test=VAL_IDS, seed=0)
    pipelines = cases.pipelines(os.path.dirname(archive), runs.streamed_ids(str(folder / "streamed")))
    runner, done = runs.Runner(free_port), {}

    def uninterrupted(case: cases.Case) -> tuple[runs.Attempt, list[dict]]:
        if (case.pipeline, case.topology) not in done:
            workdir = str(tmp_path_factory.mktemp("uninterrupted"))
            run = runs.Run(workdir, case.world, case.topology, free_port(), pipelines[case.pipeline], cases.SLOW)
            ran = runs.attempt(runner, run, 0)
            assert ran.codes == [0] * case.world, f"the uninterrupted run failed: {ran.codes}\n{ran.log[-4000:]}"
            weights = [
                torch.load(os.path.join(workdir, f"weights-{r}.pt"), weights_only=True) for r in range(case.world)
            ]
            done[case.pipeline, case.topology] = ran, weights
        return done[case.pipeline, case.topology]

    return runner, pipelines, uninterrupted


@pytest.mark.parametrize("case", cases.cases(), ids=lambda case: case.id)
def test_an_interrupted_job_resumes_exactly(oracle, case, tmp_path):
    runner, pipelines, uninterrupted = oracle
    expected, weights = uninterrupted(case)
    attempts = runs.chain(runner, case, str(tmp_path), pipelines[case.pipeline])
    found = checks.problems(case, expected, weights, attempts, str(tmp_path))
    assert not found, "\n".join(found)


MUTANTS = [  # a defect put into the runtime (oracle/rank.py's MUTATIONS), a case it breaks, what the oracle says (a
    # pattern one of its problems matches whole)
    ("late-count", cases.Case("epoch-start-hooks", "sigterm-one"), "step 7 was never trained on rank 0"),
    (
        "no-epoch-end-agreement",
        cases.Case("epoch-end-hooks", "sigterm-one"),
        "run 0 started epoch 1 on rank 1 after the signal",
    ),
    ("seeded-not-restored", cases.Case("step-end", "sigterm-one"), r"step \d+ on rank 0: loss \S+, not \S+"),
    ("validation-draws-leak", cases.Case("val-middle-mid", "sigterm-one"), r"step \d+ on rank 0: loss \S+, not \S+"),
]


@pytest.mark.parametrize("mutation, case, said", MUTANTS, ids=[m[0] for m in MUTANTS])
def test_the_oracle_fails_a_runtime_with_a_known_defect(oracle, mutation, case, said, tmp_path):
    """The loader's count reset one step late (the stop agreed at the next epoch's first step then saves the epoch
    before's count: that epoch is skipped), no agreement after an epoch's end hooks, a resumed run that seeds its
    generators instead of setting back the checkpoint's (its steps' dropout differs), or a validation that draws from
    training's generators (a save inside it holds a state the uninterrupted run never trains on): the oracle fails
    each."""
    runner, pipelines, uninterrupted = oracle
    expected, weights = uninterrupted(case)
    attempts = runs.chain(runner, case, str(tmp_path), pipelines[case.pipeline], mutation)
    found = checks.problems(case, expected, weights, attempts, str(tmp_path))
    assert any(re.fullmatch(said, problem) for problem in found), found
