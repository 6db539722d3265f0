"""Checks of the arguments of the public entry points, run before any call into C: a wrong argument
becomes a ValueError or TypeError that names it, never a crash of the Jupyter kernel. This module
imports no other part of lessonkit but the header's sizes and the language (the cache checks its own
arguments, ``lessonkit.native.library`` a library handed in)."""
from __future__ import annotations

import math
import numbers

import numpy as np

from .language import tr
from .header import HD_MAX as HEAD_DIM_MAX  # the kernel's fixed Q buffers
from .header import QBLK as QBLOCK  # Q is quantized in blocks of QBLK values
C_INT_MAX = 2**31 - 1  # the C functions take their counts and sizes as int
FLOAT32_MAX = float(np.finfo(np.float32).max)  # larger values become inf when cffi hands them to C


def head_dim(value) -> int:
    value = integer("head_dim", value, minimum=QBLOCK)
    if value % QBLOCK or value > HEAD_DIM_MAX:
        raise ValueError(tr(f"head_dim must be a multiple of {QBLOCK} between {QBLOCK} and "
                            f"{HEAD_DIM_MAX} (the kernel's fixed buffers); got {value}",
                            f"head_dim 必须是 {QBLOCK} 的倍数，在 {QBLOCK} 到 {HEAD_DIM_MAX} 之间"
                            f"（内核的缓冲区大小是固定的）；收到的是 {value}"))
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
        raise TypeError(tr(f"{name} must be an int; got {type(value).__name__} {short(value)}",
                           f"{name} 必须是 int；收到的是 {type(value).__name__} {short(value)}"))
    value = int(value)
    if minimum is not None and value < minimum:
        raise ValueError(tr(f"{name} must be at least {minimum}; got {short(value)}",
                            f"{name} 至少要是 {minimum}；收到的是 {short(value)}"))
    if below is not None and value >= below:
        raise ValueError(tr(f"{name} must be below {below}; got {short(value)}",
                            f"{name} 必须小于 {below}；收到的是 {short(value)}"))
    return value


def c_int(name: str, value, minimum: int = 0, below: int | None = None) -> int:
    """An integer that a C function takes as ``int``: also below 2**31."""
    limit = C_INT_MAX + 1 if below is None else min(below, C_INT_MAX + 1)
    return integer(name, value, minimum=minimum, below=limit)


def finite_float(name: str, value, minimum: float | None = None, maximum: float | None = None) -> float:
    """A finite real number (a numpy scalar or 0-d array too, a bool not), within [minimum, maximum]."""
    value = _scalar(value)
    if isinstance(value, np.ndarray):
        raise TypeError(tr(f"{name} must be one number; got an array of shape {list(value.shape)} "
                           f"(pick one element, e.g. float({name}[0]))",
                           f"{name} 必须是单个数；收到的是形状为 {list(value.shape)} 的数组"
                           f"（取其中一个元素，例如 float({name}[0])）"))
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Real):
        raise TypeError(tr(f"{name} must be a real number; got {type(value).__name__} {short(value)}",
                           f"{name} 必须是实数；收到的是 {type(value).__name__} {short(value)}"))
    try:
        value = float(value)
    except OverflowError:  # an int beyond float's range, e.g. 10**400
        raise ValueError(tr(f"{name} must be finite; got {short(value)}, beyond the range of a float",
                            f"{name} 必须是有限值；收到的 {short(value)} 超出了 float 的范围")) from None
    if not math.isfinite(value):
        raise ValueError(tr(f"{name} must be finite; got {value}", f"{name} 必须是有限值；收到的是 {value}"))
    if minimum is not None and value < minimum:
        raise ValueError(tr(f"{name} must be at least {minimum:g}; got {value:g}",
                            f"{name} 至少要是 {minimum:g}；收到的是 {value:g}"))
    if maximum is not None and value > maximum:
        raise ValueError(tr(f"{name} must be at most {maximum:g}; got {value:g}",
                            f"{name} 最多只能是 {maximum:g}；收到的是 {value:g}"))
    return value


