"""Processes for the tests that need fresh ones (two gloo ranks, the oracle's runs), forked from one server per test
run that imported torch, Lightning and the runtime once: a process then starts in about 0.1 s, where a spawned one
imports them again (5 s of CPU on 2 cores). A process forked from it holds none of the parent's threads or torch
state, as a spawned one.

    context = preloaded.context(); context.Process(target=f, args=(...,)).start()
"""

import multiprocessing
import multiprocessing.forkserver
import os
import sys

PRELOAD = ["oracle.warm"]  # torch, both Lightning packages, the runtime, the oracle's job (tests/plugins/oracle)


def context():
    """The forkserver context, its server started with PRELOAD imported."""
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(PRELOAD)
    # the server imports with the path it starts with: Python 3.11's forkserver drops the one it is handed, and a
    # preload that fails is silent (each process then imported torch again)
    saved = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
    try:
        multiprocessing.forkserver.ensure_running()
    finally:
        os.environ.pop("PYTHONPATH") if saved is None else os.environ.update(PYTHONPATH=saved)
    return context
