"""Starts the framework runners' processes as torchrun starts its workers, from a process that
imported the frameworks once.

A runner's process spends most of its life importing: about 9 s of CPU for Lightning, as much
for the HF Trainer, a third of it for torch alone. Here each rank is a child of a
``multiprocessing`` fork server that imported torch, Lightning, Accelerate and the HF Trainer
before its first child (the fork server of the pytest worker that asks first); a child gets the
variables torchrun sets (``RANK``, ``LOCAL_RANK``, ``WORLD_SIZE``, ``LOCAL_WORLD_SIZE``,
``GROUP_RANK``, ``TORCHELASTIC_RUN_ID``, ``env://`` rendezvous), its command line and its
own log, and runs the runner script as ``__main__``. The frameworks take it for a torchrun
worker, as they do on a cluster: each one's own code runs, from the fork on.
"""

from __future__ import annotations

import multiprocessing
import os
import runpy
import sys
import time
import warnings
from multiprocessing import forkserver

# Imported by the fork server before its first child: a missing package is left out.
PRELOAD = ["torch", "torch.distributed", "lightning", "accelerate", "transformers.trainer"]
# The variables the fork server (and the native libraries it loads: OpenMP reads its thread
# count when loaded) starts with.
SERVER_ENV = {"OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false", "PYTHONWARNINGS": "ignore"}

_context: multiprocessing.context.ForkServerContext | None = None


def _server() -> multiprocessing.context.ForkServerContext:
    """The fork server's context, the server started (once per process) with ``PRELOAD``
    imported and ``SERVER_ENV`` set."""
    global _context
    if _context is None:
        context = multiprocessing.get_context("forkserver")
        context.set_forkserver_preload(PRELOAD)
        saved = {k: os.environ.get(k) for k in SERVER_ENV}
        os.environ.update(SERVER_ENV)
        try:
            forkserver.ensure_running()
        finally:
            for k, v in saved.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v
        _context = context
    return _context


def _child(script: str, argv: list[str], env: dict[str, str], log: str) -> None:
    """One rank: the log as its stdout and stderr, ``env`` as its environment (its
    ``PYTHONPATH`` entries put first on ``sys.path``, as a new interpreter would), processes
    started by fork, ``script`` run as ``__main__`` with ``argv``."""
    fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
    # A fork server's child starts its own children as its parent does (by the fork server):
    # a torchrun worker on Linux forks them (its DataLoader workers).
    multiprocessing.set_start_method("fork", force=True)
    os.environ.clear()
    os.environ.update(env)
    sys.path[:0] = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    warnings.simplefilter("ignore")
    sys.argv = [script, *argv]
    runpy.run_path(script, run_name="__main__")


def launch(
    script: str, argv: list[str], env: dict[str, str], world: int, logs: str, timeout: float
) -> tuple[int, str]:
    """Runs ``script`` with ``argv`` on ``world`` ranks (``env`` plus each rank's torchrun
    variables) and waits for all of them; once one fails, the others get 10 s to fail too
    (their messages help) and are then killed, as they are at the timeout. Returns the first
    failure's exit code (0 if none; -1 for a timeout) and the ranks' output, the failed ones'
    last."""
    context = _server()
    procs = []
    for rank in range(world):
        variables = {
            "RANK": str(rank),
            "LOCAL_RANK": str(rank),
            "WORLD_SIZE": str(world),
            "LOCAL_WORLD_SIZE": str(world),
            "GROUP_RANK": "0",
            "TORCHELASTIC_RUN_ID": "croupier-tests",
        }
        log = os.path.join(logs, f"{rank}.log")
        p = context.Process(target=_child, args=(script, argv, {**env, **variables}, log))
        p.start()
        procs.append((p, log))
    deadline, stop_at, timed_out = time.monotonic() + timeout, None, False
    while any(p.is_alive() for p, _ in procs):
        now = time.monotonic()
        if stop_at is None and any(p.exitcode for p, _ in procs):
            stop_at = now + 10
        if now > deadline or (stop_at is not None and now > stop_at):
            timed_out = now > deadline
            for p, _ in procs:
                p.kill()
            break
        time.sleep(0.05)
    for p, _ in procs:
        p.join()
    texts = []
    for rank, (p, log) in sorted(enumerate(procs), key=lambda rp: rp[1][0].exitcode != 0):
        with open(log) as f:
            texts.append(f"-- process {rank} (exit {p.exitcode})\n{f.read()}")
    code = next((p.exitcode for p, _ in procs if p.exitcode != 0), 0)
    if timed_out:
        texts.append(f"-- killed after {timeout:.0f} s")
    return code or (-1 if timed_out else 0), "\n".join(texts)[-9000:]
