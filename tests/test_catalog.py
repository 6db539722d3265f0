"""The one message catalog (lessonkit/locale/zh_CN/LC_MESSAGES/lessonkit.po): complete, checked by
msgfmt, compiled into the .mo that lessonkit reads, and in step with the messages the code uses."""
import ast
import gettext
import re
import shutil
import string
import subprocess
from pathlib import Path

import pytest

import lessonkit as lk
from lessonkit import language

# the packages whose messages the catalog holds: lessonkit, and the tools beside it (their output is the
# student's too: make reset, make update)
PKG = Path(lk.__file__).resolve().parent
PACKAGES = (PKG, PKG.parent / "workbench")
PO = language.LOCALE_DIR / "zh_CN" / "LC_MESSAGES" / "lessonkit.po"
MO = PO.with_suffix(".mo")
MSGFMT = shutil.which("msgfmt")
needs_msgfmt = pytest.mark.skipif(MSGFMT is None, reason="needs msgfmt (Debian: apt install gettext)")


def code_messages() -> tuple[dict, list]:
    """{msgid: first place} of every _("...") and N_("...") in lessonkit, and the calls whose message
    is not a literal (which no catalog could hold)."""
    found, bad = {}, []
    for path in sorted(p for pkg in PACKAGES for p in pkg.rglob("*.py") if p.name != "language.py"):  # it defines _
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("_", "N_"):
                where = f"{path.relative_to(PKG.parent)}:{node.lineno}"
                arg = node.args[0] if node.args else None
                if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
                    found.setdefault(arg.value, where)
                else:
                    bad.append(where)
    return found, bad


def c_messages() -> set:
    """The English texts that native/ holds and language.from_c shows: the kernel file's segment titles
    and what each version adds (native/fa_variants.h)."""
    from lessonkit import source, variants
    return {s.title for s in source.kernel_segments().values()} | {v.adds for v in variants.VARIANTS}


def catalog() -> dict:
    with MO.open("rb") as f:
        return {k: v for k, v in gettext.GNUTranslations(f)._catalog.items() if k}


def fields(s: str) -> set:
    return {name for _, name, _, _ in string.Formatter().parse(s) if name is not None}


@needs_msgfmt
def test_msgfmt_check_passes_with_nothing_untranslated_or_fuzzy():
    r = subprocess.run([MSGFMT, "--check", "--statistics", "-o", "/dev/null", str(PO)],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert "untranslated" not in r.stderr and "fuzzy" not in r.stderr, r.stderr
    assert not re.search(r"^#,.*\bfuzzy\b", PO.read_text(encoding="utf-8"), flags=re.M)


@needs_msgfmt
def test_the_committed_mo_is_the_po_compiled(tmp_path):
    fresh = tmp_path / "fresh.mo"
    subprocess.run([MSGFMT, "-o", str(fresh), str(PO)], check=True)
    with fresh.open("rb") as f:
        want = {k: v for k, v in gettext.GNUTranslations(f)._catalog.items() if k}
    assert catalog() == want, "lessonkit.mo is older than lessonkit.po: run make catalog"


def test_every_message_in_the_code_is_in_the_catalog_and_no_other():
    found, bad = code_messages()
    assert not bad, f"_() or N_() of something that is not a string literal: {bad}"
    cat = catalog()
    found.update({m: "native/" for m in c_messages()})
    missing = {m: w for m, w in found.items() if m not in cat}
    assert not missing, f"messages missing from {PO.name} (add them, then make catalog): {missing}"
    unused = sorted(set(cat) - set(found))
    assert not unused, f"entries of {PO.name} no code uses (remove them): {unused[:10]}"


def test_each_translation_fills_the_same_fields_as_its_english():
    wrong = {en: zh for en, zh in catalog().items() if fields(en) != fields(zh)}
    assert not wrong, wrong


def test_every_translation_is_chinese_where_the_english_has_words():
    # a msgstr equal to its msgid is untranslated in all but name (a unit or a symbol may stay)
    same = [en for en, zh in catalog().items() if en == zh and re.search(r"[A-Za-z]{3,} [A-Za-z]{3,}", en)]
    assert not same, same


def test_the_language_switch_picks_the_catalog():
    msgid = next(iter(code_messages()[0]))
    before = lk.set_language("zh")
    try:
        zh = language._(msgid)
        lazy = language.N_(msgid)
        assert zh == catalog()[msgid] and str(lazy) == zh
        lk.set_language("en")
        assert language._(msgid) == msgid and str(lazy) == msgid
    finally:
        lk.set_language(before)


def test_no_function_of_lessonkit_rebinds_the_message_function():
    """``_`` is gettext's: a throwaway ``for _ in ...`` or ``**_`` in a function that also shows a
    message would call the throwaway (a TypeError, or an UnboundLocalError, where the student sees it)."""
    bad = []
    for path in sorted(p for pkg in PACKAGES for p in pkg.rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if isinstance(node, ast.Name) and node.id == "_" and isinstance(node.ctx, ast.Store) \
                    or isinstance(node, ast.arg) and node.arg == "_":
                bad.append(f"{path.relative_to(PKG.parent)}:{node.lineno}")
    assert not bad, f"name the throwaway something else than _ (it is the message function): {bad}"
