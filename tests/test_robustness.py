"""What training jobs do to a sampler library: fork after using it (DataLoader workers,
multiprocessing), and interrupt it (Ctrl-C)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import croupier
from croupier import DistributedSampler

pytestmark = pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")


def _in_child(work, timeout: float = 60.0):
    """Runs ``work()`` in a forked child; returns what it returned (an array), or fails if the
    child hangs past ``timeout`` seconds or dies."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: never return into pytest
        code = 1
        try:
            out = np.ascontiguousarray(work())
            os.write(write, out.astype(np.int64).tobytes())
            code = 0
        finally:
            os._exit(code)
    os.close(write)
    import select

    chunks = []
    ready, _, _ = select.select([read], [], [], timeout)
    if not ready:
        os.kill(pid, 9)
        os.waitpid(pid, 0)
        pytest.fail(f"the forked child hung for {timeout} s")
    while chunk := os.read(read, 1 << 20):
        chunks.append(chunk)
    os.close(read)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0, "the forked child failed"
    return np.frombuffer(b"".join(chunks), dtype=np.int64)


def test_a_forked_child_uses_croupier_after_its_parent_did():
    # The parent's thread pool exists after these calls; the child has none of its threads.
    n = 3_000_000
    perm = croupier.permutation(n, seed=1)
    share = DistributedSampler(n, num_replicas=2, rank=1, seed=1).indices()
    child_perm = _in_child(lambda: croupier.permutation(n, seed=1))
    child_share = _in_child(lambda: DistributedSampler(n, num_replicas=2, rank=1, seed=1).indices())
    assert np.array_equal(child_perm, perm), "the same result in the child"
    assert np.array_equal(child_share, share)
    # and the parent still works, and so does a grandchild
    assert np.array_equal(croupier.permutation(n, seed=1), perm)
    grand = _in_child(lambda: _in_child(lambda: croupier.permutation(n, seed=1)))
    assert np.array_equal(grand, perm)


class _CallsCroupier:
    """A dataset whose items are computed by croupier, as a worker would."""

    def __len__(self) -> int:
        return 8

    def __getitem__(self, i: int) -> int:
        return int(croupier.permutation(1_000_000, seed=i)[0])


# torch warns when a machine has fewer CPUs than workers; the test is about correctness.
@pytest.mark.filterwarnings("ignore:This DataLoader will create:UserWarning")
def test_dataloader_workers_forked_after_croupier_ran():
    torch = pytest.importorskip("torch")
    from torch.utils.data import DataLoader

    croupier.permutation(1_000_000)  # the parent's pool now exists
    want = [int(croupier.permutation(1_000_000, seed=i)[0]) for i in range(8)]
    loader = DataLoader(
        _CallsCroupier(),
        batch_size=2,
        num_workers=2,
        multiprocessing_context="fork",
        timeout=60,
    )
    got = torch.cat(list(loader)).tolist()
    assert got == want


def test_numpy_api_is_loaded_at_import_not_on_first_use():
    # A first call that had to import numpy's C API could be interrupted in that import and
    # turn it into a PanicException; after `import croupier` nothing is imported any more.
    code = textwrap.dedent(
        """
        import sys
        import croupier._core as core
        for name in ("numpy.core.multiarray", "numpy._core.multiarray"):
            sys.modules[name] = None  # any import of it now fails
        print(core.permutation(10, 0, 0).tolist())
        """
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert sorted(eval(out.stdout)) == list(range(10))


def test_concurrent_use_from_threads_gives_the_serial_results():
    # The compiled module declares that it does not need the GIL (free-threaded Python): calls
    # from many threads at once, on shared and separate objects, give what serial calls give.
    from concurrent.futures import ThreadPoolExecutor

    shared = DistributedSampler(2_000_003, num_replicas=3, rank=2, seed=5)

    def work(k: int) -> list[np.ndarray]:
        s = DistributedSampler(500_000 + k, num_replicas=1 + k % 4, rank=k % (1 + k % 4), seed=k)
        s.set_epoch(k)
        shared_deal = shared._deal  # one frozen core object used by every thread
        return [
            croupier.permutation(300_000 + k, seed=k),
            s.indices(),
            shared_deal.indices(k % 3, 1000 * k, 1000 * k + 5000),
        ]

    serial = [work(k) for k in range(16)]
    with ThreadPoolExecutor(max_workers=8) as pool:
        threaded = list(pool.map(work, range(16)))
    for a, b in zip(serial, threaded, strict=True):
        for x, y in zip(a, b, strict=True):
            assert np.array_equal(x, y)


@pytest.mark.parametrize(
    ("call", "words"),
    [
        (
            "DistributedSampler(10**8, num_replicas=2, rank=0, order='torch').indices()",
            "torch's order",
        ),
        ("DistributedSampler(10**9, num_replicas=1, rank=0).indices()", "this rank's indices"),
        ("croupier.permutation(10**8)", "the permutation"),
        (
            "croupier.BucketBatchSampler(np.ones(2 * 10**7, np.uint32), batch_size=1,"
            " num_replicas=1, rank=0).batches()",
            "the epoch's bucket orders",
        ),
    ],
)
def test_what_cannot_fit_is_refused_before_any_work(call, words):
    # CROUPIER_MEMORY_LIMIT caps what croupier may take (as a container's cgroup limit would).
    code = textwrap.dedent(
        f"""
        import numpy as np
        import croupier
        from croupier import DistributedSampler
        try:
            {call}
        except MemoryError as e:
            print(e)
        """
    )
    env = {**os.environ, "CROUPIER_MEMORY_LIMIT": str(200 * 2**20)}
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True
    )
    assert words in out.stdout and "GiB" in out.stdout and "available" in out.stdout, out.stdout


