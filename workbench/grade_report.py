"""What ``python -m workbench grade`` gives the teacher: grades.csv, and one feedback page per student.

``rows`` are workbench.grade's Rows: student, lesson, exercise, points, possible, status, verdict,
title, notebook, language."""
from __future__ import annotations

import csv
import html
import threading
from contextlib import contextmanager
from pathlib import Path

from lessonkit.core.language import N_

# What python -m workbench grade tells the student beside check's verdicts, in lessonkit's catalog, so
# that a Chinese notebook's feedback is Chinese
GRADER_SAYS = {
    "unreadable": N_("the notebook could not be read ({error})"),
    "no cell": N_("no cell of the notebook runs {call}, which hands in this exercise's answer"),
    "no variable": N_("the notebook has no {names} when the cell that runs {call} has run"),
    "died": N_("the kernel stopped in cell {cell} ({line}: {how}), before this exercise's answer was handed in"),
    "cell timeout": N_("cell {cell} ({line}) ran longer than {seconds:g} s and was stopped there, before this "
                       "exercise's answer was handed in"),
    "notebook timeout": N_("the notebook ran longer than {seconds:g} s in all and was stopped in cell {cell} ({line}), "
                           "before this exercise's answer was handed in"),
    "not checked": N_("the grader could not check this answer ({error}); ask your teacher"),
    "cell error": N_("cell {cell} ({line}) raised {error}"),
    "page title": N_("Graded exercises of {student}"),
    "lesson": N_("Lesson {lesson} ({notebook}): {points:g} of {possible:g} points"),
    "total": N_("In all: {points:g} of {possible:g} points"),
    "exercise": N_("exercise"),
    "points": N_("points"),
    "verdict": N_("verdict"),
}

_LANGUAGE = threading.Lock()   # lessonkit's language is the process's: one thread speaks at a time


@contextmanager
def speaking(lang: str):
    """lessonkit speaks ``lang`` in this block, and no other thread changes that meanwhile."""
    from lessonkit import set_language
    with _LANGUAGE:
        before = set_language(lang)
        try:
            yield
        finally:
            set_language(before)


def write_csv(rows: list, path: Path) -> None:
    with open(path, "w", newline="", encoding="utf-8") as f:
        w = csv.writer(f)
        w.writerow(["student", "lesson", "exercise", "points", "verdict"])
        for r in rows:
            w.writerow([r.student, r.lesson, r.exercise, f"{r.points:g}", r.verdict])


STYLE = """body{font-family:sans-serif;max-width:60em;margin:2em auto;padding:0 1em;color:#222}
table{border-collapse:collapse;width:100%;margin-bottom:2em}th,td{border:1px solid #ccc;padding:.4em;
text-align:left;vertical-align:top}th{background:#f3f3f3}td.n{text-align:right;white-space:nowrap}
tr.correct td.n{background:#e6f4ea}tr.incorrect td.n,tr.not.run td.n{background:#fce8e6}
td.v{white-space:pre-wrap}"""


def feedback_page(student: str, rows: list) -> str:
    """One student's page, self-contained (inline style, no script, no link out), in the language of
    most of their notebooks; each lesson in its own notebook's language."""
    from lessonkit import set_language
    zh = sum(r.language == "zh" for r in rows) > len(rows) / 2
    e = html.escape
    with speaking("zh" if zh else "en"):
        total = GRADER_SAYS["total"].format(points=sum(r.points for r in rows), possible=sum(r.possible for r in rows))
        parts = [f"<h1>{e(GRADER_SAYS['page title'].format(student=student))}</h1>", f"<p>{e(total)}</p>"]
        for key in dict.fromkeys((r.lesson, r.notebook) for r in rows):
            mine = [r for r in rows if (r.lesson, r.notebook) == key]
            set_language(mine[0].language)
            heading = GRADER_SAYS["lesson"].format(lesson=key[0].split("/")[-1], notebook=key[1],
                                                   points=sum(r.points for r in mine),
                                                   possible=sum(r.possible for r in mine))
            parts.append(f"<h2>{e(heading)}</h2>")
            parts.append(f"<table><tr><th>{e(str(GRADER_SAYS['exercise']))}</th><th>{e(str(GRADER_SAYS['points']))}"
                         f"</th><th>{e(str(GRADER_SAYS['verdict']))}</th></tr>")
            parts += [f'<tr class="{e(r.status)}"><td>{e(r.title)}<br><code>{e(r.exercise)}</code></td>'
                      f'<td class="n">{r.points:g} / {r.possible:g}</td><td class="v">{e(r.verdict)}</td></tr>'
                      for r in mine]
            parts.append("</table>")
            set_language("zh" if zh else "en")
    head = (f'<!DOCTYPE html>\n<html lang="{"zh-CN" if zh else "en"}"><head><meta charset="utf-8">'
            f"<title>{e(student)}</title><style>{STYLE}</style></head><body>\n")
    return head + "\n".join(parts) + "\n</body></html>\n"


def write_feedback(rows: list, folder: Path) -> list[Path]:
    folder.mkdir(parents=True, exist_ok=True)
    pages = []
    for student in dict.fromkeys(r.student for r in rows):
        page = folder / f"{student}.html"
        page.write_text(feedback_page(student, [r for r in rows if r.student == student]), encoding="utf-8")
        pages.append(page)
    return pages
