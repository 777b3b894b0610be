"""The interruption oracle: a small job run uninterrupted once, then interrupted at every boundary by every
interruption and resumed, each chain held to the uninterrupted run (docs/resume-matrix.md). Its modules:
project.py (the job's model and data), rank.py (one rank of a run, its interruption), cases.py (the matrix),
runs.py (runs as real processes from a fork server), checks.py (the judgement)."""
