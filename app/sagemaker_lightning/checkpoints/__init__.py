"""Checkpoints: what a restarted job resumes from, and the trained model it ends with.

concern.py         the checkpoints' part of the trainer: resume point, callbacks, CheckpointIO
atomic.py          the atomic write: a partial name, then a rename
retention.py       which of last.ckpt's saves stay: the newest and the one before (keep_previous, prune)
layout.py          checkpoint.dirpath's names (last.ckpt, last-previous.ckpt, ...), no link on the way to a save's paths
io.py              reading (weights only, transient failures retried) and writing (BackgroundCheckpointIO)
writer.py          whole-file saves in the background: a snapshot, one writer thread, each state once
sharded_writer.py  fsdp's sharded saves in the background: DCP's async_save, the previous complete save kept
s3_transfer.py     s3:// both ways in concurrent parts: a save serialised while it uploads, a read in ranges
last.py            last.ckpt every N steps, at each epoch's end and on a stop (LastCheckpoint)
interval.py        when last.ckpt is due by steps: set, or about a minute of measured steps where no SIGTERM arrives
validation.py      a save against the fit's validation: after one that follows its step, inside one as if not begun
confine.py         ModelCheckpoint's state on resume: paths outside its dirpath dropped, said in one line
resume.py          which checkpoint a job resumes from, chosen on global rank 0 (ResumePoint)
sharded_saves.py   fsdp's sharded saves: layout, completeness, which to resume, load, nothing in them run
export.py          model.pt and config.yaml in model_dir after fit (Export)
compile_cache.py   torch.compile's cache saved with the checkpoints (CompileCache)
"""
