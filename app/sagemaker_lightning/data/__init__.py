"""Training data that resumes exactly mid-epoch.

resumable.py  the runtime's resumable loader (ResumableDataLoader, ResumableEpoch) and the per-batch seeding
streaming.py  litdata's streamed data: exact resume on every rank and node, settings that cannot resume refused
"""
