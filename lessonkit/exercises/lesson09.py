"""The exercises of lesson 09 (how fast can it go): the memory floor of one token, the bandwidth that
several cores ask for, and what a faster loop cannot change. Right answers are computed from
lessonkit.roofline, so they follow the head size and the byte count the lesson uses."""
from __future__ import annotations

from ..lessons import roofline
from ..core.language import N_
from .core import Choice, Exercise, Field, register

# ---------------------------------------------------------------------------- ex1: the floor

L09_GBPS = 20.0  # the bandwidth of the question (a round figure near this machine's probe)
L09_HD = 256     # not the lesson's 128: the lesson works 128 out, the student applies it to another size


UNITS = N_("floor_ns = {got:g}: 1 GB/s is 1 byte per ns, so ns = bytes / (GB/s)")


def _floor_facts():
    b = roofline.bytes_per_token(L09_HD)
    return {"bytes_per_token": b, "floor_ns": roofline.floor_ns(b, L09_GBPS), "gbps": L09_GBPS, "hd": L09_HD,
            "times": b * L09_GBPS, "over": L09_GBPS / b}


floor = Exercise(
    "floor", N_("The memory floor of one token"),
    question=N_("One token of one kv head at head_dim {L09_HD}: how many bytes must the loop read at least "
                "(bytes_per_token: an integer)? At a read bandwidth of {L09_GBPS:g} GB/s, how many ns per token is "
                "that (floor_ns: a number)?", L09_HD=L09_HD, L09_GBPS=L09_GBPS),
    facts=_floor_facts,
    fields={"bytes_per_token": Field(int, N_("bytes_per_token = {got}: count the int8 K row, the int8 V row "
                                             "(head_dim bytes each) and their two fp32 scales"),
                mistakes=((2 * L09_HD, N_("{got} counts the K and V rows only; each token also has one fp32 K "
                                          "scale and one fp32 V scale")),
                          (roofline.bytes_per_token(128), N_("{got} is the lesson's head_dim 128; this question "
                                  "has head_dim {hd}")),
                          (L09_HD + 4, N_("{got} is one row and one scale; the loop reads K and V for every token")))),
            "floor_ns": Field(float, N_("floor_ns = {got:g} is not {bytes_per_token} bytes / {gbps:g} GB/s (within "
                                        "1 %)"), rtol=0.01,
                mistakes=((lambda times, **unused: times, UNITS), (lambda over, **unused: over, UNITS)))},
    correct=N_("{bytes_per_token} bytes at {gbps:g} GB/s take {floor_ns:.1f} ns: no loop on one thread goes below "
               "that per token."),
    hint=N_("K row and V row are int8, head_dim values each; each has one float32 scale. 1 GB/s = 1 byte per ns."),
    explain=N_("roofline.bytes_per_token({L09_HD}) and roofline.floor_ns(bytes, GB/s) compute it.", L09_HD=L09_HD))

# ---------------------------------------------------------------------------- ex2: four cores

# the board's two cited figures (roofline.BOARD_GBPS one thread, the low end of
# roofline.BOARD_ALLCORE_GBPS all cores): 100 cycles is slower than memory for one core alone and
# faster than the shared DRAM for four, so only the question "all four at once" has one answer
L09_CYCLES, L09_GHZ = 100.0, 2.4
L09_ONE_THREAD, L09_BOARD = 10.8, roofline.BOARD_ALLCORE_GBPS[0]


def _cores_facts():
    one = roofline.demand_gbps(L09_CYCLES, L09_GHZ, 1)
    return {"one_core_gbps": one, "four_cores_gbps": roofline.demand_gbps(L09_CYCLES, L09_GHZ, 4), "verdict": "a",
            "per_cycle": roofline.bytes_per_token() / L09_CYCLES, "cycles": L09_CYCLES, "ghz": L09_GHZ,
            "one_thread": L09_ONE_THREAD, "board": L09_BOARD}


CORES_CHOICES = {
    "a": Choice(N_("memory: the four together ask more than all cores get"),
                N_("each core alone is held by its arithmetic, but four of them share one DRAM and together ask "
                   "more bytes per second than it gives: memory sets the pace")),
    "b": Choice(N_("arithmetic: one core asks less than one thread gets"),
                N_("that is true of one core running alone, but the four share one DRAM; add their demands and "
                   "compare with the all-core figure")),
    "c": Choice(N_("neither: the L3 cache serves all four cores at once"),
                N_("a long cache does not fit in the 3 MB L3: every K and V byte comes from DRAM once per call")),
}


