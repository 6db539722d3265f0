"""The exercises of lesson 07: none yet.

A lesson author adds them here: build each with ``Exercise(lesson="07", name=..., title=...,
question=..., template=..., check=..., solution=..., hint=...)`` (lessonkit.exercises.core) and
list them, in order, in the ``register`` call at the end; tests/test_exercises.py then asks for a
right and a wrong answer of each."""
from __future__ import annotations

from .core import register

register(__name__, [])
