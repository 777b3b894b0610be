"""What a checkpoint planted by whoever can write the checkpoint location can do to a job (docs/reliability.md,
"Security"): a sharded save's pickles run nothing, ModelCheckpoint's state in it steers no delete or read outside
checkpoint.dirpath, and a weights-only load names a class it does not admit instead of calling the file corrupt.

    .venv/bin/python -m pytest tests/unit/checkpoints/test_checkpoint_trust.py -q
"""

import argparse
import enum
import io as io_module
import os
import pickle
from pathlib import Path
from types import SimpleNamespace

import fsspec
import lightning.pytorch
import pytest
import torch
from lightning.pytorch.demos.boring_classes import BoringModel
from sharded_save import save
from torch.distributed.checkpoint.state_dict import get_model_state_dict, get_optimizer_state_dict

from sagemaker_lightning.checkpoints import io, layout, resume, sharded_saves
from sagemaker_lightning.checkpoints.confine import confined
from sagemaker_lightning.checkpoints.export import Export
from sagemaker_lightning.checkpoints.io import UnsafeGlobal
from sagemaker_lightning.checkpoints.last import LastCheckpoint
from sagemaker_lightning.failure import UserError
from sagemaker_lightning.parallel import fsdp, fsdp_sharding
from sagemaker_lightning.toolbox import location
from sagemaker_lightning.toolbox.concern import Steps
from sagemaker_lightning.toolbox.lightning_package import made

pytestmark = pytest.mark.unit

PL = lightning.pytorch


class Planted:
    """A pickle that makes the directory `target` when it is loaded: what a planted file could run."""

    def __init__(self, target):
        self.target = str(target)

    def __reduce__(self):
        return os.mkdir, (self.target,)


MKDIR = f"{os.mkdir.__module__}.mkdir"  # as a pickle names it: posix.mkdir


def test_a_planted_metadata_runs_nothing_and_its_save_is_skipped(tmp_path, capsys):
    """The issue's reproduction: a save newer than any other whose .metadata runs os.mkdir when unpickled."""
    older = save(tmp_path / "last.ckpt", 4)
    planted = tmp_path / "last.ckpt" / "step-999999999-0"
    planted.mkdir()
    torch.save({}, planted / layout.META)  # whole: .metadata is what is read next
    (planted / ".metadata").write_bytes(pickle.dumps(Planted(tmp_path / "ran")))
    assert sharded_saves.resume_path(str(tmp_path)) == older
    assert not (tmp_path / "ran").exists()
    out = capsys.readouterr().out
    assert f"not resuming from step-999999999-0: its .metadata names {MKDIR}, which no" in out
    assert sharded_saves.missing(Path(older)) == []  # a real save's .metadata still loads


def test_a_metadata_naming_a_file_outside_its_folder_reads_nothing_there(tmp_path, capsys):
    """A save's .metadata names each shard file by a relative_path that DCP joins to the save's folder: a planted
    `../elsewhere.distcp` read any torch archive the job could reach into the model (issue 48, item 11)."""
    older = save(tmp_path / "last.ckpt", 4)
    planted = Path(save(tmp_path / "last.ckpt", 9))
    with open(planted / ".metadata", "rb") as f:
        found = pickle.load(f)
    for item in found.storage_data.values():  # every shard now read from outside the folder, at the sizes recorded
        os.replace(planted / item.relative_path, tmp_path / "elsewhere.distcp")
        item.relative_path = "../../elsewhere.distcp"
    (planted / ".metadata").write_bytes(pickle.dumps(found))
    assert sharded_saves.resume_path(str(tmp_path)) == older
    assert "not resuming from step-000000009-9: its .metadata names '../../elsewhere.distcp', a file outside its" in (
        capsys.readouterr().out
    )
    with pytest.raises(UnsafeGlobal):
        sharded_saves.missing(planted)


class EnumsByName(pickle.Pickler):
    """Pickles enum members as Python 3.12 and Debian's 3.11 (the image's) do: getattr(Enum, name)."""

    def reducer_override(self, obj):
        if isinstance(obj, enum.Enum):
            return getattr, (type(obj), obj.name)
        if isinstance(obj, Home):  # stands in for getattr(os, "system"): getattr of a class that is no enum
            return getattr, (type(Path()), "home")  # PosixPath: an admitted class
        return NotImplemented


