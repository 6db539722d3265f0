"""make site and make handouts (workbench/site.py, workbench/handouts.py): both editions build with no
network and every warning an error; nothing in them loads from another host; every lesson is in both,
and every link between them lands on a page (and its anchor); a page of each edition shows its text,
plots and math in Chromium without a request leaving the machine; every handout holds its title, and
every Chinese one embeds a Chinese font.

The site is built once, and printed once, for the whole file (module fixtures): about 20 s and 20 s.
Skipped, with the reason, where the site extra (make site installs it), Chromium or poppler-utils is
missing, as on a student's laptop; .ci/run installs them all.
"""
from __future__ import annotations

import functools
import json
import re
import shutil
import subprocess
import sys
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import unquote, urldefrag

import pytest

from workbench import handouts, site

REPO = Path(__file__).resolve().parent.parent
PAGES = ("index", "glossary", "references")
# The proof that the namespace has no network: a connection to a public address must fail
OFFLINE_PROBE = ("import socket, sys; s = socket.socket(); s.settimeout(5); err = s.connect_ex(('1.1.1.1', 443)); "
                 "sys.exit('the namespace reaches 1.1.1.1:443') if err == 0 else None")
# Fonts that draw Chinese, by the names PDF files give them (Debian's, macOS's and Windows' usual ones)
CJK_FONT = re.compile(r"CJK|WenQuanYi|WQY|SourceHan|Source ?Han|PingFang|Hiragino|Heiti|Songti|STHeiti|"
                      r"DroidSansFallback|AR ?PL|UMing|UKai|YaHei|SimSun|SimHei|NotoSans(?:SC|TC)|NotoSerif(?:SC|TC)",
                      re.I)
# Inside MathJax's bundle, URLs on a CDN that the pages never request: speech-rule-engine's defaults for
# its rule files and for Internet Explorer's XPath, which MathJax replaces with its own copy in the
# browser (its a11y/sre component points SRE at [mathjax]/sre/mathmaps: components/src/a11y/sre/
# sre_config.js in the django-static-mathjax package);
# test_pages_in_chromium sees every request a page makes
KNOWN_UNUSED = ("https://cdn.jsdelivr.net/npm/speech-rule-engine@", "https://cdn.jsdelivr.net/npm/sre-mathmaps-ie@",
                "https://cdn.jsdelivr.net/npm/wicked-good-xpath@")
REMOTE = re.compile(r"^(?:[a-z][a-z0-9+.-]*:)?//", re.I)  # http://, https://, //host (scheme-relative)
CSS_LOADS = re.compile(r"""@import\s+(?:url\(\s*)?["']?([^"')\s;]+)|url\(\s*["']?([^"')\s]+)""", re.I)
# In a script: a URL of a file a page could load (code, a stylesheet, a font, data), or one on a CDN
SCRIPT_LOADS = re.compile(r"""https?://[^\s"'`<>()\\]+?\.(?:m?js|css|woff2?|ttf|otf|eot|json|wasm)\b|"""
                          r"""https?://(?:[a-z0-9-]+\.)*(?:jsdelivr\.net|unpkg\.com|cdnjs\.cloudflare\.com|"""
                          r"""googleapis\.com|gstatic\.com|bootstrapcdn\.com|jquery\.com|fontawesome\.com/kit)"""
                          r"""[^\s"'`<>()\\]*""", re.I)

missing = site.missing_requirements()
pytestmark = pytest.mark.skipif(bool(missing), reason=f"the site extra is not installed ({', '.join(missing)}): "
                                                      f"{site.INSTALL_HINT}")


def no_network_prefix() -> tuple[list[str] | None, str]:
    """The command prefix of a network namespace with no network (root: unshare -n; else user
    namespaces: unshare -rn), or None with the reason there is none here."""
    if not shutil.which("unshare"):
        return None, "no unshare (util-linux; Linux only)"
    tried = []
    for prefix in (["unshare", "-n"], ["unshare", "-rn"]):
        r = subprocess.run([*prefix, "true"], capture_output=True, text=True)
        if r.returncode == 0:
            return prefix, ""
        tried.append(f"{' '.join(prefix)}: {(r.stderr.strip().splitlines() or ['refused'])[0]}")
    return None, "; ".join(tried)


