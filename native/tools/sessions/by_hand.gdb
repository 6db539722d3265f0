# Lesson 06 by hand, in gdb. Start it from the workbook's folder with (the debug build first):
#   .venv/bin/python -m lessonkit build --debug
#   gdb --args .venv/bin/python -c "from lessonkit import native, toy; native.load(); toy.generate(4, debug=True)"
# then type the commands below at the (gdb) prompt. The program loads BOTH builds, as a notebook
# does after lesson 04: the fast -O3 library first, then the -O0 -g one that the toy generation calls.
# Line numbers written @LINE(...)@ are filled in from the kernel's source (tests/transcripts.py).
#
# cffi loads the library after gdb starts: keep the breakpoint pending until it appears.
set breakpoint pending on
break @FUNCTION@
run
# Two locations (<MULTIPLE>): 1.1 in the debug build (with file and line), 1.2 in the fast build
# (no debug information, just an address). Both libraries define the same function name.
info breakpoints
info sharedlibrary libflash_attn
# Python -> cffi -> kernel: frame #0 is the kernel, then libffi's call, cffi's cdata_call, the interpreter.
bt 8
p seq_len
p hd
# One location only: FILE:FUNCTION needs line information, which only the debug build has.
delete 1
break @FILE@:@FUNCTION@
# FILE:LINE also resolves twice, for another reason: the traced copy of the kernel
# (flash_attn_single_q_q8_neon_traced) is compiled from the same lines. 'disable 3.2' would drop it.
break @FILE@:@LINE(v_cache_q8[t / kv_bs])@
info breakpoints
# Past segment 1: Q's int8 codes and block scales are set. 'info locals' would print the
# 256-entry buffers whole; print the first hd entries instead (p/d: int8_t as numbers, not chars).
advance @LINE(float M = -1e9f)@
p/d qi[0]@hd
p qsc[0]@nblk
continue
p t
p VKQ[0]@hd
# display: print M and S at every stop from now on.
display M
display S
next
# Stop displaying before leaving the kernel: outside it, M and S are not defined.
undisplay
# finish: run until the kernel returns, back in libffi.
finish
disable 2 3
# Stop only where a token brings a new maximum (the rescale branch runs), after the first token.
break @FILE@:@LINE(if (s > M) {)@ if s > M && t > 0
continue
p t
p s
p M
# A watchpoint stops wherever M changes; it goes away when the kernel returns.
watch M
continue
continue
kill
