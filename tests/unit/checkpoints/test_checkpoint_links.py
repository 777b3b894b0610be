"""A symbolic link in checkpoint.dirpath (issue 48, item 2): whoever can write a shared checkpoint volume (a PVC, NFS,
FSx) can plant one, and a save that followed it would write and prune where it points. Every path a save writes to or
prunes stays inside checkpoint.dirpath: a link there fails the job at its start in one line, and a link made while it
trains is refused before anything is written or removed through it.

    .venv/bin/python -m pytest tests/unit/checkpoints/test_checkpoint_links.py -q
"""

import os

import pytest
import torch
from sharded_save import save

from sagemaker_lightning.checkpoints import layout, resume, retention
from sagemaker_lightning.failure import UserError

pytestmark = pytest.mark.unit


def victim(tmp_path):
    """A folder outside checkpoint.dirpath holding two projects' files: what a planted link points at."""
    for project in ("project-a", "project-b"):
        (tmp_path / "victim" / project).mkdir(parents=True)
        (tmp_path / "victim" / project / "data.bin").write_bytes(b"theirs")
    return tmp_path / "victim"


def held(folder) -> dict:
    return {str(p.relative_to(folder)): p.read_bytes() if p.is_file() else None for p in sorted(folder.rglob("*"))}


def refused_link(raised, link) -> None:
    line = str(getattr(raised, "value", raised))
    assert line.startswith(f"{link} is a symbolic link (to ") and "\n" not in line, line
    assert "never through a link; remove the link" in line


def test_an_fsdp_job_whose_last_ckpt_links_elsewhere_fails_at_its_start_and_changes_nothing_there(tmp_path):
    """The issue's reproduction: last.ckpt -> victim/, where victim/ holds project-a/ and project-b/. The sharded
    save wrote into victim/ and its prune then removed both projects; now the job fails before its first step."""
    from lightning.pytorch.demos.boring_classes import BoringDataModule, BoringModel

    from sagemaker_lightning import LightningCLI

    before = held(victim(tmp_path))
    (tmp_path / "ckpts").mkdir()
    os.symlink(tmp_path / "victim", tmp_path / "ckpts" / "last.ckpt")
    args = ["fit", "--trainer.strategy=fsdp", "--trainer.accelerator=cpu", "--trainer.devices=1"]
    args += ["--trainer.max_steps=2", "--trainer.limit_val_batches=0", "--trainer.logger=false"]
    args += [f"--checkpoint.dirpath={tmp_path / 'ckpts'}", "--last_checkpoint_every_n_steps=1"]
    args += ["--trainer.enable_progress_bar=false"]
    try:  # off any job the exception reaches the caller (in a job: its one line)
        LightningCLI(BoringModel, BoringDataModule, args=args, save_config_callback=None)
        raised = None
    except UserError as e:
        raised = e
    assert held(tmp_path / "victim") == before  # it held only the saves: both projects were pruned
    refused_link(raised, tmp_path / "ckpts" / "last.ckpt")


@pytest.mark.parametrize(
    "planted, sharded",
    [
        ("last.ckpt, a file", False),
        ("last.ckpt/, fsdp's", True),
        ("a save in last.ckpt/", True),
        ("a best checkpoint", False),
    ],
)
def test_a_link_among_the_checkpoints_fails_the_start_in_one_line(tmp_path, planted, sharded):
    ckpts, outside = tmp_path / "ckpts", victim(tmp_path)
    ckpts.mkdir()
    if planted == "last.ckpt, a file":
        torch.save({"global_step": 1}, outside / "theirs.ckpt")
        link, target = ckpts / "last.ckpt", outside / "theirs.ckpt"
    elif planted == "last.ckpt/, fsdp's":
        link, target = ckpts / "last.ckpt", outside
    elif planted == "a save in last.ckpt/":
        save(ckpts / "last.ckpt", 2)
        save(outside, 4)
        link, target = ckpts / "last.ckpt" / "step-000000004-4", outside / "step-000000004-4"
    else:
        torch.save({"global_step": 1}, ckpts / "last.ckpt")
        link, target = ckpts / "epoch=0-step=1.ckpt", outside / "project-a" / "data.bin"
    os.symlink(target, link)
    before = held(outside)
    with pytest.raises(UserError) as raised:
        resume.ResumePoint(dirpath=str(ckpts), model=None, strict=True, sharded=sharded, announce=True)
    refused_link(raised, link)
    assert held(outside) == before


def test_a_link_made_while_the_job_trains_is_neither_written_through_nor_pruned(tmp_path):
    """Checked again at each save: keep_previous (a hard link of last.ckpt's file would be one of the link's target)
    and the prune after a sharded save (it removed every folder of the link's target but the new save)."""
    outside = victim(tmp_path)
    before = held(outside)
    ckpts = tmp_path / "ckpts"
    save(ckpts / "last.ckpt", 2)
    os.symlink(outside / "project-a", ckpts / "last.ckpt" / "step-000000001-1")
    with pytest.raises(UserError) as raised:
        retention.prune(str(ckpts / "last.ckpt"), {"step-000000002-2"})
    refused_link(raised, ckpts / "last.ckpt" / "step-000000001-1")
    assert sorted(os.listdir(ckpts / "last.ckpt")) == ["step-000000001-1", "step-000000002-2"]  # nothing removed
    os.rename(ckpts / "last.ckpt", ckpts / "saves")
    os.symlink(outside, ckpts / "last.ckpt")
    with pytest.raises(UserError) as raised:
        retention.prune(str(ckpts / "last.ckpt"), {"step-000000002-2"})
    refused_link(raised, ckpts / "last.ckpt")
    os.remove(ckpts / "last.ckpt")
    os.symlink(outside / "project-a" / "data.bin", ckpts / "last.ckpt")
    with pytest.raises(UserError) as raised:
        retention.keep_previous(str(ckpts / "last.ckpt"))
    refused_link(raised, ckpts / "last.ckpt")
    assert not (ckpts / layout.PREVIOUS).exists()
    assert held(outside) == before
