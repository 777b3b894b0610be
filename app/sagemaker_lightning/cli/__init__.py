"""Configuration → trainer: the runtime's LightningCLI and what it builds the trainer from.

hub.py                LightningCLI: arguments, the plan, the trainer as a list of concerns, one-line failures
settings.py           the runtime's settings, each declared once with its default and help
subcommands.py        which subcommand a command line runs
lightning_package.py  lightning.pytorch or pytorch_lightning: the runtime's mixins made into the project's classes
precision.py          the machine's precision when the project sets none
quiet.py              which warnings reach a job's log
redact.py             secrets out of what a job keeps
"""
