"""The exercises of lesson 05b: what the K-twice variant still reads after the last chunk when its
first pass streams, and what makes the stored-scores variant fast on x86."""
from __future__ import annotations

from ..lessons import streaming
from ..core.language import N_
from .core import Choice, Exercise, Field, register

HD, NKV, T, CHUNK = 128, 8, 32768, 512  # 32K: the lesson prints 8K and 64K


def _wait_facts():
    after = {v: streaming.work_after_last_chunk(v, T, CHUNK, HD, NKV)["bytes"]
             for v in ("two_pass_recompute_streamed", "two_pass_recompute", "streaming")}
    return {"bytes_after_last_chunk": after["two_pass_recompute_streamed"], "unstreamed": after["two_pass_recompute"],
            "single_pass": after["streaming"], "mib": after["two_pass_recompute_streamed"] / 2**20}


ex1 = Exercise(
    "wait_bytes", N_("exercise 1: what the K-twice variant reads after the last chunk"),
    N_("KV arrives in chunks of {CHUNK} tokens, {T} tokens in all, {NKV} kv heads interleaved, head_dim {HD}. The "
       "K-twice variant runs its pass 1 (M and S) on each chunk as it arrives. How many bytes of lines must it "
       "read for one head after the last chunk has arrived (within 0.5%)?", CHUNK=CHUNK, T=T, NKV=NKV, HD=HD),
    facts=_wait_facts,
    fields={"bytes_after_last_chunk": Field(float, (
        N_("{got:.4g} bytes is less than the K-twice variant still reads (within 0.5%)"),
        N_("{got:.4g} bytes is more than the K-twice variant still reads (within 0.5%)")), rtol=0.005, mistakes=(
        (lambda unstreamed, **unused: unstreamed, N_("you counted pass 1 over all tokens after the last chunk; pass 1 "
                                                "(M and S) runs as the chunks arrive, so only the last chunk's "
                                                "pass 1 is left")),
        (lambda single_pass, **unused: single_pass, N_("that is the online single pass's last chunk; the K-twice "
                                                  "variant's second pass needs M and S over all tokens, so it "
                                                  "reads all of K and V after the last chunk"))))},
    correct=N_("{mib:.1f} MiB: the last chunk's pass 1, then all of K again and all of V; only the pass that needs "
               "M and S over all tokens waits"),
    hint=N_("pass 1 of the last chunk (its K), then pass 2 over every token (K again and V); bytes per token from "
            "traffic.bytes_per_token(128, 8)."))

EXP_CHOICES = {
    "a": Choice(N_("its pass 2 is a loop of independent exps, and in this x86 build each exp is inline code, not a call"),
                N_("right: q8_simd.h turns expf into an inline function on x86 builds with FMA and SSE4.1 (exp=inline in the "
                   "simd paths line), so pass 2's loop has no call in it and "
                   "no exp waits for another: a loop the compiler may run several lanes at a time. The single pass "
                   "computes one exp per token inside a dependent chain, and ARM's build calls libm's expf for "
                   "every score in both. (The lesson shows the sources, not the instructions compiled from them.)")),
    "b": Choice(N_("it reads fewer bytes of K and V than the single pass does on every call"),
                N_("no: it reads the same K and V rows and scales, plus its score array (lesson 05's model)")),
    "c": Choice(N_("its score array stays in the first-level cache, so none of its loads ever miss"),
                N_("no: lesson 05's simulation has the score array's lines coming from DRAM, so they missed every level")),
}

ex2 = Exercise(
    "why_fast", N_("exercise 2: what could make stored scores fast on x86"),
    N_("Suppose section 5's verdict says that, on this x86 machine, the stored-scores variant is faster per token "
       "than the single pass. Which reason do the source lines of section 5, and lesson 05's bytes, support?"),
    facts={"choice": "a"}, fields={"choice": Field(EXP_CHOICES)},
    hint=N_("look at the #if around q8_expf in native/q8_simd.h, and at pass 2 in flash_attn_two_pass_scores_rest_q8 (native/flash_attn_q8_two_pass_parts.c)."))

register(__name__, [ex1, ex2])