def run_tool(args: list[str], prefix: list[str] | None) -> subprocess.CompletedProcess:
    """python -m workbench ARGS, inside the namespace when there is one (loopback up, the probe first)."""
    if prefix is None:
        return subprocess.run([sys.executable, "-m", "workbench", *args], cwd=REPO, capture_output=True, text=True)
    script = 'ip link set lo up 2>/dev/null; "$0" -c "$1" || exit 1; shift; exec "$0" -m workbench "$@"'
    return subprocess.run([*prefix, "sh", "-c", script, sys.executable, OFFLINE_PROBE, *args], cwd=REPO,
                          capture_output=True, text=True)


@pytest.fixture(scope="module")
def no_network():
    return no_network_prefix()


@pytest.fixture(scope="module")
def built(tmp_path_factory, no_network):
    """The two sites, built once for this file into a temporary folder (with no network if possible)."""
    out = tmp_path_factory.mktemp("site")
    return out, run_tool(["site", "--out", str(out)], no_network[0])


@pytest.fixture(scope="module")
def site_dir(built) -> Path:
    out, result = built
    if result.returncode != 0:
        pytest.fail(f"make site failed:\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}")
    return out


@pytest.fixture(scope="module")
def printed(site_dir, no_network, tmp_path_factory):
    missing_print = handouts.missing_requirements()
    if missing_print:
        pytest.skip("make handouts needs " + "; ".join(missing_print))
    out = tmp_path_factory.mktemp("handouts")
    result = run_tool(["handouts", "--site", str(site_dir), "--out", str(out)], no_network[0])
    if result.returncode != 0:
        pytest.fail(f"make handouts failed:\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}")
    return out


class Page(HTMLParser):
    """What the checks read from a page: its links, the files it loads, its ids and inline styles."""

    LOADS = {"script": "src", "img": "src", "iframe": "src", "source": "src", "audio": "src", "video": "src",
             "embed": "src", "object": "data", "track": "src", "input": "src"}

    def __init__(self, path: Path):
        super().__init__(convert_charrefs=True)
        self.path, self.links, self.loads, self.ids, self.styles = path, [], [], set(), []
        self.lang, self._in_style = None, False
        self.feed(path.read_text(encoding="utf-8"))

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if a.get("id"):
            self.ids.add(a["id"])
        if tag == "html":
            self.lang = a.get("lang")
        if tag == "a" and a.get("href"):
            self.links.append(a["href"])
        if tag == "link" and a.get("href") and not {"canonical", "alternate"} & set((a.get("rel") or "").split()):
            self.loads.append(a["href"])
        if tag in self.LOADS and a.get(self.LOADS[tag]):
            self.loads.append(a[self.LOADS[tag]])
        if a.get("style"):
            self.styles.append(a["style"])
        self._in_style = tag == "style"

    def handle_endtag(self, tag):
        self._in_style = False

    def handle_data(self, data):
        if self._in_style:
            self.styles.append(data)


@functools.lru_cache(maxsize=None)
def parse(path: Path) -> Page:
    return Page(path)


def html_files(site_dir: Path) -> list[Path]:
    return sorted(p for e in site.EDITIONS for p in (site_dir / e).rglob("*.html"))


def squeeze(text: str) -> str:
    """The text without white space, which a PDF's text or a page's layout adds at line ends."""
    return re.sub(r"\s+", "", text)


def test_site_builds_with_no_network_and_warnings_as_errors(built, no_network):
    out, result = built
    command = site.sphinx_command("en", out / ".build" / "en")
    assert "-W" in command and "--keep-going" in command, command
    assert result.returncode == 0, f"{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
    assert "WARNING" not in result.stdout + result.stderr
    if no_network[0] is None:
        pytest.skip(f"built with the network: no network namespace here ({no_network[1]})")


def test_every_lesson_is_in_both_editions_with_its_twin(site_dir):
    names = site.lessons("en")
    assert names == site.lessons("zh") and len(names) >= 11, names
    for edition in site.EDITIONS:
        other = "zh" if edition == "en" else "en"
        for name in (*names, *PAGES):
            page = site_dir / edition / f"{name}.html"
            assert page.is_file(), page
            parsed = parse(page)
            assert f"../{other}/{name}.html" in parsed.links, f"{page} does not link to its twin"
            assert parsed.lang == ("zh-CN" if edition == "zh" else "en"), (page, parsed.lang)
        for name in names:  # the notebook of that edition, for download
            assert (site_dir / edition / "_sources" / f"{name}.ipynb").read_bytes() == \
                   (REPO / site.LESSON_DIRS[edition] / f"{name}.ipynb").read_bytes()
            assert f"_sources/{name}.ipynb" in parse(site_dir / edition / f"{name}.html").links
    for edition in site.EDITIONS:  # the first page says how to run the workbook
        text = re.sub(r"<[^>]+>", "", (site_dir / edition / "index.html").read_text(encoding="utf-8"))
        assert all(command in text for command in ("make lab", "make test", "make lab-zh")), edition