class Home:
    """Pickled as getattr(PosixPath, "home") by EnumsByName."""


def test_metadata_pickled_with_enums_by_name_loads_and_no_other_getattr_does(tmp_path):
    """A .metadata written where enums pickle by name (the image's Python) was refused as planted: every save of a
    two-host fsdp job in local mode, which then could not resume (tests/container/test_sharded_local_mode.py)."""
    path = Path(save(tmp_path / "last.ckpt", 4))
    with open(path / ".metadata", "rb") as f:
        found = pickle.load(f)
    buffer = io_module.BytesIO()
    EnumsByName(buffer).dump(found)
    assert b"getattr" in buffer.getvalue()
    (path / ".metadata").write_bytes(buffer.getvalue())
    assert sharded_saves.missing(path) == []
    buffer = io_module.BytesIO()
    EnumsByName(buffer).dump({"x": Home()})
    with pytest.raises(UnsafeGlobal, match="asks for getattr of <class 'pathlib.PosixPath'>"):
        sharded_saves.MetadataUnpickler(io_module.BytesIO(buffer.getvalue())).load()


def test_a_planted_sharded_save_runs_nothing_when_the_strategy_loads_it(one_process, tmp_path):
    """dcp.load unpickles .metadata and each non-tensor item (an optimizer's learning rate) of the rank files: the
    strategy's load admits only a checkpoint's own classes in the first and weights only in the second."""
    strategy = made(fsdp.FullyShardedStrategy, PL)(fsdp.FSDPSettings())
    model = BoringModel()
    fsdp_sharding.shard(model, fsdp.FSDPSettings(), one_process, offload=False)
    strategy.connect(model)
    strategy.optimizers = [torch.optim.SGD(model.parameters(), lr=0.1)]
    state = {"state_dict": get_model_state_dict(model)}
    state["optimizer_0"] = get_optimizer_state_dict(model, strategy.optimizers[0])
    state["optimizer_0"]["param_groups"][0]["lr"] = Planted(tmp_path / "ran")  # the rank file's own pickle
    path = tmp_path / "last.ckpt" / "step-000000001-1"
    torch.distributed.checkpoint.save(state, checkpoint_id=path)
    torch.save({"global_step": 1}, path / layout.META)
    with pytest.raises(UserError, match=f"UnsafeGlobal: names {MKDIR}, a global of a module torch never"):
        strategy.load_checkpoint(path)
    assert not (tmp_path / "ran").exists()
    (path / ".metadata").write_bytes(pickle.dumps(Planted(tmp_path / "ran")))
    with pytest.raises(UserError, match=f"step-000000001-1: UnsafeGlobal: its .metadata names {MKDIR}"):
        strategy.load_checkpoint(path)
    assert not (tmp_path / "ran").exists()


class Scored(BoringModel):
    """Logs its step as `score`: each step is a new best for ModelCheckpoint(monitor="score", mode="max")."""

    def training_step(self, batch, batch_idx):
        self.log("score", float(self.global_step))
        return super().training_step(batch, batch_idx)


class WithPath(BoringModel):
    """A project's usual hyperparameter: a pathlib path."""

    def __init__(self, root: Path = Path("/data")):
        super().__init__()
        self.save_hyperparameters()


