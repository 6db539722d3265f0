"""nbval compares the lessons' outputs without the new-build check's progress lines
(tests/conftest.py; make test-py collects tests/ with the notebooks): the lines it leaves out must be exactly those that lessonkit prints, in both languages."""
import pytest
from nbformat import NotebookNode
from nbval import plugin

from lessonkit import check, language, native


@pytest.mark.parametrize("lang", ["en", "zh"])
def test_progress_lines_are_left_out_and_nothing_else(lang):
    before = language.set_language(lang)
    try:
        lines = [str(check.CHECKING_NEW).format(timeout=60), str(check.CHECKING_LONGER).format(n=8192, timeout=60)]
    finally:
        language.set_language(before)
    kept = "output 3 tokens\nChecking is what we do ...\n"   # a lesson's own line stays, even a like one
    for line in lines:
        outs = plugin.coalesce_streams([NotebookNode(output_type="stream", name="stdout", text=line + "\n" + kept)])
        assert [o.text for o in outs] == [kept]
        alone = plugin.coalesce_streams([NotebookNode(output_type="stream", name="stdout", text=line + "\n"),
                                         NotebookNode(output_type="execute_result", data={"text/plain": "1"})])
        assert [o.output_type for o in alone] == ["execute_result"]   # a stream left empty is dropped


def test_the_lessons_conftest_patches_nbval():
    assert plugin.coalesce_streams.__module__ != "nbval.plugin"