def scale(value, head_dim: int | None = None, name: str = "scale") -> float:
    """The kernel's ``float scale``: None gives 1/sqrt(head_dim); else a finite real number that
    float32 can hold. A Python float such as 1e39 is finite, but cffi converts it to the C float
    inf, and every score becomes inf or NaN; so |scale| must be at most float32's largest value
    (about 3.4e38). Every entry point that takes ``scale`` checks it here."""
    if value is None:
        if head_dim is None:
            raise TypeError(tr(f"{name} must be a real number; got None", f"{name} 必须是实数；收到的是 None"))
        return 1.0 / math.sqrt(head_dim)
    value = finite_float(name, value)
    if abs(value) > FLOAT32_MAX:
        raise ValueError(tr(f"{name} must be at most {FLOAT32_MAX:.7g} in magnitude (the largest float32: the "
                            f"kernel takes a C float, in which {value:g} is inf); got {value:g}",
                            f"{name} 的绝对值最多只能是 {FLOAT32_MAX:.7g}（float32 的最大值：内核接收的是 C 的 "
                            f"float，{value:g} 在其中是 inf）；收到的是 {value:g}"))
    return value


# ----------------------------------------------------------------------------- arrays

def base_array(name: str, a) -> np.ndarray:
    """``a`` as a plain numpy ndarray (the same memory, never a copy).

    A masked array is refused: C reads every entry, masked or not, so a masked NaN would reach the
    kernel as if it were data. Other subclasses (np.memmap, np.matrix, ...) are viewed as the base
    class, so that their shape, dtype and flags are the ones of the memory C reads, whatever the
    subclass overrides; the checks that follow look at that view."""
    if not isinstance(a, np.ndarray):
        raise TypeError(tr(f"{name} must be a numpy array; got {type(a).__name__}",
                           f"{name} 必须是 numpy 数组；收到的是 {type(a).__name__}"))
    if isinstance(a, np.ma.MaskedArray):
        raise TypeError(tr(f"{name} is a masked array: the kernel has no mask and would read the masked entries "
                           f"as data; pass {name}.filled(value) (e.g. {name}.filled(0)) or drop the masked rows",
                           f"{name} 是掩码数组（masked array）：内核没有掩码，会把被遮住的元素当成数据读进去；"
                           f"请传入 {name}.filled(value)（例如 {name}.filled(0)），或者去掉被遮住的行"))
    if type(a) is not np.ndarray:
        a = np.ndarray.view(a, np.ndarray)  # the base class's view: no subclass method runs on it
    return a


def _shape(name: str, a: np.ndarray, shape: tuple) -> None:
    if a.ndim != len(shape) or any(want is not None and got != want
                                   for got, want in zip(a.shape, shape)):
        want = "[" + ", ".join("n" if s is None else str(s) for s in shape) + "]"
        raise ValueError(tr(f"{name} must have shape {want}; got {list(a.shape)}",
                            f"{name} 的形状必须是 {want}；收到的是 {list(a.shape)}"))


def _layout(name: str, a: np.ndarray, writable: bool) -> None:
    if not a.flags.c_contiguous:
        raise ValueError(tr(f"{name} must be C-contiguous (a slice or transpose is not); "
                            f"pass np.ascontiguousarray({name})",
                            f"{name} 必须是 C 连续的（切片或转置都不是）；请传入 np.ascontiguousarray({name})"))
    if not a.flags.aligned:
        raise ValueError(tr(f"{name} is not aligned to its {a.itemsize}-byte elements (a view into a byte buffer "
                            f"at an odd offset); pass {name}.copy()",
                            f"{name} 没有按它 {a.itemsize} 字节的元素对齐（它是字节缓冲区在奇数偏移处的视图）；"
                            f"请传入 {name}.copy()"))
    if writable and not a.flags.writeable:
        raise ValueError(tr(f"{name} must be writable (the function writes its result there); "
                            f"pass a new array, e.g. np.empty({list(a.shape)}, np.{a.dtype.name})",
                            f"{name} 必须可写（函数要把结果写进去）；"
                            f"请传入一个新数组，例如 np.empty({list(a.shape)}, np.{a.dtype.name})"))


