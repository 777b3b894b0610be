"""Configuration → trainer, the top of the house: the runtime's LightningCLI and what it builds the trainer from (the
tools every concern shares are toolbox/'s).

hub.py                LightningCLI: arguments, the plan, the trainer as a list of concerns, one-line failures
job.py                a job's start: the plan completed, then its variables, torchrun, the launch line
settings.py           the parser's plumbing: the settings each concern declares beside it, in one group
subcommands.py        which subcommand a command line runs
precision.py          the machine's precision when the project sets none
quiet.py              which warnings reach a job's log
"""
