"""Experiment tracking in MLflow: one run a job, continued across restarts.

tracker.py     the trainer's side: which run, its metrics from the trainer's hooks, a project's MLFlowLogger
mlflow_run.py  the run itself, written from a thread of its own
"""
