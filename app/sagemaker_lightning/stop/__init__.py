"""How a training process stops: together, and ready to start again.

agreement.py  every rank stops at the same step on SIGTERM (StopTogether)
restarts.py   what a restart needs: a checkpoint directory that outlives the container, a save inside the grace
process.py    the process around the trainer: its checks at the start, ended local ranks, leaving the process group
"""