def fit(tmp_path, model, steps: int, **checkpoint):
    """A fit with the runtime's checkpointing: last.ckpt every step, resumed from when there is one."""
    top = PL.callbacks.ModelCheckpoint(dirpath=tmp_path / "ckpts", **checkpoint)
    point = resume.ResumePoint(
        dirpath=str(tmp_path / "ckpts"), model=model.state_dict(), strict=True, sharded=False, announce=True
    )
    trainer = PL.Trainer(
        max_steps=steps,
        callbacks=[top, last := made(LastCheckpoint, PL)(1, top, resume_point=point), made(Steps, PL)([last])],
        plugins=[made(io.BackgroundCheckpointIO, PL)(resume_point=point)],
        limit_val_batches=0,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.fit(model, ckpt_path=point.candidate)
    return trainer


def test_checkpoint_state_naming_paths_outside_checkpoint_dirpath_deletes_nothing_there(tmp_path, capsys):
    """ModelCheckpoint's top-k update deletes its k-th best: a last.ckpt naming another bucket (memory://, which
    Lightning, as for s3://, deletes wherever it is) or a path that leaves checkpoint.dirpath by `..` (inside it by
    Lightning's check of its parents) must delete neither. The job goes on, one line naming them."""
    fit(tmp_path, Scored(), 2, monitor="score", mode="max", save_top_k=2, every_n_train_steps=1)
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "victim.ckpt").write_bytes(b"kept")
    escaped = str(tmp_path / "ckpts" / ".." / "other" / "victim.ckpt")
    bucket = f"memory://another-bucket/{tmp_path.name}/epoch=0-step=1.ckpt"
    with fsspec.open(bucket, "wb") as f:
        f.write(b"kept")
    last = tmp_path / "ckpts" / "last.ckpt"
    checkpoint = torch.load(last, weights_only=True)
    (key,) = [k for k in checkpoint["callbacks"] if k.startswith("ModelCheckpoint")]
    checkpoint["callbacks"][key].update(  # the next two top-k updates would delete both, worst first
        best_k_models={bucket: torch.tensor(0.0), escaped: torch.tensor(1.0)},
        kth_best_model_path=bucket,
        kth_value=torch.tensor(0.0),
        best_model_path=escaped,
    )
    torch.save(checkpoint, last)
    trainer = fit(tmp_path, Scored(), 4, monitor="score", mode="max", save_top_k=2, every_n_train_steps=1)
    assert trainer.global_step == 4
    assert fsspec.open(bucket, "rb").open().read() == b"kept"
    assert (tmp_path / "other" / "victim.ckpt").read_bytes() == b"kept"
    assert all(
        location.inside(p, trainer.checkpoint_callback.dirpath) for p in trainer.checkpoint_callback.best_k_models
    )
    out = capsys.readouterr().out
    assert f"ModelCheckpoint's state in the checkpoint names {escaped}, {bucket}, outside checkpoint.dirpath" in out
    fsspec.filesystem("memory").rm(bucket)


@pytest.mark.parametrize("mode, kth", [("max", "/ckpts/a.ckpt"), ("min", "/ckpts/b.ckpt")])
def test_with_the_kth_best_dropped_the_worst_kept_is_the_next_to_go(mode, kth):
    """As ModelCheckpoint chooses its k-th best: a top-k update pops it from best_k_models, which must hold it."""
    best = {
        "/ckpts/a.ckpt": torch.tensor(1.0),
        "s3://other/x.ckpt": torch.tensor(0.0),
        "/ckpts/b.ckpt": torch.tensor(2.0),
    }
    state = {"best_k_models": best, "kth_best_model_path": "s3://other/x.ckpt", "best_model_path": "/ckpts/b.ckpt"}
    kept, dropped = confined(state, "/ckpts", mode)
    assert dropped == ["s3://other/x.ckpt"] and kept["best_k_models"].keys() == {"/ckpts/a.ckpt", "/ckpts/b.ckpt"}
    assert kept["kth_best_model_path"] == kth and kept["kth_value"] == best[kth]
    assert kept["best_model_path"] == "/ckpts/b.ckpt" and state["best_k_models"] is best  # the state left as it was


