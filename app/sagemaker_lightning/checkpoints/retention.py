"""Which of last.ckpt's saves stay: one rule, carried out by two mechanisms. No torch.

The rule: the newest save is never the only complete one; the save before it stays beside it until a newer one is
complete. SageMaker uploads the checkpoint directory in the background and deletes in S3 what is deleted here, so a
save still uploading when the job is reclaimed must not be the only one.

Its two mechanisms, one for each shape of last.ckpt:
- a single file (writer.py): the file a new last.ckpt replaces is linked as PREVIOUS just before the new one is
  renamed over it, a server-side copy in S3 (keep_previous); the file it replaces is the save before, whatever its step.
- fsdp's folder of saves (sharded_writer.py): each save goes to a new folder, and once one is complete every folder
  but those the rule names (Saves.add: the new one and the complete save of an earlier step) is removed (prune).
Neither follows a symbolic link there (layout.unlinked): a link is refused in one line before anything is linked or
removed.

    python -c "from sagemaker_lightning.checkpoints.retention import Saves; print(Saves('step-3-1').add('step-3-2', True))"
"""

import os
import shutil
from dataclasses import dataclass

import fsspec

from sagemaker_lightning.checkpoints.atomic import replacing
from sagemaker_lightning.checkpoints.layout import PREVIOUS, unlinked
from sagemaker_lightning.toolbox.location import remote


@dataclass(frozen=True)
class Saves:
    """What the rule knows of a sharded last.ckpt/ (the names of its saves), as one run writes them."""

    newest: str | None = None  # the newest save this run wrote or resumed from
    before: str | None = None  # the complete save of an earlier step than newest's

    def add(self, new: str, again: bool) -> tuple["Saves", set[str]]:
        """The saves known once `new` is written, and the names to keep once it is complete: it and the save before
        it. again: `new` is at newest's step (last.ckpt saved again once ModelCheckpoint updated its state) and
        replaces newest, not the save of the step before (it went, and a save cut short would have left nothing
        older); with none known (a stop right after the resume, at its step) the save resumed from stays."""
        before = self.before if again else self.newest
        return Saves(new, before), {name for name in (new, before or self.newest) if name}


def keep_previous(path: str) -> None:
    """last.ckpt's file (at `path`, a path or an fsspec URL) also as PREVIOUS, replacing the one before, before a new
    last.ckpt replaces it: while the new one is written, and until SageMaker's background upload of it is done, a
    complete copy of the progress stays beside it (a hard link here, a server-side copy in S3), from which the job
    resumes when last.ckpt does not load. In S3 the copy runs while the new object is uploaded, which appears only
    once the copy is done (s3_transfer.upload): a save does not wait for the two in a row."""
    fs, source = fsspec.core.url_to_fs(path)
    target = f"{source.rsplit('/', 1)[0]}/{PREVIOUS}"
    if not fs.exists(source):
        return
    if not remote(path):
        unlinked(source, os.path.dirname(source))  # os.link would link what a link names
        with replacing(target) as partial:
            os.link(source, partial)
    elif path.startswith("s3://"):
        from sagemaker_lightning.checkpoints import s3_transfer  # torch: not for this module's other callers

        s3_transfer.copy(path, f"s3://{target}")
    else:
        fs.copy(source, target)


def prune(root: str, keep: set[str]) -> None:
    """Remove every save in `root` (a sharded last.ckpt/) but those named in `keep` (Saves.add's); saves cut short go
    too. Nothing is removed where root, or any entry in it, is a symbolic link (layout.unlinked; root is in
    checkpoint.dirpath)."""
    dirpath = os.path.dirname(os.path.abspath(root))
    unlinked(root, dirpath)
    entries = os.listdir(root)
    for entry in entries:
        unlinked(os.path.join(root, entry), dirpath)
    for entry in entries:
        if entry not in keep:
            shutil.rmtree(os.path.join(root, entry), ignore_errors=True)
