"""Checks of the arguments of the public entry points, run before any call into C: a wrong argument
becomes a ValueError or TypeError that names it, never a crash of the Jupyter kernel. This module
imports no other part of lessonkit but the header's sizes and the language (the cache checks its own
arguments, ``lessonkit.native.library`` a library handed in)."""
from __future__ import annotations

import math
import numbers

import numpy as np

from .header import HD_MAX as HEAD_DIM_MAX  # the kernel's fixed Q buffers
from .header import QBLK as QBLOCK  # Q is quantized in blocks of QBLK values
from .language import _

C_INT_MAX = 2**31 - 1  # the C functions take their counts and sizes as int
FLOAT32_MAX = float(np.finfo(np.float32).max)  # larger values become inf when cffi hands them to C


def head_dim(value) -> int:
    value = integer("head_dim", value, minimum=QBLOCK)
    if value % QBLOCK or value > HEAD_DIM_MAX:
        raise ValueError(_("head_dim must be a multiple of {QBLOCK} between {QBLOCK} and {HEAD_DIM_MAX} (the "
                           "kernel's fixed buffers); got {value}").format(
                           QBLOCK=QBLOCK, HEAD_DIM_MAX=HEAD_DIM_MAX, value=value))
    return value


def _scalar(value):
    """A 0-d numpy array as its numpy scalar (np.array(3) is no numbers.Integral); others unchanged."""
    if isinstance(value, np.ndarray) and value.ndim == 0:
        return value[()]
    return value


def integer(name: str, value, minimum: int | None = None, below: int | None = None) -> int:
    """An int (a numpy integer or a 0-d integer array too, a bool not) within [minimum, below)."""
    value = _scalar(value)
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Integral):
        raise TypeError(_("{name} must be an int; got {value} {short_value}").format(
                          name=name, value=type(value).__name__, short_value=short(value)))
    value = int(value)
    if minimum is not None and value < minimum:
        raise ValueError(_("{name} must be at least {minimum}; got {short_value}").format(
                           name=name, minimum=minimum, short_value=short(value)))
    if below is not None and value >= below:
        raise ValueError(_("{name} must be below {below}; got {short_value}").format(
                           name=name, below=below, short_value=short(value)))
    return value


def c_int(name: str, value, minimum: int = 0, below: int | None = None) -> int:
    """An integer that a C function takes as ``int``: also below 2**31."""
    limit = C_INT_MAX + 1 if below is None else min(below, C_INT_MAX + 1)
    return integer(name, value, minimum=minimum, below=limit)


def finite_float(name: str, value, minimum: float | None = None, maximum: float | None = None) -> float:
    """A finite real number (a numpy scalar or 0-d array too, a bool not), within [minimum, maximum]."""
    value = _scalar(value)
    if isinstance(value, np.ndarray):
        raise TypeError(_("{name} must be one number; got an array of shape {shape_value} (pick one element, e.g. "
                          "float({name}[0]))").format(name=name, shape_value=list(value.shape)))
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Real):
        raise TypeError(_("{name} must be a real number; got {value} {short_value}").format(
                          name=name, value=type(value).__name__, short_value=short(value)))
    try:
        value = float(value)
    except OverflowError:  # an int beyond float's range, e.g. 10**400
        raise ValueError(_("{name} must be finite; got {short_value}, beyond the range of a float").format(
                           name=name, short_value=short(value))) from None
    if not math.isfinite(value):
        raise ValueError(_("{name} must be finite; got {value}").format(name=name, value=value))
    if minimum is not None and value < minimum:
        raise ValueError(_("{name} must be at least {minimum:g}; got {value:g}").format(
                           name=name, minimum=minimum, value=value))
    if maximum is not None and value > maximum:
        raise ValueError(_("{name} must be at most {maximum:g}; got {value:g}").format(
                           name=name, maximum=maximum, value=value))
    return value


