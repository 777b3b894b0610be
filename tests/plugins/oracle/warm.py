"""What the fork server preloads (preloaded.py): the oracle's job imported (rank.py), one parse of its command line
(outside a job: Lightning's own CLI), so that each run's process starts with what a parse leaves cached
(jsonargparse's signatures, isinstance's ABC caches: 0.8 s a run), then the server's objects frozen: a forked run's
collections skip them, not copy every page they touch (1 s). Imported by nothing else: importing oracle.rank alone
(cases.py writing docs/resume-matrix.md, say) parses no command line.

    .venv/bin/python -c "import preloaded; preloaded.context()"
"""

import gc


def warm() -> None:
    from oracle import project
    from oracle.rank import PACKAGES
    from sagemaker_lightning import LightningCLI
    from sagemaker_lightning.toolbox.lightning_package import made

    for pl in PACKAGES.values():
        LightningCLI(made(project.Tiny, pl), made(project.UserData, pl), run=False, args=["--trainer.logger=false"])


# the imports and the parse make little garbage: without collections the server starts in 3.7 s, not 4.6-5.3 s
gc.disable()
warm()
gc.freeze()
gc.enable()
