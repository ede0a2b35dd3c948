"""How a ``croupier bench`` run shows its progress: a bar with the time left on a terminal (tqdm),
one line per step otherwise (a log, CI)."""

from __future__ import annotations

import sys
from functools import partial
from typing import Any, TextIO

from croupier.bench._runner import Lines, Progress

__all__ = ["progress_for"]


class _Bar(Progress):
    """A tqdm bar over the run's estimated CPU seconds: each finished run advances it by its
    estimate, so the rate, and the time left, follow how fast this machine really goes."""

    def __init__(self, total_s: float, stream: TextIO) -> None:
        from tqdm import tqdm

        self.bar: Any = tqdm(
            total=max(total_s, 1e-9),
            file=stream,
            unit="s",
            bar_format="{l_bar}{bar}| {elapsed} elapsed, {remaining} left",
            dynamic_ncols=True,
        )

    def say(self, line: str) -> None:
        if line.endswith(" ..."):  # a run starts: the bar names it
            self.bar.set_description_str(line[: -len(" ...")], refresh=True)
        else:  # a run's outcome, kept above the bar
            self.bar.write(line, file=self.bar.fp)

    def advance(self, estimated_s: float) -> None:
        self.bar.update(estimated_s)

    def close(self) -> None:
        self.bar.close()


def progress_for(total_s: float, stream: TextIO | None = None) -> Progress:
    """A bar when ``stream`` (stderr by default) is a terminal and tqdm is installed, lines
    otherwise. Call ``close()`` when the run ends."""
    stream = stream or sys.stderr
    if stream.isatty():
        try:
            return _Bar(total_s, stream)
        except ImportError:
            pass
    return Lines(partial(print, file=stream, flush=True))
