"""What the fork server preloads (preloaded.py): the oracle's job, imported and warmed (rank.warm). Imported by
nothing else: importing oracle.rank alone (cases.py writing docs/resume-matrix.md, say) parses no command line.

    .venv/bin/python -c "import preloaded; preloaded.context()"
"""

from oracle import rank

rank.warm()
