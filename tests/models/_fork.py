"""Run a function in a forked child and get its (picklable) result back through a pipe."""

from __future__ import annotations

import os
import pickle
from collections.abc import Callable
from typing import Any


def in_fork(fn: Callable[[], Any]) -> Any:
    """``fn()`` evaluated in an ``os.fork`` child; its exception is re-raised here."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: never returns into pytest
        code = 0
        try:
            try:
                payload = pickle.dumps(("ok", fn()))
            except BaseException as exc:  # reported to the parent
                payload = pickle.dumps(("error", repr(exc)))
            with os.fdopen(write, "wb") as out:
                out.write(payload)
        except BaseException:
            code = 1
        finally:
            os._exit(code)
    os.close(write)
    with os.fdopen(read, "rb") as src:
        data = src.read()
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0, "the forked child failed"
    kind, value = pickle.loads(data)
    if kind == "error":
        raise AssertionError(f"the forked child raised {value}")
    return value