def _dtype(name: str, a: np.ndarray, dtype) -> None:
    want = np.dtype(dtype)
    if a.dtype != want:  # a byte-swapped float32 ('>f4') differs too: C reads native order
        got = a.dtype.str if a.dtype.name == want.name else a.dtype
        raise TypeError(tr(f"{name} must have dtype {want.name}; got {got} "
                           f"(convert with {name}.astype(np.{want.name}))",
                           f"{name} 的 dtype 必须是 {want.name}；收到的是 {got}"
                           f"（用 {name}.astype(np.{want.name}) 转换）"))


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
        raise ValueError(tr(f"{name} holds NaN or Inf (first at index {where}); "
                            "the kernel needs finite values",
                            f"{name} 里有 NaN 或 Inf（第一个在下标 {where}）；内核需要有限值"))
    return a


def float32_like(name: str, a, shape: tuple) -> np.ndarray:
    """Like ``float32_array``, for helpers that have always converted their input: a list or an
    array of another real dtype becomes a C-contiguous float32 copy first (a masked array is still
    refused, and values beyond float32's range become inf, which the finiteness check reports)."""
    if isinstance(a, np.ma.MaskedArray):
        base_array(name, a)  # raises, with the message about .filled
    if not isinstance(a, np.ndarray):
        if isinstance(a, (str, bytes)) or not hasattr(a, "__len__"):
            raise TypeError(tr(f"{name} must be a numpy array or a list of numbers; got {type(a).__name__}",
                               f"{name} 必须是 numpy 数组或数字列表；收到的是 {type(a).__name__}"))
        try:
            a = np.asarray(a)
        except (TypeError, ValueError) as e:
            raise TypeError(tr(f"{name} must be a numpy array or a list of numbers: {e}",
                               f"{name} 必须是 numpy 数组或数字列表：{e}")) from None
    a = base_array(name, a)
    if a.dtype.kind not in "fiu":
        raise TypeError(tr(f"{name} must hold real numbers; got dtype {a.dtype}",
                           f"{name} 里必须是实数；收到的 dtype 是 {a.dtype}"))
    if a.dtype != np.float32 or not (a.flags.c_contiguous and a.flags.aligned):
        _shape(name, a, shape)  # before the copy: no copy of an array of the wrong size
        with np.errstate(over="ignore"):
            a = np.ascontiguousarray(a, np.float32)
    return float32_array(name, a, shape)


def int8_array(name: str, a, shape: tuple, writable: bool = False) -> np.ndarray:
    """A C-contiguous int8 numpy array of the given shape, as a plain ndarray; ``writable``: C
    writes into it."""
    a = base_array(name, a)
    _dtype(name, a, np.int8)
    _shape(name, a, shape)
    _layout(name, a, writable)
    return a


# ----------------------------------------------------------------------------- sizes

def at_most(name: str, value: int, cap: int, why: str) -> int:
    """Refuse a count above a documented cap, naming the cap and why it is there."""
    if value > cap:
        raise ValueError(tr(f"{name} = {short(value)} is above the cap of {cap} ({why}); use at most {cap}",
                            f"{name} = {short(value)} 超过了上限 {cap}（{why}）；最多用 {cap}"))
    return value


def memory(what: str, nbytes: int, cap: int, fix: str | None = None) -> int:
    """Refuse what would allocate more than ``cap`` bytes, before allocating it; ``fix`` says how."""
    if nbytes > cap:
        fix = fix or tr("ask for less", "请少要一些")
        raise ValueError(tr(f"{what} would need {nbytes / 2**20:,.0f} MiB, above the cap of {cap / 2**20:,.0f} MiB "
                            f"that keeps the notebook's process alive; {fix}",
                            f"{what} 需要 {nbytes / 2**20:,.0f} MiB，超过了 {cap / 2**20:,.0f} MiB 的上限"
                            f"（这个上限保证 notebook 的进程不被撑垮）；{fix}"))
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
        raise ValueError(tr(f"{name} must be one of {names}; got {short(value)}",
                            f"{name} 只能是 {names} 之一；你给的是 {short(value)}"))
    return value


def flag(name: str, value) -> bool:
    if not isinstance(value, bool):
        raise TypeError(tr(f"{name} must be True or False; got {short(value)}",
                           f"{name} 只能是 True 或 False；你给的是 {short(value)}"))
    return value