def scale(value, head_dim: int | None = None, name: str = "scale") -> float:
    """The kernel's ``float scale``: None gives 1/sqrt(head_dim); else a finite real number that
    float32 can hold. A Python float such as 1e39 is finite, but cffi converts it to the C float
    inf, and every score becomes inf or NaN; so |scale| must be at most float32's largest value
    (about 3.4e38). Every entry point that takes ``scale`` checks it here."""
    if value is None:
        if head_dim is None:
            raise TypeError(_("{name} must be a real number; got None").format(name=name))
        return 1.0 / math.sqrt(head_dim)
    value = finite_float(name, value)
    if abs(value) > FLOAT32_MAX:
        raise ValueError(_("{name} must be at most {FLOAT32_MAX:.7g} in magnitude (the largest float32: the kernel "
                           "takes a C float, in which {value:g} is inf); got {value:g}").format(
                           name=name, FLOAT32_MAX=FLOAT32_MAX, value=value))
    return value


# ----------------------------------------------------------------------------- arrays

def base_array(name: str, a) -> np.ndarray:
    """``a`` as a plain numpy ndarray (the same memory, never a copy).

    A masked array is refused: C reads every entry, masked or not, so a masked NaN would reach the
    kernel as if it were data. Other subclasses (np.memmap, np.matrix, ...) are viewed as the base
    class, so that their shape, dtype and flags are the ones of the memory C reads, whatever the
    subclass overrides; the checks that follow look at that view."""
    if not isinstance(a, np.ndarray):
        raise TypeError(_("{name} must be a numpy array; got {a}").format(name=name, a=type(a).__name__))
    if isinstance(a, np.ma.MaskedArray):
        raise TypeError(_("{name} is a masked array: the kernel has no mask and would read the masked entries as "
                          "data; pass {name}.filled(value) (e.g. {name}.filled(0)) or drop the masked rows").format(
                          name=name))
    if type(a) is not np.ndarray:
        a = np.ndarray.view(a, np.ndarray)  # the base class's view: no subclass method runs on it
    return a


def _shape(name: str, a: np.ndarray, shape: tuple) -> None:
    if a.ndim != len(shape) or any(want is not None and got != want
                                   for got, want in zip(a.shape, shape)):
        want = "[" + ", ".join("n" if s is None else str(s) for s in shape) + "]"
        raise ValueError(_("{name} must have shape {want}; got {shape_a}").format(
                           name=name, want=want, shape_a=list(a.shape)))


def _layout(name: str, a: np.ndarray, writable: bool) -> None:
    if not a.flags.c_contiguous:
        raise ValueError(_("{name} must be C-contiguous (a slice or transpose is not); pass "
                           "np.ascontiguousarray({name})").format(name=name))
    if not a.flags.aligned:
        raise ValueError(_("{name} is not aligned to its {itemsize}-byte elements (a view into a byte buffer at an "
                           "odd offset); pass {name}.copy()").format(name=name, itemsize=a.itemsize))
    if writable and not a.flags.writeable:
        raise ValueError(_("{name} must be writable (the function writes its result there); pass a new array, e.g. "
                           "np.empty({shape_a}, np.{name2})").format(
                           name=name, shape_a=list(a.shape), name2=a.dtype.name))


def _dtype(name: str, a: np.ndarray, dtype) -> None:
    want = np.dtype(dtype)
    if a.dtype != want:  # a byte-swapped float32 ('>f4') differs too: C reads native order
        got = a.dtype.str if a.dtype.name == want.name else a.dtype
        raise TypeError(_("{name} must have dtype {name2}; got {got} (convert with {name}.astype(np.{name2}))").format(
                          name=name, name2=want.name, got=got))


