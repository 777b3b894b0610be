"""Streamed data never runs code (sagemaker_lightning/data/decoders.py): litdata decodes each field with the decoder
index.json names, and only those that cannot run code are read. The issue's case: a dataset made with
litdata.optimize whose items carry one more field, an object whose unpickling writes a marker file
(tests/plugins/planted_data.py). It is refused in
one line naming the field and the format, by check_source (a channel's directory; an s3:// prefix in
tests/cloud/test_streaming_s3.py), by the runtime's check of the training loader, in a job; and the marker is never
written. A project admits a decoder by the setting streaming.trusted_formats.

    .venv/bin/pytest -q tests/unit/data/test_decoders.py
"""

import gc
import json
import os
import pathlib

import lightning.pytorch as pl
import pytest
import torch
from litdata import StreamingDataLoader, StreamingDataset
from litdata.streaming.serializers import _SERIALIZERS
from planted_data import optimized

from sagemaker_lightning import LightningCLI, UserError, check_source, failure
from sagemaker_lightning.boot import signals
from sagemaker_lightning.data import decoders, streaming
from sagemaker_lightning.data.streaming import prepared

pytestmark = pytest.mark.unit


@pytest.fixture(scope="module")
def planted(tmp_path_factory):
    """(the planted dataset's directory, the marker its unpickling would write)."""
    marker = str(tmp_path_factory.mktemp("marker") / "ran")
    folder = optimized(tmp_path_factory.mktemp("planted"), marker)
    assert not os.path.exists(marker)  # writing it ran nothing
    return folder, marker


@pytest.fixture(scope="module")
def clean(tmp_path_factory) -> str:
    return optimized(tmp_path_factory.mktemp("clean"), None)


@pytest.fixture(autouse=True)
def nothing_trusted(monkeypatch):
    monkeypatch.delenv(decoders.VARIABLE, raising=False)


@pytest.mark.parametrize(
    "data_format, decoder, read",
    [
        ("int", "int", True),
        ("numpy", "numpy", True),  # the example's image: a uint8 array of H×W×3
        ("no_header_numpy:3", "no_header_numpy", True),  # a 1-D array, its dtype's number after the colon
        ("image:png", "image", True),
        ("file:jpg", "file", True),  # its decoder returns the bytes
        ("numpy:pickle", "pickle", False),  # litdata takes the part after the colon where it names a decoder
        ("file:pickle", "pickle", False),
        ("graph:pickle", "pickle", False),
        ("pickle", "pickle", False),
        ("graph", "graph", False),  # its metadata is always unpickled
        ("video:mp4", "video", False),
        ("mesh:glb", "mesh", False),
        ("my_codec", "my_codec", False),  # no decoder of litdata's: a project's own, or none
        ("a:b:c", "'a:b:c'", False),  # litdata cannot split it
    ],
)
def test_each_format_is_read_by_the_decoder_litdata_picks_and_only_those_that_run_no_code(data_format, decoder, read):
    assert decoders.decoder(data_format, _SERIALIZERS) == decoder
    config = {"data_format": ["int", data_format], "data_spec": None}
    assert decoders.refused(config, _SERIALIZERS, frozenset()) == ([] if read else [("#1", data_format, decoder)])
    assert decoders.refused(config, _SERIALIZERS, frozenset({decoder})) == []  # the project's setting admits it


def test_every_decoder_of_litdata_is_either_read_or_refused_with_its_reason():
    """A litdata that adds a decoder fails here until it is read and placed (decoders.py)."""
    assert set(_SERIALIZERS) == decoders.ADMITTED | (set(decoders.REFUSED) - {"parquet"})
    assert not decoders.ADMITTED & set(decoders.REFUSED)


def test_the_examples_items_are_numbers_and_arrays_named_by_their_keys(clean):
    config = decoders.read_index(clean)
    assert decoders.fields(config) == [("id", "int"), ("image", "numpy"), ("label", "int")]
    check_source(clean)


def test_the_issues_case_is_refused_in_one_line_naming_the_field_and_runs_nothing(planted):
    folder, marker = planted
    line = f"{folder} holds data that could run code when read, refused unread: field 'extra' is stored as 'pickle'"
    with pytest.raises(UserError) as raised:
        check_source(folder)  # what the example's data module calls for each split
    assert str(raised.value) == (  # whole: every part said once, none empty (a review saw "...chose); ;")
        f"{line} (read by pickle.loads, which runs any code the data's writer chose); only numbers, arrays, text and "
        "images are read (scripts/upload_data.py --format litdata writes those); or, where no one else can write "
        f"{folder}, admit it with {decoders.SETTING}=[pickle]"
    )
    loader = StreamingDataLoader(StreamingDataset(folder), batch_size=4)
    with pytest.raises(UserError, match=f"^{line}"):
        streaming.check(loader, 0, 1, None)  # the runtime's check of the training loader, in a job
    assert not os.path.exists(marker)


