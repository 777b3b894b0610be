"""The checkpoint benchmark's pure parts (the state's size, the figures as text), that a background save writes the
state as it was when the save was asked for, saves at a cadence timed each with its own write, and a smoke run of its
snapshot section."""

import math
import re

import pytest
import torch

import bench_checkpoint
from checkpoint_bench import cadence, local, report, s3, state

pytestmark = pytest.mark.unit


def test_the_state_is_sized_by_its_parameters():
    assert state.layout(25e6) == (2048, 6)  # the project: 25.2M parameters, about 300 MB with Adam's moments
    assert state.parameters(2048, 6) == 25_178_112
    assert state.layout(1e9) == (2048, 238)
    assert state.layout(2e5) == (447, 1)  # smaller than one wide layer: narrower, not zero layers
    tree = state.checkpoint(state.model(2e5))
    params = state.parameters(447, 1)
    assert state.nbytes(tree) == 3 * 4 * params + 4 * 2  # weights, two moments, Adam's step count per tensor


def test_figures_are_fastest_and_median_of_the_runs_that_have_one():
    assert report.spread([3.0, 1.0, 2.0]) == (1.0, 2.0)
    assert report.spread([math.nan, 4.0, 2.0]) == (2.0, 3.0)
    assert all(math.isnan(v) for v in report.spread([math.nan]))
    assert report.seconds([0.5124, 0.61, 0.7]) == "0.512/0.610"
    assert report.seconds([math.nan]) == "-"
    assert report.rate(300_000_000, 2.0) == 150.0
    assert report.ratio(1.0, 4.0) == "0.25x" and report.ratio(math.nan, 1.0) == "-"


def test_tables_align_their_columns_and_the_summary_parses():
    text = report.table(["way", "s"], [["sync", "0.512/0.530"], ["a longer way", "1.2"]])
    lines = text.splitlines()
    assert lines == [
        "way                     s",
        "------------  -----------",
        "sync          0.512/0.530",
        "a longer way          1.2",
    ]
    line = report.summary({"sync_stall_s": 0.5124, "thread_stall_s": math.nan})
    assert line == "bench-checkpoint: sync_stall_s=0.512 thread_stall_s=nan"


def test_an_s3_url_names_a_bucket_and_a_prefix():
    assert s3.parse("s3://my-bucket/bench/runs/").url("last.ckpt") == "s3://my-bucket/bench/runs/last.ckpt"
    assert s3.parse("s3://my-bucket").url("last.ckpt") == "s3://my-bucket/last.ckpt"
    assert s3.parse("s3://my-bucket/bench").key("raw.ckpt") == "bench/raw.ckpt"
    assert s3.parse("s3://my-bucket/").endpoint is None  # AWS's own endpoint


class AfterAStep:
    """A writer that writes what it was handed once the training loop asks whether it is done, after a step: what a
    slow write sees."""

    def submit(self, tree, path: str) -> None:
        self.tree, self.path = tree, path

    def done(self) -> bool:
        self.write_s = local.write_file(self.tree, self.path)
        return True


@pytest.mark.parametrize("snapshot", ["reused buffers", "clone"])
def test_a_background_save_writes_the_state_as_it_was_asked_for(tmp_path, snapshot):
    """The snapshot is a copy: a training step that changes the weights after the save returns does not reach the
    file, however late the writer writes."""
    tree = state.checkpoint(state.model(2e4))
    snapshot_of = state.Snapshot(tree).take if snapshot == "reused buffers" else state.cloned
    asked = {}

    def take(tree):  # the state when the save is asked for, recorded beside the snapshot under test
        asked.update({k: v.clone() for k, v in tree["state_dict"].items()})
        return snapshot_of(tree)

    trainer = state.Trainer()
    original_step = trainer.step

    def step():  # a training step that also changes the saved model in place, as an optimizer step would
        original_step()
        with torch.no_grad():
            for t in tree["state_dict"].values():
                t.add_(1.0)

    trainer.step = step
    path = str(tmp_path / "last.ckpt")
    figures = local.background_save(tree, trainer, path, take, AfterAStep())
    assert figures["steps"] == 1 and figures["stall_s"] >= 0 and figures["write_s"] > 0
    saved = torch.load(path, weights_only=True)
    assert all(torch.equal(saved["state_dict"][k], asked[k]) for k in asked)
    assert not any(torch.equal(tree["state_dict"][k], asked[k]) for k in asked)  # the step did change them
    assert not list(tmp_path.glob(".*partial"))  # renamed when complete


def test_the_writer_thread_writes_the_file_whole(tmp_path):
    tree = state.checkpoint(state.model(2e4))
    path = str(tmp_path / "last.ckpt")
    figures = local.background_save(tree, state.Trainer(), path, state.Snapshot(tree).take, local.ThreadWriter())
    assert figures["steps"] >= 1 and figures["write_s"] > 0
    saved = torch.load(path, weights_only=True)
    assert all(torch.equal(saved["state_dict"][k], v) for k, v in tree["state_dict"].items())


def test_saves_at_a_cadence_time_each_save_and_its_own_write(tmp_path):
    tree = state.checkpoint(state.model(2e4))
    run = cadence.saves(tree, state.Trainer(), str(tmp_path / "last.ckpt"), every=2, count=2)
    assert len(run["stall_s"]) == len(run["write_s"]) == 2 and all(s > 0 for s in run["write_s"]) and run["loop_s"] > 0
    assert run["said"] == [] and torch.load(tmp_path / "last.ckpt", weights_only=True)["global_step"] == 5


def test_quick_snapshot_run_prints_hardware_versions_a_table_and_the_summary(capsys):
    assert bench_checkpoint.main(["--quick", "--only", "snapshot"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("date: ") and "cores" in out[0]
    assert out[1].startswith("versions: python ") and f"torch {torch.__version__}" in out[1]
    assert any(re.match(r"^copy into reused buffers +\d+\.\d{3}/\d+\.\d{3} +\d+$", line) for line in out)
    assert re.match(r"^bench-checkpoint: snapshot_s=\d+\.\d{3}$", out[-1])


@pytest.mark.parametrize(
    "words", [["--params", "0"], ["--repeat", "0"], ["--folder", "/no/such/folder"], ["--s3-url", "bucket/prefix"]]
)
def test_bad_options_end_in_one_error_line(words):
    with pytest.raises(SystemExit) as ended:
        bench_checkpoint.options(words)
    assert str(ended.value).startswith("error: ") and "\n" not in str(ended.value)