@pytest.mark.parametrize("where", ["other directory", "dirpath/..", "another bucket"])
def test_the_export_reads_no_best_checkpoint_outside_checkpoint_dirpath(tmp_path, capsys, where):
    """best_model_path, from a checkpoint's state: outside checkpoint.dirpath it is not read; the final weights
    are exported, said in one line."""
    outside = {
        "other directory": str(tmp_path / "elsewhere" / "best.ckpt"),
        "dirpath/..": str(tmp_path / "ckpts" / ".." / "elsewhere" / "best.ckpt"),
        "another bucket": f"memory://another-bucket/{tmp_path.name}/best.ckpt",
    }[where]
    os.makedirs(tmp_path / "elsewhere", exist_ok=True)
    with fsspec.open(outside, "wb") as f:
        torch.save({"state_dict": {"planted": torch.ones(1)}}, f)
    model = torch.nn.Linear(1, 1)
    callback = SimpleNamespace(best_model_path=outside, dirpath=str(tmp_path / "ckpts"))
    strategy = SimpleNamespace(broadcast=lambda obj, src: obj)
    trainer = SimpleNamespace(checkpoint_callback=callback, strategy=strategy, is_global_zero=True, ckpt_path=None)
    made(Export, PL)(str(tmp_path / "model"), lambda: "").on_fit_end(trainer, model)
    assert torch.load(tmp_path / "model" / "model.pt", weights_only=True).keys() == model.state_dict().keys()
    assert f"not reading the best checkpoint {outside}: it is outside checkpoint.dirpath" in capsys.readouterr().out


@pytest.mark.parametrize(
    "path, dirpath, inside",
    [
        ("/ckpts/epoch=1.ckpt", "/ckpts", True),
        ("/ckpts/last.ckpt/step-1-2", "/ckpts/", True),
        ("/ckpts", "/ckpts", False),  # the directory itself: a recursive delete would take every checkpoint
        ("/ckpts/../etc/x.ckpt", "/ckpts", False),
        ("/ckpts-old/x.ckpt", "/ckpts", False),
        ("s3://bucket/ckpts/epoch=1.ckpt", "s3://bucket/ckpts", True),
        ("s3://bucket/ckpts-old/x.ckpt", "s3://bucket/ckpts", False),
        ("s3://other/ckpts/x.ckpt", "s3://bucket/ckpts", False),
        ("s3://bucket/ckpts/../x.ckpt", "s3://bucket/ckpts", False),
        ("s3://bucket/ckpts/x.ckpt", "/ckpts", False),
        ("/ckpts/x.ckpt", "s3://bucket/ckpts", False),
        ("file:///ckpts/x.ckpt", "/ckpts", True),
        ("", "/ckpts", False),
    ],
)
def test_inside_compares_normalised_paths_and_urls(path, dirpath, inside):
    assert location.inside(path, dirpath) is inside


def test_a_checkpoint_holding_a_path_in_its_hyperparameters_resumes(tmp_path, capsys):
    """pathlib's paths are rebuilt from their parts, nothing run: a weights-only load admits them."""
    fit(tmp_path, WithPath(), 2)
    trainer = fit(tmp_path, WithPath(), 4)
    assert trainer.global_step == 4
    assert "resuming at epoch 0 step 2 from last.ckpt" in capsys.readouterr().out


def test_a_checkpoint_holding_a_class_torch_does_not_admit_is_named_not_called_corrupt(tmp_path, monkeypatch):
    """One line naming the class and the fix, without torch's terminal escapes; not "delete it". Lightning's own
    load is weights only too where torch's default is not (before 2.6: the SMDDP flavors' torch 2.5)."""
    (tmp_path / "ckpts").mkdir()
    checkpoint = {"state_dict": {}, "optimizer_states": [], "loops": {}, "global_step": 1}
    torch.save({**checkpoint, "hyper_parameters": {"args": argparse.Namespace(lr=0.1)}}, tmp_path / "ckpts/last.ckpt")
    with pytest.raises(UserError) as failed:
        resume.resume_path(str(tmp_path / "ckpts"))
    line = str(failed.value)
    assert "names argparse.Namespace, which a weights-only load" in line
    assert "torch.serialization.add_safe_globals([argparse.Namespace])" in line
    assert "delete it (and its copy" not in line and "\x1b" not in line and "\n" not in line
    monkeypatch.setenv("TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD", "1")  # torch 2.5's default: any pickle
    torch.save({**checkpoint, "hyper_parameters": Planted(tmp_path / "ran")}, tmp_path / "planted.ckpt")
    with pytest.raises(UserError, match=f"UnsafeGlobal: names {MKDIR}, a global of a module torch never"):
        made(io.BackgroundCheckpointIO, PL)().load_checkpoint(tmp_path / "planted.ckpt")
    assert not (tmp_path / "ran").exists()
