"""lessonkit.toy: the toy generation of lesson 06 calls the compiled kernel once per query head per
step, over a cache that grows by one token per step; its head outputs are the kernel's."""
from __future__ import annotations

import numpy as np
import pytest

import lessonkit as lk
from lessonkit import toy


def test_call_pattern_and_determinism(capsys):
    gen = toy.generate(16)
    printed = capsys.readouterr().out
    assert printed.strip() == f"generated token ids: {gen.tokens}"
    cfg = gen.config
    assert len(gen.tokens) == 16 and all(0 <= t < cfg.vocab for t in gen.tokens)
    assert len(gen.calls) == 16 * cfg.n_q_heads == 64
    for i, c in enumerate(gen.calls):
        assert c.step == i // 4 and c.q_head == i % 4
        assert c.kv_head == c.q_head // cfg.group        # GQA: 2 query heads per kv head
        assert c.seq_len == c.step + 1                   # one token more per step
    assert gen.cache.seq_len == 16
    assert toy.generate(16, verbose=False).tokens == gen.tokens   # fixed seed, greedy
    assert len(set(gen.tokens)) > 3                      # not stuck on one token


def test_prompt_is_fed_token_by_token():
    gen = toy.generate(5, prompt=[3, 1, 4], verbose=False)
    assert len(gen.tokens) == 5
    steps = sorted({c.step for c in gen.calls})
    assert steps == list(range(3 + 5 - 1))
    assert [c.seq_len for c in gen.calls if c.q_head == 0] == [s + 1 for s in steps]


def test_head_outputs_are_the_kernels():
    """Recompute the last step's queries from the model's weights and attend them in numpy
    (the engine's quantized math, float64 softmax) over the toy's final cache."""
    gen = toy.generate(12, verbose=False)
    model = toy.ToyModel(gen.config)
    last = gen.calls[-1].step
    token = ([0] + gen.tokens)[last]
    x = model.embedding[token] + model.position(last)
    q = (x @ model.wq).reshape(gen.config.n_q_heads, gen.config.head_dim)
    for h in range(gen.config.n_q_heads):
        out = gen.outputs[-gen.config.n_q_heads + h]
        ref = lk.attend(np.ascontiguousarray(q[h]), gen.cache, h // gen.config.group,
                        scale=model.scale, backend="numpy")
        np.testing.assert_allclose(out, ref, rtol=1e-4, atol=1e-5)


def test_debug_and_traced_builds_give_the_same_generation():
    fast = toy.generate(10, verbose=False)
    dbg = toy.generate(10, debug=True, verbose=False)
    trc = toy.generate(10, trace=True, verbose=False)
    assert dbg.kernel == "debug" and trc.kernel == "traced" and fast.kernel == "fast"
    assert dbg.tokens == fast.tokens == trc.tokens
    for a, b, c in zip(fast.outputs, dbg.outputs, trc.outputs):
        np.testing.assert_allclose(b, a, rtol=1e-5, atol=1e-6)
        np.testing.assert_array_equal(c, a)               # the traced build computes what the fast one does
    assert len(trc.traces) == len(trc.calls)
    assert [t.seq_len for t in trc.traces] == [c.seq_len for c in trc.calls]


def test_bad_arguments():
    with pytest.raises(ValueError, match="prompt"):
        toy.generate(3, prompt=[999], verbose=False)
    with pytest.raises(ValueError, match="trace=True"):
        toy.generate(3, trace=True, debug=True, verbose=False)
    with pytest.raises(ValueError):
        toy.generate(0, verbose=False)
