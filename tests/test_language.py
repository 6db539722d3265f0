"""lessonkit.set_language("zh") switches what the student reads: exercise texts, hints and verdicts,
the set-up check, plot labels; Chinese plot text renders without a missing glyph; with no Chinese
font, one clear message says what to install."""
from __future__ import annotations

import os
import re
import subprocess
import sys
import warnings

import pytest

import lessonkit as lk
from lessonkit import exercises as E, language, plotstyle, setup
from lessonkit.language import N_, _

HAN = re.compile(r"[\u4e00-\u9fff]")


@pytest.fixture
def zh():
    before = lk.set_language("zh")
    yield
    lk.set_language(before)


def test_english_is_the_default_and_the_switch_says_what_it_accepts():
    assert language.language() == "en" and _("Correct") == "Correct"
    with pytest.raises(ValueError, match="set_language"):
        lk.set_language("chinese")
    assert language.language() == "en"


def test_the_switch_returns_the_language_before_and_text_follows_it(zh):
    t = N_("Correct")  # defined once, translated each time it is shown
    assert (_("Correct"), str(t), f"{t:>4}") == ("正确", "正确", "  正确")
    assert lk.set_language("en") == "zh" and str(t) == "Correct"


def test_lessonkit_lang_sets_the_default_of_a_new_process():
    def run(value):
        return subprocess.run([sys.executable, "-c", "import lessonkit as lk; print(lk.language.language())"],
                              env={**os.environ, "LESSONKIT_LANG": value}, capture_output=True, text=True, check=True)
    assert run("zh").stdout.strip() == "zh"
    bad = run("klingon")  # a wrong value does not stop lessonkit from importing: English, and why
    assert bad.stdout.strip() == "en" and "LESSONKIT_LANG" in bad.stderr


@pytest.mark.parametrize("ex", E.ALL, ids=lambda ex: ex.marker)
def test_every_exercise_text_has_a_chinese_half(ex, zh, capsys):
    """Question, hint, explanation and choices print Chinese in Chinese (and no Chinese sentence
    in English: the English half is unchanged)."""
    ex.question()
    ex.hint()
    ex.check(None)
    out = capsys.readouterr().out
    lines = [ln for ln in out.splitlines() if ln.strip() and not ln.startswith("answer = ")]
    assert lines and all(HAN.search(ln) for ln in lines[:2]), out
    assert out.splitlines()[-1].startswith("还没作答："), out
    for part in (ex.title, ex._text, ex._hint, ex._explain, *(c.text for c in ex.choices.values()),
                 *(c.why for c in ex.choices.values())):
        if part:
            assert isinstance(part, N_), f"{ex.marker}: {part!r} is not a message: write N_(English) and its Chinese in the catalog"


def _cases():
    sys.path.insert(0, os.path.dirname(__file__))
    from test_exercises import _registry_cases  # the right and wrong answer of every exercise
    return list(_registry_cases())


@pytest.mark.parametrize("ex,right,wrong,words", _cases())
def test_verdicts_are_chinese(ex, right, wrong, words, zh, capsys):
    """The verdict on a right and a wrong answer (the same answers as tests/test_exercises.py) is
    Chinese, reason included."""
    if right is None:
        pytest.skip("the exercise's own test in test_exercises.py")
    ok = ex.check(right() if callable(right) else right)
    bad = ex.check(wrong() if callable(wrong) else wrong)
    # a check that builds a copy of the kernel first prints the new-build check's one line
    out = re.sub(r"^正在一个单独的进程里.*\n", "", capsys.readouterr().out, flags=re.MULTILINE)
    assert ok and out.startswith("正确："), out
    assert not bad and "不对：" in out and HAN.search(bad.message), bad.message


def test_checks_line_is_chinese(zh):
    from lessonkit.checks import Checks
    c = Checks()
    c.add("a", True)
    assert str(c) == "1 项检查全部通过"
    c.add("b", False, "detail")
    assert str(c).startswith("2 项检查中有 1 项失败")


def test_setup_check_speaks_chinese(zh, capsys):
    from lessonkit import env
    setup.print_setup()
    out = capsys.readouterr().out
    assert sum(bool(HAN.search(ln)) for ln in out.splitlines() if ln.strip()) >= len(out.splitlines()) // 2, out


def _draw_chinese_figure():
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(10, 4))
    ax.plot([1, 2, 3], label="恒定单遍（在线 softmax）")
    ax.set_title("两遍版与单遍：每个 token 的带宽与局部性")
    ax.set_ylabel("每个 token 的时间（ns）")
    plotstyle.token_axis(ax)
    ax.legend()
    fig.canvas.draw()
    texts = [ax.get_title(), ax.get_xlabel(), ax.get_ylabel()]
    plt.close(fig)
    return texts


def test_chinese_plot_text_renders_without_missing_glyphs(zh, caplog):
    """Any "Glyph ... missing from font(s)" warning fails, and so does matplotlib's logged
    "does not have a glyph": the machine needs a Chinese font (the README's install steps and
    .ci/run install one)."""
    assert plotstyle.cjk_font() is not None, f"no Chinese font for matplotlib: {plotstyle.INSTALL_CJK}"
    with warnings.catch_warnings(), caplog.at_level("WARNING", logger="matplotlib"):
        warnings.simplefilter("error")
        texts = _draw_chinese_figure()
    assert not [r for r in caplog.records if "glyph" in r.getMessage().lower()], caplog.text
    assert all(HAN.search(t) for t in texts), texts  # token_axis's label is Chinese too


def test_no_chinese_font_gives_one_message_with_what_to_install(zh, monkeypatch):
    monkeypatch.setattr(plotstyle, "CJK_FONTS", ("No Such Font For This Test",))
    monkeypatch.setattr(plotstyle, "_add_new_system_fonts", lambda: False)
    monkeypatch.setattr(plotstyle, "_told", False)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with warnings.catch_warnings():  # cjk_font silences matplotlib's per-glyph warning: keep that local
            assert plotstyle.cjk_font() is None
            assert plotstyle.cjk_font() is None
    told = [w for w in caught if issubclass(w.category, plotstyle.MissingChineseFont)]
    assert len(told) == 1 and "fonts-noto-cjk" in str(told[0].message), [str(w.message) for w in caught]