def float32_array(name: str, a, shape: tuple, writable: bool = False, finite: bool = True) -> np.ndarray:
    """A C-contiguous, aligned, finite float32 numpy array of the given shape (None: any length
    there), as a plain ndarray (see ``base_array``). ``writable``: C writes into it (then its
    values are not checked)."""
    a = base_array(name, a)
    _dtype(name, a, np.float32)
    _shape(name, a, shape)
    _layout(name, a, writable)
    if finite and not writable and not np.isfinite(a).all():
        bad = np.argwhere(~np.isfinite(a))[0]
        where = tuple(int(i) for i in bad)
        raise ValueError(_("{name} holds NaN or Inf (first at index {where}); the kernel needs finite values").format(
                           name=name, where=where))
    return a


def float32_like(name: str, a, shape: tuple) -> np.ndarray:
    """Like ``float32_array``, for helpers that have always converted their input: a list or an
    array of another real dtype becomes a C-contiguous float32 copy first (a masked array is still
    refused, and values beyond float32's range become inf, which the finiteness check reports)."""
    if isinstance(a, np.ma.MaskedArray):
        base_array(name, a)  # raises, with the message about .filled
    if not isinstance(a, np.ndarray):
        if isinstance(a, (str, bytes)) or not hasattr(a, "__len__"):
            raise TypeError(_("{name} must be a numpy array or a list of numbers; got {a}").format(
                              name=name, a=type(a).__name__))
        try:
            a = np.asarray(a)
        except (TypeError, ValueError) as e:
            raise TypeError(_("{name} must be a numpy array or a list of numbers: {e}").format(name=name, e=e)) from None
    a = base_array(name, a)
    if a.dtype.kind not in "fiu":
        raise TypeError(_("{name} must hold real numbers; got dtype {dtype}").format(name=name, dtype=a.dtype))
    if a.dtype != np.float32 or not (a.flags.c_contiguous and a.flags.aligned):
        _shape(name, a, shape)  # before the copy: no copy of an array of the wrong size
        with np.errstate(over="ignore"):
            a = np.ascontiguousarray(a, np.float32)
    return float32_array(name, a, shape)


# ----------------------------------------------------------------------------- sizes

def at_most(name: str, value: int, cap: int, why: str) -> int:
    """Refuse a count above a documented cap, naming the cap and why it is there."""
    if value > cap:
        raise ValueError(_("{name} = {short_value} is above the cap of {cap} ({why}); use at most {cap}").format(
                           name=name, short_value=short(value), cap=cap, why=why))
    return value


def memory(what: str, nbytes: int, cap: int, fix: str | None = None) -> int:
    """Refuse what would allocate more than ``cap`` bytes, before allocating it; ``fix`` says how."""
    if nbytes > cap:
        fix = fix or _("ask for less")
        raise ValueError(_("{what} would need {nbytes:,.0f} MiB, above the cap of {cap:,.0f} MiB that keeps the "
                           "notebook's process alive; {fix}").format(
                           what=what, nbytes=nbytes / 2 ** 20, cap=cap / 2 ** 20, fix=fix))
    return nbytes


def short(value, limit: int = 60) -> str:
    """A repr for messages that never fails and never grows: a huge int (whose str() Python refuses
    beyond 4300 digits) is shown by its number of bits, a long repr is cut."""
    if isinstance(value, numbers.Integral) and not isinstance(value, bool) and abs(int(value)).bit_length() > 64:
        return f"<an int of {abs(int(value)).bit_length()} bits>"
    try:
        text = repr(value)
    except Exception:  # noqa: BLE001 - a broken __repr__ must not hide the real message
        text = f"<{type(value).__name__}>"
    return text if len(text) <= limit else text[:limit - 5] + " ...>"


def one_of(name: str, value, options) -> str:
    """``value`` if it is one of ``options`` (names such as a backend's); ValueError otherwise."""
    if not isinstance(value, str) or value not in options:
        names = ", ".join(map(repr, options))
        raise ValueError(_("{name} must be one of {names}; got {short_value}").format(
                           name=name, names=names, short_value=short(value)))
    return value


def flag(name: str, value) -> bool:
    if not isinstance(value, bool):
        raise TypeError(_("{name} must be True or False; got {short_value}").format(
                          name=name, short_value=short(value)))
    return value