four_cores = Exercise(
    "four_cores", N_("Four cores share one memory"),
    question=N_("A loop takes {L09_CYCLES:g} cycles per token on one core at {L09_GHZ:g} GHz and reads "
                "{bytes_per_token_roofline} bytes per token. How many GB/s does one core ask for (one_core_gbps: a "
                "number)? Four cores, each decoding its own head (four_cores_gbps: a number)? The board's memory "
                "gives one thread {L09_ONE_THREAD:g} GB/s and all cores together {L09_BOARD:g} GB/s. When all four "
                "cores run at once, what sets the pace (verdict: a letter)?", L09_CYCLES=L09_CYCLES, L09_GHZ=L09_GHZ, bytes_per_token_roofline=roofline.bytes_per_token(), L09_ONE_THREAD=L09_ONE_THREAD, L09_BOARD=L09_BOARD),
    facts=_cores_facts,
    fields={"one_core_gbps": Field(float, N_("one_core_gbps = {got:g} is not bytes per token / ns per token "
                                             "(within 2 %)"), rtol=0.02,
                mistakes=((lambda per_cycle, **unused: per_cycle, N_("one_core_gbps = {got:g} divides bytes by cycles; "
                        "turn cycles into ns first ({cycles:g} cycles / {ghz:g} GHz)")),)),
            "four_cores_gbps": Field(float, N_("four_cores_gbps = {got:g}: four cores each on its own head ask 4 x "
                                               "one core's rate"), rtol=0.02),
            "verdict": Field(CORES_CHOICES)},
    correct=N_("{one_core_gbps:.1f} GB/s per core (below one thread's {one_thread:g}), {four_cores_gbps:.1f} GB/s "
               "for four (above all cores' {board:g}): {why}"),
    hint=N_("ns per token = cycles / GHz. GB/s = bytes / ns. Cores decoding different heads add up."),
    explain=N_("roofline.demand_gbps(cycles, ghz, cores) computes it."))

# ---------------------------------------------------------------------------- ex3: what cannot change

# a loop at 12 ns/token in cache, made twice as fast in cache, on a machine whose DRAM floor is 8 ns/token:
# the floor holds the new version above its in-cache time once the KV cache is read from DRAM
L09_OLD_NS, L09_NEW_NS, L09_FLOOR_GBPS = 12.0, 6.0, 33.0

FLOOR_CHOICES = {
    "a": Choice(N_("memory: the new loop is faster than DRAM can feed it"),
                N_("in cache it needs fewer ns than the floor; from DRAM it waits for the bytes, so only reading "
                   "fewer bytes would help it further")),
    "b": Choice(N_("its instructions: it halved them, so it halves its time at every length"),
                N_("that holds while the bytes come from the CPU's cache; from DRAM no loop goes below the floor")),
    "c": Choice(N_("neither: a long cache is noise on a shared machine"),
                N_("noise only adds time; it does not set a floor the same for every version")),
}


def _floor_limit_facts():
    floor = roofline.floor_ns(roofline.bytes_per_token(), L09_FLOOR_GBPS)
    return {"best_ns": max(L09_NEW_NS, floor), "choice": "a", "floor": floor, "old": L09_OLD_NS, "new": L09_NEW_NS}


at_the_floor = Exercise(
    "at_the_floor", N_("When fewer instructions do not help"),
    question=N_("A version runs {L09_OLD_NS:g} ns per token at 8K tokens, its KV cache in the CPU's cache. A new "
                "version halves its instructions and runs {L09_NEW_NS:g} ns per token at 8K. The machine reads DRAM "
                "at {L09_FLOOR_GBPS:g} GB/s, and each token is {nbytes} bytes. At 256K tokens, read from DRAM, how "
                "many ns per token can the new version take at best (best_ns: a number)? What holds it there "
                "(choice: a letter)?", L09_OLD_NS=L09_OLD_NS, L09_NEW_NS=L09_NEW_NS, L09_FLOOR_GBPS=L09_FLOOR_GBPS,
                nbytes=roofline.bytes_per_token()),
    facts=_floor_limit_facts,
    fields={"best_ns": Field(float, N_("best_ns = {got:g}: the loop cannot beat its own time nor the DRAM floor "
                                       "(within 2 %)"), rtol=0.02,
                mistakes=((lambda new, **unused: new, N_("{got:g} ns is its time in cache; from DRAM it cannot go below "
                                                         "bytes / bandwidth")),
                          (lambda old, **unused: old, N_("{got:g} ns is the old version's time; the new one is faster "
                                                         "than that even from DRAM")))),
            "choice": Field(FLOOR_CHOICES)},
    correct=N_("{best_ns:.1f} ns per token: the floor ({floor:.1f} ns) is above its {new:g} ns in cache. {why}"),
    hint=N_("Work out the DRAM floor first (bytes / GB/s), then compare it with the new version's own time."),
    explain=N_("A loop faster than memory waits for memory: only reading fewer bytes helps then."))

