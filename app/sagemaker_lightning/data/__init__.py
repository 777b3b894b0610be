"""Training data that resumes exactly mid-epoch.

resumable.py  the runtime's resumable loader (ResumableDataLoader, ResumableEpoch)
draws.py      the generators a step draws from: seeded, saved with every rank's position, held while a validation draws
streaming.py  litdata's streamed data: exact resume on every rank and node, settings that cannot resume refused
decoders.py   which of litdata's decoders a streamed dataset may use: only those that cannot run code
"""
