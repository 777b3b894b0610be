"""The parts of scripts/bench_checkpoint.py, one concern a module; its sections call them in this order:

    state.py    the state a checkpoint holds (a model and Adam's moments), its snapshot, a training-like loop
    local.py    whole-file saves to a local folder: synchronous, Lightning's AsyncCheckpointIO, a writer thread, a
                writer process; the same state written again or hard-linked
    s3.py       whole-file writes and reads on a moto server, each against boto3's raw transfer; a server-side copy
    sharded.py  fsdp's sharded saves through DCP on 2 gloo ranks: dcp.save against dcp.async_save
    report.py   the figures as text (pure)

`python scripts/bench_checkpoint.py` puts scripts/ first on sys.path, and pytest's pythonpath (pyproject.toml) does
too: `from checkpoint_bench import state` works in both.

    python scripts/bench_checkpoint.py --help
"""
