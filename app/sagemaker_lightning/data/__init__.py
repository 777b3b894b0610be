"""Training data that resumes exactly mid-epoch.

resumable.py  the runtime's resumable loader (ResumableDataLoader, ResumableEpoch) and the per-batch seeding
streaming.py  litdata's streamed data: exact resume on every rank and node, settings that cannot resume refused
decoders.py   which of litdata's decoders a streamed dataset may use: only those that cannot run code
"""
