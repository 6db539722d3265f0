"""A student's answers as data, from their kernel to the grader's check (``python -m workbench grade``).

The graded copy of a notebook runs ``capture(...)`` right after each exercise's answer cell, in the
student's own kernel. It writes the variables that the lesson's check call passes (``answer1``, or
``transcript`` and ``answers``) as JSON: plain values only, tagged where JSON has no such type
(a tuple, an int-keyed dict, a path, ``...``). The check then runs in another process that never
imports anything of the student's, on what ``decode`` rebuilds from that file. So no object of the
notebook (an answer whose ``__eq__`` says yes to everything, a patched check) reaches the check.

JSON and not pickle: unpickling runs whatever code the file names. Written here rather than taken
from a library because no serializer keeps exactly these types and refuses the rest, within limits.
Standard library only: it is imported in the student's kernel.
"""
from __future__ import annotations

import json
import math
import os
import sys
from pathlib import Path, PurePath

MAX_ITEMS = 20_000      # values in one answer: twice lessonkit's MAX_ANSWER_ITEMS, so that it decides
MAX_DEPTH = 20          # nesting (lessonkit refuses more than 16)
MAX_CHARS = 2_000_000   # all the strings of one answer together (a pasted debugger session is ~100 kB)
MAX_DIGITS = 400        # a whole number longer than this is kept as its first digits, unreadable
MAX_FILE_BYTES = 8 * MAX_CHARS   # the most decode reads


class Opaque:
    """Something the student gave that is not plain data (an object, a function, too large an
    answer): its type and a short repr, for the check to refuse by name."""

    def __init__(self, kind: str, shown: str):
        self.kind, self.shown = kind, shown

    def __repr__(self) -> str:
        return self.shown

    __str__ = __repr__


class _TooLarge(Exception):
    pass


def encode(value) -> object:
    """``value`` as JSON-ready data; what is not plain data becomes an opaque tag."""
    budget = {"items": MAX_ITEMS, "chars": MAX_CHARS}
    try:
        return _encode(value, 0, budget)
    except _TooLarge as e:
        return {"$": "opaque", "kind": "too large", "shown": str(e)}


def _encode(v, depth: int, budget: dict):
    budget["items"] -= 1
    if budget["items"] < 0 or depth > MAX_DEPTH:
        raise _TooLarge(f"<an answer of more than {MAX_ITEMS} values or {MAX_DEPTH} levels>")
    t = type(v)
    if v is None or t is bool:
        return v
    if v is Ellipsis:
        return {"$": "..."}
    if t is int:
        s = str(v) if abs(v) < 10 ** MAX_DIGITS else f"<a whole number of more than {MAX_DIGITS} digits>"
        return v if s[0] != "<" else {"$": "opaque", "kind": "int", "shown": s}
    if t is float:
        return v if math.isfinite(v) else {"$": "float", "v": repr(v)}
    if t is str:
        budget["chars"] -= len(v)
        if budget["chars"] < 0:
            raise _TooLarge(f"<an answer of more than {MAX_CHARS} characters>")
        return v
    if t in (list, tuple, set, frozenset):
        items = [_encode(x, depth + 1, budget) for x in (sorted(v, key=repr) if t in (set, frozenset) else v)]
        return items if t is list else {"$": t.__name__, "v": items}
    if t is dict:
        return {"$": "dict", "v": [[_encode(k, depth + 1, budget), _encode(x, depth + 1, budget)]
                                   for k, x in v.items()]}
    if t is range:
        return {"$": "range", "v": [v.start, v.stop, v.step]}
    if isinstance(v, PurePath):
        return {"$": "path", "v": _encode(str(v), depth + 1, budget)}
    numpy = sys.modules.get("numpy")   # only if the notebook imported it: numbers and arrays
    if numpy is not None and isinstance(v, numpy.generic) and v.dtype.kind in "biuf":
        return _encode(v.item(), depth, budget)
    if numpy is not None and t is numpy.ndarray and v.dtype.kind in "biuf":
        if v.size > budget["items"]:
            raise _TooLarge(f"<an array of {v.size} values>")
        return {"$": "ndarray", "dtype": v.dtype.str, "v": _encode(v.tolist(), depth, budget)}
    return {"$": "opaque", "kind": t.__name__, "shown": _short_repr(v)}


def _short_repr(v) -> str:
    try:
        s = object.__repr__(v)   # never the object's own __repr__, which the notebook wrote
    except Exception:  # noqa: BLE001 - anything the object raises
        s = "<object>"
    return s[:200]


def capture(marker: str, names: list[str], namespace: dict, folder: str) -> None:
    """Write the variables ``names`` of ``namespace`` (the notebook's globals) to ``folder/marker.json``;
    a name the notebook does not define is listed as missing. Called by the graded copy's cells."""
    found = {n: encode(namespace[n]) for n in names if n in namespace}
    record = {"values": found, "missing": [n for n in names if n not in namespace]}
    path = Path(folder) / f"{marker}.json"
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(record, allow_nan=False), encoding="utf-8")
    os.replace(tmp, path)


def decode(data):
    """The values ``encode`` wrote, rebuilt: tuples, sets, dicts with any keys, paths, ``...``, numpy
    arrays; an opaque tag or anything malformed becomes an ``Opaque``."""
    if isinstance(data, list):
        return [decode(x) for x in data]
    if not isinstance(data, dict):
        return data
    tag, v = data.get("$"), data.get("v")
    try:
        if tag == "...":
            return ...
        if tag == "float" and v in ("nan", "inf", "-inf"):
            return float(v)
        if tag in ("tuple", "set", "frozenset") and isinstance(v, list):
            return {"tuple": tuple, "set": set, "frozenset": frozenset}[tag](decode(x) for x in v)
        if tag == "dict" and isinstance(v, list):
            return {_key(decode(k)): decode(x) for k, x in v}
        if tag == "range" and isinstance(v, list) and all(type(x) is int for x in v):
            return range(*v)
        if tag == "path" and isinstance(v, str):
            return Path(v)
        if tag == "ndarray" and isinstance(data.get("dtype"), str):
            import numpy
            return numpy.array(decode(v), dtype=numpy.dtype(data["dtype"]))
        if tag == "opaque":
            return Opaque(str(data.get("kind")), str(data.get("shown"))[:200])
    except (TypeError, ValueError):
        pass
    return Opaque("malformed", "<an answer the grader could not read back>")


def _key(k):
    try:
        hash(k)
        return k
    except TypeError:   # a list as a key: kept as its text, which no check accepts
        return Opaque(type(k).__name__, repr(k)[:200])


def load(path: Path) -> dict:
    """A capture file: {"values": {name: value}, "missing": [names]}, with limits on what is read."""
    with open(path, "rb") as f:   # written by the student's kernel: read at most MAX_FILE_BYTES of it
        raw = f.read(MAX_FILE_BYTES + 1)
    if len(raw) > MAX_FILE_BYTES:
        raise ValueError(f"{path.name} is larger than {MAX_FILE_BYTES} bytes")
    try:
        record = json.loads(raw.decode("utf-8"))
    except RecursionError:
        raise ValueError(f"{path.name} is nested too deep") from None
    if not isinstance(record, dict) or not isinstance(record.get("values"), dict):
        raise ValueError(f"{path.name} is not a capture")
    missing = record.get("missing") if isinstance(record.get("missing"), list) else []
    return {"values": {str(k): decode(v) for k, v in record["values"].items()},
            "missing": [str(m) for m in missing]}
