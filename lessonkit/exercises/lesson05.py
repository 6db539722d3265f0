"""The exercises of lesson 05: where one head's K fits (the engine's layout), what the K-twice
variant still reads after the last chunk when its first pass streams, and what makes the
stored-scores variant fast on x86."""
from __future__ import annotations

from .. import streaming, traffic
from .core import Choice, Exercise, Wrong, close, field_of, pick, register, whole

HD, NKV, T, CHUNK = 128, 8, 65536, 512


def _fit_truth():
    per = traffic.bytes_per_token(HD, NKV)["k"]
    return {p: traffic.preset(p).ll.size // per for p in ("a76-l2", "a76")}


def _l05_fit(answer):
    truth = _fit_truth()
    one_head = traffic.bytes_per_token(HD, 1)["k"]
    for p, key in (("a76-l2", "tokens_512k"), ("a76", "tokens_3m")):
        got = whole(field_of(answer, key), key)
        if abs(got - truth[p]) <= 1:
            continue
        if abs(got - traffic.preset(p).ll.size // one_head) <= 1:
            raise Wrong(f"{key} = {got} counts {one_head} bytes per token, one head alone; with {NKV} heads "
                        f"a token's scale read brings {4 * NKV} bytes of a line, not 4")
        if abs(got - traffic.preset(p).ll.size // (2 * traffic.bytes_per_token(HD, NKV)["k"])) <= 1:
            raise Wrong(f"{key} = {got} is where K and V together fit; the question asks for K alone")
        raise Wrong(f"{key} = {got} is {'too many' if got > truth[p] else 'too few'} tokens: divide the last "
                    "level's bytes by one head's K row plus its share of the scale lines")
    per = traffic.bytes_per_token(HD, NKV)["k"]
    return (f"{per} bytes per token: K fits in 512 KiB up to {truth['a76-l2']} tokens and in 3 MiB up to "
            f"{truth['a76']}; beyond, the K-twice variant's second read of K comes from DRAM")


ex1 = Exercise(
    lesson="05", name="k_fits", title="exercise 1: where one head's K fits",
    question=f"The engine interleaves {NKV} kv heads per token (head_dim {HD}). Up to how many tokens does one "
    "head's K (its rows plus the lines its scales share with the other heads) fit in a last level of 512 KiB, "
    "and of 3 MiB? Whole tokens.",
    template={"tokens_512k": ..., "tokens_3m": ...}, check=_l05_fit,
    solution=lambda: {"tokens_512k": _fit_truth()["a76-l2"], "tokens_3m": _fit_truth()["a76"]},
    hint="traffic.bytes_per_token(128, 8) gives the bytes of lines per token; the preset's ll.size the bytes of "
    "the last level.")


def _wait_truth():
    return streaming.work_after_last_chunk("two_pass_recompute_streamed", T, CHUNK, HD, NKV)["bytes"]


def _l05_wait(answer):
    got = field_of(answer, "bytes_after_last_chunk", float)
    truth = _wait_truth()
    if close(got, truth, 0.01):
        return (f"{truth / 2**20:.1f} MiB: the last chunk's pass 1, then all of K again and all of V; only the "
                "pass that needs M and S over all tokens waits")
    unfair = streaming.work_after_last_chunk("two_pass_recompute", T, CHUNK, HD, NKV)["bytes"]
    if close(got, unfair, 0.01):
        raise Wrong("you counted pass 1 over all tokens after the last chunk; pass 1 (M and S) runs as the "
                    "chunks arrive, so only the last chunk's pass 1 is left")
    streamed = streaming.work_after_last_chunk("streaming", T, CHUNK, HD, NKV)["bytes"]
    if close(got, streamed, 0.01):
        raise Wrong("that is the online single pass's last chunk; the K-twice variant's second pass needs M and S "
                    "over all tokens, so it reads all of K and V after the last chunk")
    raise Wrong(f"{got:.4g} bytes is {'more' if got > truth else 'less'} than the K-twice variant still reads "
                "(within 1%)")


ex2 = Exercise(
    lesson="05", name="wait_bytes", title="exercise 2: what the K-twice variant reads after the last chunk",
    question=f"KV arrives in chunks of {CHUNK} tokens, {T} tokens in all, {NKV} kv heads interleaved, head_dim {HD}. "
    "The K-twice variant runs its pass 1 (M and S) on each chunk as it arrives. How many bytes of lines must it "
    "read for one head after the last chunk has arrived (within 1%)?",
    template={"bytes_after_last_chunk": ...}, check=_l05_wait,
    solution=lambda: {"bytes_after_last_chunk": _wait_truth()},
    hint="pass 1 of the last chunk (its K), then pass 2 over every token (K again and V); bytes per token from "
    "traffic.bytes_per_token(128, 8).")


EXP_CHOICES = {
    "a": Choice("its pass 2 is a loop of independent exps, which the x86 build vectorizes with the inline exp",
                "right: q8_simd.h turns expf into an inline function on x86, and the compiler runs pass 2 many lanes "
                "at a time; the single pass computes one exp per token inside a dependent chain, and ARM's build "
                "calls libm's expf for every score in both"),
    "b": Choice("it reads fewer bytes of K and V than the single pass does on every call",
                "no: it reads the same K and V rows and scales, plus its score array (the model of section 1)"),
    "c": Choice("its score array stays in the first-level cache, so none of its loads ever miss",
                "no: the simulation shows the score array's lines missing the first level; bytes are not why"),
}


def _l05_exp(answer):
    return pick(answer, "choice", EXP_CHOICES, "a")


ex3 = Exercise(
    lesson="05", name="why_fast", title="exercise 3: why stored scores run fast on x86",
    question="On this x86 machine the stored-scores variant is faster per token than the single pass. Which "
    "reason do the sources and the disassembly support?",
    template={"choice": ...}, check=_l05_exp, solution=lambda: {"choice": "a"},
    hint="look at the #if around q8_expf in native/q8_simd.h, and at pass 2 of flash_attn_two_pass_scores_q8.",
    choices=EXP_CHOICES)

register(__name__, [ex1, ex2, ex3])
