"""Checks run before any call into C: a wrong argument becomes a ValueError or TypeError that
names the argument, never a crash of the Jupyter kernel. Shared by every entry point."""
from __future__ import annotations

import numbers

import numpy as np

QBLOCK = 32       # Q is quantized in 32-value blocks
HEAD_DIM_MAX = 256  # the kernel's fixed Q buffers


def head_dim(value) -> int:
    value = integer("head_dim", value, minimum=QBLOCK)
    if value % QBLOCK or value > HEAD_DIM_MAX:
        raise ValueError(f"head_dim must be a multiple of {QBLOCK} between {QBLOCK} and "
                         f"{HEAD_DIM_MAX} (the kernel's fixed buffers); got {value}")
    return value


def integer(name: str, value, minimum: int | None = None, below: int | None = None) -> int:
    """An int (a numpy integer too, a bool not) within [minimum, below)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name} must be an int; got {type(value).__name__} {value!r}")
    value = int(value)
    if minimum is not None and value < minimum:
        raise ValueError(f"{name} must be at least {minimum}; got {value}")
    if below is not None and value >= below:
        raise ValueError(f"{name} must be below {below}; got {value}")
    return value


def finite_float(name: str, value) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be a real number; got {type(value).__name__} {value!r}")
    value = float(value)
    if not np.isfinite(value):
        raise ValueError(f"{name} must be finite; got {value}")
    return value


def float32_array(name: str, a, shape: tuple) -> np.ndarray:
    """A C-contiguous, finite float32 numpy array of the given shape (None: any length there)."""
    if not isinstance(a, np.ndarray):
        raise TypeError(f"{name} must be a numpy array; got {type(a).__name__}")
    if a.dtype != np.float32:
        raise TypeError(f"{name} must have dtype float32; got {a.dtype} "
                        f"(convert with {name}.astype(np.float32))")
    if a.ndim != len(shape) or any(want is not None and got != want
                                   for got, want in zip(a.shape, shape)):
        want = "[" + ", ".join("n" if s is None else str(s) for s in shape) + "]"
        raise ValueError(f"{name} must have shape {want}; got {list(a.shape)}")
    if not a.flags.c_contiguous:
        raise ValueError(f"{name} must be C-contiguous (a slice or transpose is not); "
                         f"pass np.ascontiguousarray({name})")
    if not np.isfinite(a).all():
        bad = np.argwhere(~np.isfinite(a))[0]
        raise ValueError(f"{name} holds NaN or Inf (first at index {tuple(int(i) for i in bad)}); "
                         "the kernel needs finite values")
    return a