# ---------------------------------------------------------------------------- ex4: the roofline

# round roofs near the board's (lesson 09's roofs table: 10.8 GB/s cited, about 61 Gop/s by the N1 model),
# so the student works the ridge out instead of reading it off the table
L09_ROOF_GBPS, L09_ROOF_GOPS, L09_HEADS = 10.0, 60.0, 4

ROOF_CHOICES = {
    "a": Choice(N_("the compute roof: the grouped call is right of the ridge point"),
                N_("right of the ridge the flat compute roof is the lower one: four heads' work per byte read makes "
                   "the loop's arithmetic, not memory, its bound")),
    "b": Choice(N_("the memory roof: every version of the kernel is left of the ridge point"),
                N_("one head's loop is left of the ridge, but the grouped call does four heads' work on the same "
                   "bytes: compare its own intensity with the ridge")),
    "c": Choice(N_("neither: a roofline bounds only loops that read DRAM"),
                N_("the two roofs bound every loop; what moves is which of them is lower at the loop's intensity")),
}


def _roof_facts():
    one = roofline.intensity()
    return {"ops_per_byte": roofline.intensity(heads=L09_HEADS), "ridge": L09_ROOF_GOPS / L09_ROOF_GBPS,
            "roof": "a", "one_head": one, "inverse": L09_ROOF_GBPS / L09_ROOF_GOPS}


grouped_roof = Exercise(
    "grouped_roof", N_("The grouped call on the roofline"),
    question=N_("The grouped call scores {L09_HEADS} query heads against one kv head: per token it does {L09_HEADS} x "
                "{ops} operations on the same {nbytes} bytes. What is its arithmetic intensity (ops_per_byte: a "
                "number)? A core with a memory roof of {L09_ROOF_GBPS:g} GB/s and a compute roof of {L09_ROOF_GOPS:g} "
                "Gop/s: at what intensity is its ridge point (ridge: a number, operations per byte)? Which roof bounds "
                "the grouped call on that core (roof: a letter)?", L09_HEADS=L09_HEADS, ops=roofline.ops_per_token(),
                nbytes=roofline.bytes_per_token(), L09_ROOF_GBPS=L09_ROOF_GBPS, L09_ROOF_GOPS=L09_ROOF_GOPS),
    facts=_roof_facts,
    fields={"ops_per_byte": Field(float, N_("ops_per_byte = {got:g} is not the operations of all heads over the bytes "
                                            "they share (within 2 %)"), rtol=0.02,
                mistakes=((lambda one_head, **unused: one_head, N_("{got:g} is one head's intensity; the grouped call "
                                                                   "does the work of all its heads on those bytes")),)),
            "ridge": Field(float, N_("ridge = {got:g}: the roofs meet where bandwidth x intensity = peak"), rtol=0.02,
                mistakes=((lambda inverse, **unused: inverse, N_("{got:g} is bandwidth / peak; the ridge is where "
                                                                  "GB/s x op/B reaches the peak: peak / bandwidth")),)),
            "roof": Field(ROOF_CHOICES)},
    correct=N_("{ops_per_byte:.2f} op/B, right of the ridge at {ridge:g} op/B (one head: {one_head:.2f}, left of it): "
               "{why}"),
    hint=N_("Intensity = operations / bytes. On the memory roof the rate is GB/s x op/B; set it equal to the peak."),
    explain=N_("roofline.intensity(heads=4) computes it; the ridge is peak / bandwidth."))

register(__name__, [floor, four_cores, at_the_floor, grouped_roof])
