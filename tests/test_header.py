"""lessonkit.header: the sizes C and Python share are read from native/flash_attn_q8.h. The values
Python reads are the ones a C compiler sees (a small program prints them), and the parser takes
only whole-number macros and refuses a name defined twice with two values."""
from __future__ import annotations

import shutil
import subprocess

import pytest

from lessonkit import header, validate


@pytest.mark.skipif(shutil.which("cc") is None, reason="needs a C compiler")
def test_python_reads_what_c_compiles(tmp_path):
    prog = tmp_path / "sizes.c"
    prog.write_text('#include <stdio.h>\n#include "flash_attn_q8.h"\n'
                    'int main(void) { printf("%d %d %d\\n", QBLK, HD_MAX, GQA_MAX); return 0; }\n')
    subprocess.run(["cc", f"-I{header.HEADER_FILE.parent}", str(prog), "-o", str(tmp_path / "sizes")], check=True)
    out = subprocess.run([str(tmp_path / "sizes")], check=True, capture_output=True, text=True).stdout.split()
    assert [int(v) for v in out] == [header.QBLK, header.HD_MAX, header.GQA_MAX]
    assert (validate.QBLOCK, validate.HEAD_DIM_MAX) == (header.QBLK, header.HD_MAX)


def test_parser_takes_whole_number_macros_only(tmp_path):
    h = tmp_path / "h.h"
    h.write_text("#ifndef H\n#define H\n#define A 32 /* a comment */\n#  define B -4\n#define C (1.0f / 127.0f)\n"
                 "#define D 7 // why\nint f(int x);\n")
    assert header.constants(h) == {"A": 32, "B": -4, "D": 7}


def test_parser_refuses_two_values_for_one_name(tmp_path):
    h = tmp_path / "h.h"
    h.write_text("#define A 32\n#define A 32\n")
    assert header.constants(h) == {"A": 32}  # the same value twice is what C allows
    h.write_text("#define A 32\n#define A 64\n")
    with pytest.raises(ValueError, match="defines A twice: 32 and 64"):
        header.constants(h)


def test_declared_functions_are_read_from_the_header(tmp_path):
    h = tmp_path / "h.h"
    h.write_text("#define QBLK 32\nvoid f_one(int a);\nint g_two (float *x);\n/* not_a_call */\n")
    assert {"f_one", "g_two"} <= header.declared(h) and "not_a_call" not in header.declared(h)
    assert "flash_attn_single_q_q8_fast" in header.declared()
