"""``croupier bench``: croupier against what people use today, side by side in one run.

Every measurement runs in its own subprocess (so peak RSS is the run's own and one system's
memory never helps or hurts another), one at a time (so they never share the cores). See
:func:`run` for the workload and :mod:`croupier.bench._child` for what is timed.
"""

from croupier.bench._runner import BenchConfig, run

__all__ = ["BenchConfig", "run"]