def test_only_a_cell_that_only_sets_the_language_is_hidden():
    sys.path.insert(0, str(site.CONF_DIR))
    try:
        from workbook_site import only_sets_language
    finally:
        sys.path.remove(str(site.CONF_DIR))
    first = {}
    for edition in site.EDITIONS:
        for name in site.lessons(edition):
            nb = json.loads((REPO / site.LESSON_DIRS[edition] / f"{name}.ipynb").read_text(encoding="utf-8"))
            first[edition, name] = "".join(next(c for c in nb["cells"] if c["cell_type"] == "code")["source"])
    assert all(only_sets_language(src) for (edition, _), src in first.items() if edition == "zh")
    assert not any(only_sets_language(src) for (edition, _), src in first.items() if edition == "en")
    assert only_sets_language("from lessonkit import set_language\nset_language('zh')")
    assert only_sets_language("import lessonkit as lk\nlk.set_language('en');")
    for other in ("import lessonkit\nlessonkit.set_language('zh')\nprint(1)", "import lessonkit", "set_language('zh')",
                  "import lessonkit, numpy\nlessonkit.set_language('zh')", "lessonkit.set_language(", ""):
        assert not only_sets_language(other), other


def test_the_chinese_language_cell_is_not_shown(site_dir):
    for name in site.lessons("zh"):
        assert "set_language" not in (site_dir / "zh" / f"{name}.html").read_text(encoding="utf-8"), name
    assert "set_language" in (REPO / "notebooks" / "zh" / "00_start_here.ipynb").read_text(encoding="utf-8")


def test_every_link_between_pages_and_editions_lands(site_dir):
    """Each relative link of every page names a file that exists, and an id that its page has: within
    an edition and across to the other one (the lessons link with Jupyter's anchors)."""
    across, bad = 0, []
    for page in html_files(site_dir):
        for href in parse(page).links:
            if REMOTE.match(href) or href.startswith(("mailto:", "javascript:")):
                continue
            path, anchor = urldefrag(href)
            target = (page.parent / unquote(path)).resolve() if path else page
            if not target.is_file():
                bad.append(f"{page.relative_to(site_dir)}: {href} (no such file)")
                continue
            edition = page.relative_to(site_dir).parts[0]
            if target.relative_to(site_dir).parts[0] != edition:
                across += 1
            if anchor and target.suffix == ".html":
                if unquote(anchor) not in parse(target).ids:
                    bad.append(f"{page.relative_to(site_dir)}: {href} (no id {unquote(anchor)!r} there)")
    assert not bad, "\n".join(bad)
    assert across >= 2 * len(site.lessons()), across  # at least the twins


def test_nothing_loads_from_another_host(site_dir):
    bad = []
    for page in html_files(site_dir) + [site_dir / "index.html"]:
        parsed = parse(page)
        bad += [f"{page.relative_to(site_dir)}: loads {u}" for u in parsed.loads if REMOTE.match(u)]
        for style in parsed.styles:
            bad += [f"{page.relative_to(site_dir)}: style loads {a or b}" for a, b in CSS_LOADS.findall(style)
                    if REMOTE.match(a or b)]
    for sheet in sorted(site_dir.rglob("*.css")):
        text = sheet.read_text(encoding="utf-8", errors="replace")
        bad += [f"{sheet.relative_to(site_dir)}: loads {a or b}" for a, b in CSS_LOADS.findall(text)
                if REMOTE.match(a or b)]
    for script in sorted(site_dir.rglob("*.js")):
        text = script.read_text(encoding="utf-8", errors="replace")
        bad += [f"{script.relative_to(site_dir)}: loads {a or b}" for a, b in CSS_LOADS.findall(text)
                if REMOTE.match(a or b)]
        bad += [f"{script.relative_to(site_dir)}: names {u}" for u in SCRIPT_LOADS.findall(text)
                if not u.startswith(KNOWN_UNUSED)]
    assert not bad, "\n".join(bad)
    # MathJax is the site's own
    for edition in site.EDITIONS:
        assert (site_dir / edition / "_static" / "mathjax" / "tex-chtml.js").is_file()
        assert '_static/mathjax/tex-chtml.js' in (site_dir / edition / "02_online_softmax.html").read_text(encoding="utf-8")