def test_streaming_and_small_calls_pass_the_memory_check():
    code = textwrap.dedent(
        """
        from croupier import DistributedSampler
        s = DistributedSampler(2**40, num_replicas=2, rank=0, shuffle=False)
        it = iter(s)
        print(sum(next(it) for _ in range(100_000)))
        print(len(DistributedSampler(10**6, num_replicas=8, rank=1).indices()))
        """
    )
    env = {**os.environ, "CROUPIER_MEMORY_LIMIT": str(200 * 2**20)}
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True
    )
    assert out.stdout.split() == [str(sum(range(0, 200_000, 2))), "125000"]


_INTERRUPTED = """
import sys, time
import croupier
call = {call!r}
# Built before "started": it imports torch, and a SIGINT inside torch's import aborts the
# process in torch's C++ (pybind11), which is not what this test is about.
if call == "torch-order share":
    sampler = croupier.DistributedSampler(400_000_000, 1, 0, order="torch")
elif call == "per-rank-order share":
    sampler = croupier.DistributedSampler(2_000_000_000, 2, 0)
elif call == "mixture":
    sizes = [i * 20_000_000 for i in range(101)]
    sampler = croupier.MixtureSampler(sizes, list(range(1, 101)), 2, 0)
elif call == "legacy shuffle":
    import numpy as np
    from croupier.compat.numpy import legacy_shuffle
    x = np.arange(300_000_000, dtype=np.uint32)
    state = np.random.RandomState(0)
    before = state.get_state()
elif call == "megatron blend":
    import numpy as np
    from croupier.compat.megatron import build_blending_indices
    w = np.random.default_rng(0).random(100)
    w /= w.sum()
    index, sample = np.zeros(200_000_000, np.int16), np.zeros(200_000_000, np.int64)
elif call == "megatron shuffle index":
    import numpy as np
    from croupier.compat.megatron import build_shuffle_index
    state = np.random.RandomState(0)
    before = state.get_state()
elif call == "megatron sample index":
    import numpy as np
    from croupier.compat.megatron import build_sample_idx
    n = 200_000_000
    sizes = np.full(n, 1000, np.int32)
    docs = (np.arange(n, dtype=np.int64) * 48_271 % n).astype(np.int32)  # read at random
elif call == "megatron random sampler":
    from croupier.compat.megatron import MegatronPretrainingRandomSampler
    sampler = MegatronPretrainingRandomSampler(None, 400_000_000, 0, 4, 0, 1, False)
print("started", flush=True)
try:
    if call == "permutation":
        croupier.permutation(600_000_000, seed=1)
    elif call == "legacy shuffle":
        legacy_shuffle(x, state)
    elif call == "megatron blend":
        build_blending_indices(index, sample, w, 100, len(index), False)
    elif call == "megatron shuffle index":
        build_shuffle_index(300_000_000, 300_000_000, state)
    elif call == "megatron sample index":
        build_sample_idx(sizes, docs, 4096, 1, 1000 * n, True, True)
    elif call == "megatron random sampler":
        next(iter(sampler))
    else:
        sampler.indices()
except KeyboardInterrupt:
    print("interrupted", flush=True)
    if call in ("legacy shuffle", "megatron shuffle index"):
        after = state.get_state()
        if after[2] != before[2] or (after[1] != before[1]).any():
            print("the RandomState moved", flush=True)
            sys.exit(6)
    # Nothing keeps running behind: no thread of the call left, no CPU spent afterwards.
    import os
    time.sleep(0.2)
    if sys.platform == "linux":
        tasks = os.listdir("/proc/self/task")
        names = []
        for t in tasks:
            try:
                with open(f"/proc/self/task/{{t}}/comm") as f:
                    names.append(f.read().strip())
            except OSError:
                pass
        if any(n.startswith("croupier-call") for n in names):
            print("threads left:", names, flush=True)
            sys.exit(4)
    used = time.process_time()
    time.sleep(0.5)
    if time.process_time() - used > 0.2:
        print("CPU still in use after the interrupt", flush=True)
        sys.exit(5)
    sys.exit(3)
sys.exit(0)
"""