@pytest.mark.parametrize("workers", [0, 1])
def test_an_index_changed_after_the_check_is_refused_by_the_next_reader(planted, tmp_path, monkeypatch, workers):
    """litdata reads index.json again for each reader (each DataLoader worker, each epoch): one that named bytes at the
    check and pickle afterwards is refused when the loader is iterated, not decoded; from a worker too, in one line
    (failure.py takes it out of torch's wrapping)."""
    folder, marker = planted
    copy = tmp_path / "data"
    copy.mkdir()
    for name in os.listdir(folder):
        (copy / name).write_bytes((pathlib.Path(folder) / name).read_bytes())
    index = json.loads((copy / "index.json").read_text())
    assert index["config"]["data_format"][-1] == "pickle"
    honest = json.dumps(index)
    index["config"]["data_format"][-1] = "bytes"
    (copy / "index.json").write_text(json.dumps(index))
    loader = prepared(StreamingDataLoader(StreamingDataset(str(copy)), batch_size=4, num_workers=workers))
    streaming.check(loader, 0, 1, None)  # bytes: read
    (copy / "index.json").write_text(honest)
    with pytest.raises(UserError) as raised:
        next(iter(loader))
    line = failure.explain(raised.value, stage="train")[0]
    assert line.startswith(f"{copy} holds data that could run code when read, refused unread: field 'extra'"), line
    assert "\n" not in line and not os.path.exists(marker)
    # the loader's worker, which outlives the refusal, stopped now: torch waits MP_STATUS_CHECK_INTERVAL (5 s) for it
    # to end, then ends it, when the collector frees the iterator (held by the traceback's frames): 5 s of a teardown
    monkeypatch.setattr(torch.utils.data._utils, "MP_STATUS_CHECK_INTERVAL", 0.1)
    del raised
    gc.collect()


class Labels(pl.LightningModule):
    def __init__(self):
        super().__init__()
        self.net = torch.nn.Linear(1, 2)

    def training_step(self, batch, batch_idx):
        return torch.nn.functional.cross_entropy(self.net(batch["id"].float()[:, None]), batch["label"])

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


class Streamed(pl.LightningDataModule):
    """A project's own data module: litdata's loader, no check_source."""

    def __init__(self, data_dir: str = ""):
        super().__init__()
        self.data_dir = data_dir

    def train_dataloader(self):
        return StreamingDataLoader(StreamingDataset(self.data_dir), batch_size=4)


@pytest.fixture
def on_sagemaker(tmp_path, monkeypatch):
    job = {"SM_HOSTS": '["localhost"]', "SM_CURRENT_HOST": "localhost", "SM_NUM_GPUS": "0"}
    monkeypatch.setattr(os, "environ", {**os.environ, **job, "SM_OUTPUT_DIR": str(tmp_path)})
    monkeypatch.setattr(signals, "RUN_DIR", str(tmp_path / "run"))


def fit(folder, tmp_path, *more):
    args = ["fit", f"--data.data_dir={folder}", "--trainer.max_steps=2", "--trainer.accelerator=cpu"]
    args += [f"--checkpoint.dirpath={tmp_path / 'checkpoints'}", f"--trainer.default_root_dir={tmp_path}"]
    args += ["--trainer.enable_progress_bar=false", "--trainer.precision=32-true", *more]
    return LightningCLI(Labels, Streamed, args=args)


def test_in_a_job_a_projects_planted_data_fails_in_one_line_and_its_setting_admits_it(
    planted, clean, on_sagemaker, as_script, tmp_path, capsys
):
    """A project's own dataset, in a job: the planted one fails the job in one line before the first batch, the marker
    unwritten; the same dataset trains where the project names pickle in streaming.trusted_formats (and its code
    runs: the setting's risk); a dataset of numbers and arrays trains."""
    folder, marker = planted
    with pytest.raises(SystemExit) as exit:
        as_script(fit, folder, tmp_path / "a")
    errors = [line for line in capsys.readouterr().err.splitlines() if line.startswith("ERROR: ")]
    assert exit.value.code == 1 and len(errors) == 1, errors
    assert "field 'extra' is stored as 'pickle'" in errors[0] and not os.path.exists(marker)
    assert fit(clean, tmp_path / "b").trainer.global_step == 2
    assert fit(folder, tmp_path / "c", f"--{decoders.SETTING}=[pickle]").trainer.global_step == 2
    assert os.path.exists(marker)
    os.remove(marker)


class StreamedValidation(Streamed):
    """A project's own data module whose validation data streams too: the sanity check reads it before training."""

    def val_dataloader(self):
        return StreamingDataLoader(StreamingDataset(self.validation_dir), batch_size=4)

    def __init__(self, data_dir: str = "", validation_dir: str = ""):
        super().__init__(data_dir)
        self.validation_dir = validation_dir


class Validated(Labels):
    def validation_step(self, batch, batch_idx):
        self.log("val/loss", torch.nn.functional.cross_entropy(self.net(batch["id"].float()[:, None]), batch["label"]))


def test_in_a_job_a_projects_planted_validation_data_fails_in_one_line_before_the_sanity_check_reads_it(
    planted, clean, on_sagemaker, as_script, tmp_path, capsys
):
    """The validation loader streams from a planted prefix, the training one from clean data: the sanity check's
    first reader refuses it in one line (every streamed loader comes prepared: data/training_loader.py), the marker
    unwritten."""
    folder, marker = planted
    args = ["fit", f"--data.data_dir={clean}", f"--data.validation_dir={folder}", "--trainer.max_steps=2"]
    args += ["--trainer.accelerator=cpu", f"--checkpoint.dirpath={tmp_path / 'checkpoints'}"]
    args += [f"--trainer.default_root_dir={tmp_path}", "--trainer.enable_progress_bar=false"]
    with pytest.raises(SystemExit) as exit:
        as_script(LightningCLI, Validated, StreamedValidation, args=[*args, "--trainer.precision=32-true"])
    errors = [line for line in capsys.readouterr().err.splitlines() if line.startswith("ERROR: ")]
    assert exit.value.code == 1 and len(errors) == 1, errors
    assert "field 'extra' is stored as 'pickle'" in errors[0] and not os.path.exists(marker)
