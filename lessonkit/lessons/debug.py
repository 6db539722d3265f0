"""Lesson 06's debugging names in one place (article 9-2, sections 3 and 4), each imported from the module that
holds it: ``kernel_copy`` (edit a copy of the kernel, build it, see), ``debugger`` (gdb or lldb; tier A in batch
mode) and ``by_hand`` (the sessions a student types, tier A's among them). It defines nothing of its own."""
from .by_hand import engine_debug_recipe, session_step, show_step, show_tier_a, tier_a_log  # noqa: F401
from .debugger import (DEBUGGERS, KERNEL, TOKEN_TEXT, breakpoints, debugger_path, observe_generation,  # noqa: F401
                       records_from_trace, same_records)
from .kernel_copy import (BREAKS, UNMARKED_NAME, Edit, break_kernel, call_kernel, copy_native, edit_line,  # noqa: F401
                          kernel_weights, softmax_weights, trace_with, unmarked_kernel, unmarked_segments)
