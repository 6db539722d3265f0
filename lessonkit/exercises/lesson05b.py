"""The exercises of lesson 05b: what the K-twice variant still reads after the last chunk when its
first pass streams, and what makes the stored-scores variant fast on x86."""
from __future__ import annotations

from .. import streaming
from .core import Choice, Exercise, Wrong, close, field_of, pick, register

HD, NKV, T, CHUNK = 128, 8, 32768, 512  # 32K: the lesson prints 8K and 64K


def _wait_truth():
    return streaming.work_after_last_chunk("two_pass_recompute_streamed", T, CHUNK, HD, NKV)["bytes"]


def _l05b_wait(answer):
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


ex1 = Exercise(
    lesson="05b", name="wait_bytes", title="exercise 1: what the K-twice variant reads after the last chunk",
    question=f"KV arrives in chunks of {CHUNK} tokens, {T} tokens in all, {NKV} kv heads interleaved, head_dim {HD}. "
    "The K-twice variant runs its pass 1 (M and S) on each chunk as it arrives. How many bytes of lines must it "
    "read for one head after the last chunk has arrived (within 1%)?",
    template={"bytes_after_last_chunk": ...}, check=_l05b_wait,
    solution=lambda: {"bytes_after_last_chunk": _wait_truth()},
    hint="pass 1 of the last chunk (its K), then pass 2 over every token (K again and V); bytes per token from "
    "traffic.bytes_per_token(128, 8).")


EXP_CHOICES = {
    "a": Choice("its pass 2 is a loop of independent exps, which the x86 build vectorizes with the inline exp",
                "right: q8_simd.h turns expf into an inline function on x86, and the compiler runs pass 2 many lanes "
                "at a time; the single pass computes one exp per token inside a dependent chain, and ARM's build "
                "calls libm's expf for every score in both"),
    "b": Choice("it reads fewer bytes of K and V than the single pass does on every call",
                "no: it reads the same K and V rows and scales, plus its score array (lesson 05's model)"),
    "c": Choice("its score array stays in the first-level cache, so none of its loads ever miss",
                "no: the simulation shows the score array's lines missing the first level; bytes are not why"),
}


def _l05b_exp(answer):
    return pick(answer, "choice", EXP_CHOICES, "a")


ex2 = Exercise(
    lesson="05b", name="why_fast", title="exercise 2: why stored scores run fast on x86",
    question="On this x86 machine the stored-scores variant is faster per token than the single pass. Which "
    "reason do the sources and the disassembly support?",
    template={"choice": ...}, check=_l05b_exp, solution=lambda: {"choice": "a"},
    hint="look at the #if around q8_expf in native/q8_simd.h, and at pass 2 of flash_attn_two_pass_scores_q8.",
    choices=EXP_CHOICES)

register(__name__, [ex1, ex2])