@pytest.mark.parametrize(
    "call",
    [
        "permutation",
        "torch-order share",
        "per-rank-order share",
        "mixture",
        "legacy shuffle",
        "megatron blend",
        "megatron shuffle index",
        # Its inputs (2 x 800 MB, read at random) take seconds to build: with the slow tests.
        pytest.param("megatron sample index", marks=pytest.mark.slow),
        "megatron random sampler",
    ],
)
@pytest.mark.parametrize("delay", [0.05, 0.5])
def test_ctrl_c_interrupts_a_long_call_promptly(call, delay):
    # A long call waits for its result in slices of 10 ms, checking Python's signals: Ctrl-C
    # raises the call's cancellation flag, the core's loops stop at their next look at it,
    # and KeyboardInterrupt reaches the caller with no thread of the call left running.
    import signal
    import time

    p = subprocess.Popen(
        [sys.executable, "-c", _INTERRUPTED.format(call=call)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    out = err = ""
    try:
        assert p.stdout is not None and p.stdout.readline().strip() == "started"
        # Early (the permutation's label counting once ignored the flag for its first
        # second) and well inside the call (several seconds uninterrupted).
        time.sleep(delay)
        sent = time.monotonic()
        p.send_signal(signal.SIGINT)
        line = p.stdout.readline().strip()
        waited = time.monotonic() - sent
        p.wait(timeout=60)
    finally:
        if p.poll() is None:
            p.kill()
        out, err = p.communicate()
    assert line == "interrupted" and p.returncode == 3, (
        f"KeyboardInterrupt reached the caller and nothing ran behind it ({line} {out} {err})"
    )
    # The stopped work says nothing: no panic message from a thread of the call.
    assert "panicked" not in err, err
    assert waited < 1.0, f"KeyboardInterrupt came {waited:.2f} s after Ctrl-C"


_FIRST_INDEX_THREADS = """
import os, sys
import croupier

def threads():
    return len(os.listdir("/proc/self/task"))

before = threads()
n = 10**9
firsts = []
for shuffle in (True, False):
    s = croupier.DistributedSampler(n, num_replicas=8, rank=3, shuffle=shuffle, seed=4)
    s.set_epoch(2)
    firsts.append(next(iter(s)))
    # A resume's first index: a fresh sampler, a checkpoint at mid-epoch loaded.
    s.set_skip(len(s) // 2)
    state = s.state_dict()
    r = croupier.DistributedSampler(n, num_replicas=8, rank=3, shuffle=shuffle, seed=4)
    r.load_state_dict(state)
    firsts.append(next(iter(r)))
during = threads()
croupier.permutation(1 << 22)  # a call that needs the pool starts it
print(before, during, threads(), *firsts)
"""


@pytest.mark.skipif(sys.platform != "linux", reason="counts threads in /proc/self/task")
def test_a_fresh_processs_first_index_starts_no_thread():
    # The first window of the global order (and of an unshuffled share) runs on the calling
    # thread: a process that only takes first indices and resumes never starts croupier's
    # thread pool (which costs a few tenths of a millisecond). The count can fail: the
    # permutation after them does start the pool.
    out = subprocess.run(
        [sys.executable, "-c", _FIRST_INDEX_THREADS],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    ).stdout.split()
    before, during, after = (int(x) for x in out[:3])
    assert during == before, f"threads {before} -> {during} for first indices"
    assert after > during, "the pool's threads were not seen: the count measures nothing"
    # The same indices as the pooled path gives (ranges past the inline length).
    expected = []
    for shuffle in (True, False):
        share = croupier._core.RankShare(
            n=10**9,
            num_replicas=8,
            rank=3,
            shuffle=shuffle,
            seed=4,
            drop_last=False,
            order=croupier._core.Order.GLOBAL,
        )
        mid = share.num_samples // 2
        for start in (0, mid):
            expected.append(int(share.indices(2, start, start + (1 << 15))[0]))
    assert [int(x) for x in out[3:]] == expected
