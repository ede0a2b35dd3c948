"""numpy's legacy ``RandomState.shuffle``, exactly: the same order from the same state, and the
``RandomState`` left in the state numpy's own shuffle leaves it, so code that shuffles several
times with one state (Megatron-Core's dataset indices) gets the same arrays throughout.

The Mersenne Twister and numpy's bounded draws run in croupier's core with the GIL released
(its swaps prefetched), and a large shuffle stops at Ctrl-C within milliseconds. Only the
legacy generator has this shuffle: ``numpy.random.Generator.shuffle`` draws differently.
"""

from __future__ import annotations

from typing import Any, cast

import numpy as np

from croupier import _core

__all__ = ["check_random_state", "legacy_shuffle"]


def check_random_state(random_state: object, name: str = "random_state") -> None:
    """Raises ``TypeError`` (naming ``name``) unless ``random_state`` is a legacy
    ``numpy.random.RandomState`` over the Mersenne Twister, the generator
    :func:`legacy_shuffle` reproduces."""
    if not isinstance(random_state, np.random.RandomState):
        raise TypeError(
            f"{name} must be a numpy.random.RandomState (numpy's legacy generator), got "
            f"{type(random_state).__name__}"
        )
    generator = random_state.get_state(legacy=False)["bit_generator"]
    if generator != "MT19937":
        raise TypeError(
            f"{name} must draw from the Mersenne Twister (MT19937) to shuffle as numpy's "
            f"legacy shuffle does, got a RandomState over {generator}"
        )


def legacy_shuffle(x: np.ndarray, random_state: np.random.RandomState) -> None:
    """Shuffles ``x`` in place along its first axis exactly as ``random_state.shuffle(x)``
    does, and advances ``random_state`` as that call would.

    ``x`` is a writable, C-contiguous numpy array (``numpy.ndarray`` or ``numpy.memmap``) of
    any non-object dtype (a 1-D array's elements, or an N-D array's rows, are reordered);
    ``random_state`` a ``numpy.random.RandomState`` over the Mersenne Twister (the default
    one and ``numpy.random.RandomState(seed)``). The shuffle holds ``random_state``'s lock, as
    numpy's does: another thread drawing from it, or shuffling with it, waits and then
    continues from the state this shuffle leaves. If interrupted (Ctrl-C), ``x`` is left
    partly shuffled and ``random_state`` unchanged.

    Raises:
        TypeError: ``x`` is not a numpy array with at least one dimension, is another
            subclass of it (``numpy.ma.MaskedArray``, ``numpy.matrix``: pass
            ``numpy.asarray(x)`` to shuffle the data alone), or holds Python objects;
            ``random_state`` is not a legacy ``RandomState`` over MT19937.
        ValueError: ``x`` is read-only or not C-contiguous.

    Example:
        >>> import numpy as np
        >>> from croupier.compat.numpy import legacy_shuffle
        >>> a, b = np.arange(10), np.arange(10)
        >>> ra, rb = np.random.RandomState(3), np.random.RandomState(3)
        >>> ra.shuffle(a)
        >>> legacy_shuffle(b, rb)
        >>> bool((a == b).all()), ra.randint(1000) == rb.randint(1000)
        (True, True)
    """
    check_random_state(random_state)
    if not isinstance(x, np.ndarray):
        raise TypeError(f"x must be a numpy array, got {type(x).__name__}")
    if type(x) is not np.ndarray and not isinstance(x, np.memmap):
        raise TypeError(
            f"x must be a numpy.ndarray or numpy.memmap, got the subclass {type(x).__name__} "
            "(numpy.asarray(x) shuffles its data alone)"
        )
    if x.ndim == 0:
        raise TypeError("x must have at least one dimension, got a 0-d array")
    if x.dtype.hasobject:
        raise TypeError(f"x must not hold Python objects, got dtype {x.dtype}")
    if not x.flags.writeable:
        raise ValueError("x is read-only: numpy's shuffle works in place")
    if not x.flags.c_contiguous:
        raise ValueError("x must be C-contiguous (numpy.ascontiguousarray(x) is a contiguous copy)")
    n = len(x)
    if n < 2 or x.size == 0:
        return  # numpy draws nothing (rows of no elements included)
    if x.nbytes == 0:
        # Elements of no bytes (dtype [] or V0): numpy swaps nothing but draws as for any
        # rows, so a stand-in of n one-byte rows takes the same draws.
        data, row = np.zeros(n, np.uint8), 1
    else:
        data, row = x.reshape(-1).view(np.uint8), x.nbytes // n
    # numpy's shuffle holds the generator's (reentrant) lock from its first draw to its
    # last: a thread sharing random_state waits for the state this shuffle leaves.
    with random_state._bit_generator.lock:
        # ("MT19937", key, pos, has_gauss, cached_gaussian): checked to be MT19937 above.
        legacy = cast("tuple[Any, ...]", random_state.get_state(legacy=True))
        key = np.array(legacy[1], dtype=np.uint32)
        pos = _core.legacy_shuffle(data, row, key, int(legacy[2]))
        random_state.set_state((legacy[0], key, pos, legacy[3], legacy[4]))
