"""fsdp's sharded saves on disk (checkpoints/sharded_saves.py): which rank tidies a directory, which save a job
resumes from, when a save is complete, and a checkpoint of the other strategy named, not loaded."""

import os

import pytest
import torch
from sharded_save import save

from sagemaker_lightning.checkpoints import layout, sharded_saves
from sagemaker_lightning.failure import UserError

pytestmark = pytest.mark.unit


def test_each_directory_is_tidied_by_the_first_rank_that_wrote_in_it():
    assert sharded_saves.committer(["__0_0.distcp", "__1_0.distcp", ".metadata", "meta.pt"]) == 0  # shared
    assert sharded_saves.committer(["__3_0.distcp", "__2_0.distcp"]) == 2  # a host's own directory
    assert sharded_saves.committer([".metadata"]) is None


def test_resume_takes_the_newest_complete_save_and_skips_one_cut_short(tmp_path, capsys):
    last = tmp_path / "last.ckpt"
    save(last, 4)
    newest = save(last, 6)
    assert sharded_saves.resume_path(str(tmp_path)) == newest
    os.remove(os.path.join(newest, layout.META))  # killed between .metadata and meta.pt
    assert sharded_saves.resume_path(str(tmp_path)) == str(last / "step-000000004-4")
    assert "not resuming from step-000000006-6 lacks meta.pt (a save cut short)" in capsys.readouterr().out
    os.remove(os.path.join(newest, ".metadata"))  # killed while the ranks wrote their files
    assert sharded_saves.missing(last / "step-000000006-6") == [".metadata"]


@pytest.mark.parametrize("cut", ["__0_0.distcp", layout.META, ".metadata"])
def test_a_save_with_a_file_cut_short_is_incomplete(tmp_path, cut):
    """An upload to S3 interrupted by a spot reclaim can bring a file back shorter than it was written."""
    path = save(tmp_path, 4)
    with open(os.path.join(path, cut), "r+b") as f:
        f.truncate(os.path.getsize(os.path.join(path, cut)) - 1)
    (lacking,) = sharded_saves.missing(tmp_path / os.path.basename(path))
    assert lacking.startswith(cut) and ("cut short" in lacking or "does not load" in lacking)
    assert sharded_saves.newest_complete(tmp_path)[0] is None


def test_a_save_lacking_a_ranks_file_is_incomplete(tmp_path):
    """On SageMaker each host's files reach S3 on their own: a restored save may lack one host's."""
    path = save(tmp_path, 4)
    (data,) = [f for f in os.listdir(path) if f.endswith(".distcp")]
    os.remove(os.path.join(path, data))
    assert sharded_saves.missing(tmp_path / os.path.basename(path)) == [data]
    assert sharded_saves.newest_complete(tmp_path)[0] is None


def test_a_checkpoint_of_the_other_strategy_is_named_not_loaded(tmp_path):
    assert sharded_saves.resume_path(str(tmp_path)) is None
    torch.save({}, tmp_path / "last.ckpt")
    sharded_saves.refuse_sharded(str(tmp_path))  # ddp's own file: for checkpoints.resume_path
    with pytest.raises(UserError, match=r"last.ckpt was written by trainer.strategy=ddp .* resume it with ddp"):
        sharded_saves.resume_path(str(tmp_path))
    os.remove(tmp_path / "last.ckpt")
    save(tmp_path / "last.ckpt", 2)
    with pytest.raises(UserError, match="holds sharded saves of trainer.strategy=fsdp; resume it with"):
        sharded_saves.refuse_sharded(str(tmp_path))
    with pytest.raises(UserError, match=r"checkpoint.dirpath=s3://b/c: trainer.strategy=fsdp writes its sharded"):
        sharded_saves.resume_path("s3://b/c")
