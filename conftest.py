"""For every pytest run (the tests and nbval over notebooks/, from here down)."""


def _without_progress_lines():
    """nbval compares a cell's outputs without the new-build check's progress lines (both languages):
    whether a cell checks a build depends on what this checkout built and checked before (the
    builds and their records in .build/), not on the lesson. A stream left empty is dropped."""
    import re

    from nbval import plugin

    from lessonkit import language, native
    texts = []
    for lang in ("en", "zh"):
        before = language.set_language(lang)
        texts += [str(m) for m in (native.CHECKING_NEW, native.CHECKING_LONGER)]
        language.set_language(before)
    line = re.compile("^(?:" + "|".join(re.sub(r"\\\{[^}]*\\\}", ".*?", re.escape(t)) for t in texts) + ")\n",
                      re.MULTILINE)
    original = plugin.coalesce_streams

    def coalesce_streams(outputs):
        out = []
        for o in original(outputs) or []:
            if o.get("output_type") == "stream":
                o.text = line.sub("", o.text)
                if not o.text:
                    continue
            out.append(o)
        return out
    plugin.coalesce_streams = coalesce_streams
    return line


PROGRESS_LINE = _without_progress_lines()