@pytest.mark.parametrize("edition", site.EDITIONS)
def test_pages_in_chromium(site_dir, edition, tmp_path):
    """Lesson 02 (plots, math, a table) as a reader sees it: its title in its language, its plots
    loaded, its math typeset, and no request that leaves the machine."""
    if handouts.missing_requirements():
        pytest.skip("needs " + "; ".join(handouts.missing_requirements()))
    from PIL import Image
    from playwright.sync_api import sync_playwright

    name = "02_online_softmax"
    requests: list[str] = []
    with sync_playwright() as pw:
        browser = handouts.launch(pw)
        try:
            context = browser.new_context(viewport={"width": 1280, "height": 900})
            context.on("request", lambda r: requests.append(r.url))
            refused: list[str] = []
            handouts.refuse_remote(context, refused)
            page = context.new_page()
            page.goto((site_dir / edition / f"{name}.html").as_uri(), wait_until="load")
            page.evaluate(handouts.SETTLE)
            heading = page.locator("article h1").first
            assert squeeze(heading.inner_text()).rstrip("#") == squeeze(site.lesson_title(edition, name))
            if edition == "zh":
                assert re.search(r"[\u4e00-\u9fff]", heading.inner_text())
            shot = tmp_path / "heading.png"
            heading.screenshot(path=str(shot))
            histogram = Image.open(shot).convert("L").histogram()  # pixels per grey level
            dark, levels = sum(histogram[:128]), sum(1 for n in histogram if n)
            assert dark > 200 and levels > 8, f"the heading looks blank ({dark} dark pixels, {levels} greys)"
            images = page.evaluate("""() => Array.from(document.querySelectorAll('article img'))
                .map(i => [i.getAttribute('src'), i.complete, i.naturalWidth])""")
            assert len(images) >= 2 and all(ok and width > 0 for _, ok, width in images), images
            assert page.locator("mjx-container").count() > 0, "no math typeset by MathJax"
            assert page.locator("article table").count() > 0
            # the site's search, from disk as well: a word of the lesson's title finds the lesson
            word = "在线" if edition == "zh" else "softmax"
            page.goto((site_dir / edition / "search.html").as_uri() + f"?q={word}", wait_until="load")
            page.wait_for_function("document.querySelectorAll('#search-results li').length > 0", timeout=20000)
            assert f"{name}.html" in page.locator("#search-results").inner_html()
        finally:
            browser.close()
    assert not refused, refused
    assert requests and all(u.startswith(handouts.LOCAL_SCHEMES) for u in requests), \
        [u for u in requests if not u.startswith(handouts.LOCAL_SCHEMES)]


def pdf_tools():
    if not (shutil.which("pdffonts") and shutil.which("pdftotext")):
        pytest.skip("needs pdffonts and pdftotext (Debian: apt install poppler-utils)")


def test_every_handout_holds_its_lesson_title(printed):
    """Slow once (about 30 s here, in its fixture): Chromium prints every handout of both editions, once for the
    tests of this file."""
    pdf_tools()
    for edition in site.EDITIONS:
        for name in site.lessons(edition):
            pdf = printed / edition / f"{name}.pdf"
            assert pdf.is_file(), pdf
            text = subprocess.run(["pdftotext", "-l", "2", str(pdf), "-"], capture_output=True, text=True,
                                  check=True).stdout
            assert squeeze(site.lesson_title(edition, name)) in squeeze(text), (pdf, text[:300])


def test_chinese_handouts_embed_a_chinese_font(printed):
    pdf_tools()
    for name in site.lessons("zh"):
        pdf = printed / "zh" / f"{name}.pdf"
        lines = subprocess.run(["pdffonts", str(pdf)], capture_output=True, text=True, check=True).stdout.splitlines()
        # name, then type, encoding, emb, sub, uni, object id; the type may hold spaces ("CID TrueType")
        embedded = [line.split()[0] for line in lines[2:] if re.search(r"\s(yes)\s+(?:yes|no)\s+(?:yes|no)\s+\d+\s+\d+\s*$", line)]
        assert any(CJK_FONT.search(font) for font in embedded), (pdf, lines)
