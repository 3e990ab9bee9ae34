"""Documentation a researcher uses, typed by the tests: the README's and the docs' Python examples (their printed
lines are the pages'), the two scripts in examples/ and the tutorial scripts on the bundled model, and the site
itself: `scripts/docs.sh` builds it with --strict (any warning, a broken link or anchor, fails), every picture a
page shows is there and loads in Chromium, no page logs an error, the CLI and API references are complete, and every
app page has its screenshot."""
import html.parser
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def _run(args: list[str], cwd: Path, timeout: int = 900) -> str:
    env = os.environ | {"HF_HUB_OFFLINE": "1", "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "Traceback" not in done.stderr
    return done.stdout


@pytest.fixture
def run_here(monkeypatch, capsys):
    """``_run`` in this process: ``run_here(args, cwd)`` runs ``python *args`` from ``cwd`` with runpy as the
    interpreter would (``sys.argv``, the script's folder first on ``sys.path``, ``__main__``) and returns what it
    printed; no interpreter, torch import and model load of its own (~10 s of CPU each). The tutorials' first line
    and the README's example still run in a process of their own, as typed."""
    import runpy

    def run(args: list[str], cwd: Path) -> str:
        monkeypatch.chdir(cwd)
        script = Path(args[0]) if Path(args[0]).is_absolute() else cwd / args[0]
        monkeypatch.setattr(sys, "argv", [args[0], *args[1:]])
        monkeypatch.syspath_prepend(str(script.parent))
        capsys.readouterr()
        runpy.run_path(str(script), run_name="__main__")
        printed, err = capsys.readouterr()
        assert "Traceback" not in err
        return printed

    return run


def _example(text: str) -> tuple[str, str]:
    """The first ```python block of ``text`` and the ```text block after it (what it prints)."""
    code = re.search(r"```python\n(.*?)```", text, re.S)
    printed = re.search(r"```text\n(.*?)```", text[code.end():], re.S).group(1)
    return code.group(1), printed


@pytest.mark.slow
def test_the_from_python_page_example_prints_what_the_page_says(tmp_path, bundled, run_here):
    code, printed = _example((ROOT / "docs" / "guide" / "python.md").read_text())
    (tmp_path / "assets").symlink_to(ROOT / "assets")
    (tmp_path / "example.py").write_text(code)
    assert run_here(["example.py"], tmp_path) == printed
    assert (tmp_path / "out" / "trace" / "trace.npz").is_file()


@pytest.mark.slow
def test_the_readme_python_example_prints_what_the_readme_says(tmp_path, bundled):
    text = (ROOT / "README.md").read_text()
    code, printed = _example(text[text.index("## From Python"):])
    assert len(code.strip().splitlines()) <= 12  # the front page's example stays short
    (tmp_path / "assets").symlink_to(ROOT / "assets")
    (tmp_path / "example.py").write_text(code)
    assert _run(["example.py"], tmp_path) == printed


@pytest.mark.slow
def test_the_heads_figure_example_writes_one_row_per_image(tmp_path, bundled, run_here):
    from PIL import Image

    out = run_here([str(ROOT / "examples" / "heads_figure.py"), str(ROOT / "assets"), "--layer", "12",
                    "--max-images", "2", "--out", str(tmp_path / "heads.png")], tmp_path)
    assert out.strip() == f"wrote {tmp_path / 'heads.png'}: 2 images x 6 heads, layer 12"
    with Image.open(tmp_path / "heads.png") as im:
        assert im.size[0] > 2 * im.size[1]  # 7 columns (the image and 6 heads) by 2 rows


@pytest.mark.slow
def test_the_faithfulness_example_prints_a_verdict_per_method(tmp_path, bundled, run_here):
    out = run_here([str(ROOT / "examples" / "attnlrp_vs_rollout.py"), str(ROOT / "assets"), "--max-images", "2",
                    "--steps", "3"], tmp_path).splitlines()
    assert out[0].startswith("2 images, DINOv2 ViT-S/14")
    rows = {line.split()[0]: line for line in out[2:]}
    assert set(rows) == {"attnlrp", "random", "rollout"}
    for method in ("attnlrp", "rollout"):
        assert rows[method].endswith(("within chance", "random seed"))


NUMBER = re.compile(r"-?\d+(?:\.\d+)?(?:e[-+]?\d+)?")


def assert_same_printout(printed: str, expected: str) -> None:
    """The printed lines equal the page's, each number within one unit of its last printed digit (a float rounded to
    2 decimals may land on the neighbouring value on another CPU of this kind: float32 sums in another order), the
    words exactly. Whole numbers (counts, indices) must be equal."""
    got, want = printed.splitlines(), expected.splitlines()
    assert len(got) == len(want), f"{len(got)} lines printed, the page shows {len(want)}:\n{printed}"
    for line, page in zip(got, want):
        assert NUMBER.sub("#", line) == NUMBER.sub("#", page), (line, page)
        for a, b in zip(NUMBER.findall(line), NUMBER.findall(page)):
            if "." not in b and "e" not in b:
                assert a == b, (line, page)
                continue
            decimals = len(b.split(".")[1].split("e")[0]) if "." in b else 0
            unit = 10.0 ** -decimals * (10.0 ** int(b.split("e")[1]) if "e" in b else 1.0)
            assert abs(float(a) - float(b)) <= 1.01 * unit, (line, page)


def _check_tutorial(args: list[str], script: str, page: str, figures: list[str], out: Path, run=_run) -> None:
    """docs/tutorials/<script>.py run with ``args`` (its documented line, --out pointed at ``out``) from the
    repository root (by ``run``: ``_run``, or the ``run_here`` fixture): its printed lines are
    docs/tutorials/<script>.txt, which the page includes; its page shows ``figures`` in that order, and the script
    writes each at the size of the one kept in docs/tutorials/img/."""
    from PIL import Image

    printed = run(args, ROOT)
    assert_same_printout(printed, (ROOT / "docs" / "tutorials" / f"{script}.txt").read_text())
    text = (ROOT / "docs" / "tutorials" / page).read_text()
    assert f'--8<-- "docs/tutorials/{script}.txt"' in text and f'--8<-- "docs/tutorials/{script}.py"\n' in text
    shown = re.findall(r"!\[[^]]*\]\(img/([^)]+)\)", text)
    assert shown == figures
    for name in shown:
        with Image.open(out / name) as made, Image.open(ROOT / "docs" / "tutorials" / "img" / name) as kept:
            assert made.size == kept.size, name  # the page's figure is this script's, at its size


@pytest.mark.slow
def test_the_tutorial_prints_what_its_page_shows_and_writes_its_figures(tmp_path, bundled):
    """docs/tutorials/first_maps.py run as its page says (from the repository root), into a temporary folder: its
    printed lines are the ones the page includes, and it writes the figures the page shows."""
    from conftest import readme_command

    args = readme_command(".venv/bin/python docs/tutorials/first_maps.py", tmp_path)
    _check_tutorial(args, "first_maps", "first-maps.md", ["maps.png", "deletion.png"], tmp_path)


@pytest.mark.slow
def test_the_probe_tutorial_prints_what_its_page_shows_and_writes_its_figures(tmp_path, bundled, run_here):
    from conftest import readme_command

    args = readme_command(".venv/bin/python docs/tutorials/probe_layer.py", tmp_path)
    _check_tutorial(args, "probe_layer", "probe-layer.md", ["probe_accuracy.png", "probe_maps.png"], tmp_path, run_here)


@pytest.mark.slow
def test_the_readout_tutorial_prints_what_its_page_shows_and_writes_its_figures(tmp_path, bundled, run_here):
    from conftest import readme_command

    args = readme_command(".venv/bin/python docs/tutorials/readout_parts.py", tmp_path)
    _check_tutorial(args, "readout_parts", "readout-parts.md", ["readout_heads.png", "logit_lens.png"], tmp_path,
                    run_here)


@pytest.mark.slow
def test_the_sae_tutorial_prints_what_its_page_shows_and_writes_its_figures(tmp_path, bundled, run_here):
    from conftest import readme_command

    args = readme_command(".venv/bin/python docs/tutorials/sae_features.py", tmp_path)
    _check_tutorial(args, "sae_features", "sae-features.md", ["sae_image.png", "sae_latent.png"], tmp_path, run_here)


@pytest.mark.slow
def test_the_heads_tutorial_prints_what_its_page_shows_and_writes_its_figures(tmp_path, bundled, run_here):
    from conftest import readme_command

    args = readme_command(".venv/bin/python docs/tutorials/what_heads_do.py", tmp_path)
    _check_tutorial(args, "what_heads_do", "what-heads-do.md", ["heads_qk.png", "heads_effects.png"], tmp_path,
                    run_here)


@pytest.mark.slow
def test_the_registers_tutorial_prints_what_its_page_shows_and_writes_its_figures(tmp_path, bundled, run_here):
    from conftest import readme_command

    args = readme_command(".venv/bin/python docs/tutorials/repair_registers.py", tmp_path)
    _check_tutorial(args, "repair_registers", "repair-registers.md", ["registers_sinks.png", "registers_planted.png"],
                    tmp_path, run_here)


def test_every_app_screenshot_was_taken_of_its_page_as_it_is():
    """docs/img/app/<address>.png exists and docs/img/app/taken.json records that it was taken of the page's file as
    it is now (its SHA-256, written by scripts/docs_screenshots.py): a page changed since its screenshot fails here,
    naming the command that retakes it. (A record, not the PNG's commit date: a retake can give the same bytes.)"""
    from ui.navigation import PAGES

    sys.path.insert(0, str(ROOT / "scripts"))
    from docs_screenshots import address, page_hash

    taken = json.loads((ROOT / "docs" / "img" / "app" / "taken.json").read_text())
    stale = [address(p.file) for p in PAGES
             if not (ROOT / "docs" / "img" / "app" / f"{address(p.file)}.png").is_file()
             or taken.get(address(p.file)) != page_hash(p.file)]
    assert not stale, (f"app pages changed since their screenshot: {stale}; retake them with "
                       f".venv/bin/python scripts/docs_screenshots.py --pages {','.join(stale)}, look at them and "
                       f"commit the PNGs and docs/img/app/taken.json")


class _Refs(html.parser.HTMLParser):
    """The pictures and local links of one built page."""

    def __init__(self):
        super().__init__()
        self.images, self.links = [], []

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if tag == "img" and attrs.get("src"):
            self.images.append(attrs["src"])
        if tag == "a" and attrs.get("href"):
            self.links.append(attrs["href"])


def _site(tmp: Path) -> Path:
    """The site built strictly into ``tmp``, once per test module: in CI by `scripts/docs.sh`, as the README says;
    elsewhere by the mkdocs command that script runs, because the script first runs scripts/ensure_venv.sh, which
    re-points a .venv shared by several checkouts at this one."""
    site = tmp / "site"
    if not (site / "index.html").exists():
        env = os.environ | {"SITE_DIR": str(site), "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1",
                            "NO_MKDOCS_2_WARNING": "1"}
        script = bool(os.environ.get("CI"))
        args = (["bash", "scripts/docs.sh"] if script
                else [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site)])
        done = subprocess.run(args, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
        assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]
        assert "WARNING" not in done.stderr, done.stderr[-4000:]
        assert not script or f"open file://{site}/index.html" in done.stdout
    return site


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    return _site(tmp_path_factory.mktemp("docs"))


@pytest.fixture(scope="module")
def served(site):
    """The built site over HTTP on a free local port, as a host serves it (the search index loads by fetch, which
    a page opened from a folder may not do); the server stops with the module."""
    import functools
    import http.server
    import threading

    class Quiet(http.server.SimpleHTTPRequestHandler):
        def log_message(self, *args):
            pass

    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(Quiet, directory=str(site)))
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_port}/"
    finally:
        httpd.shutdown()
        httpd.server_close()
        thread.join(timeout=10)


def test_the_site_builds_strictly_and_every_picture_and_link_is_there(site):
    pages = sorted(p for p in site.rglob("*.html") if p.name != "404.html")  # 404.html links by the site's root
    assert len(pages) > 30
    for page in pages:
        refs = _Refs()
        refs.feed(page.read_text())
        for src in refs.images:
            if not src.startswith(("http:", "https:", "data:")):
                assert (page.parent / src.split("#")[0]).resolve().is_file(), f"{page.relative_to(site)}: {src}"
        for href in refs.links:
            target = href.split("#")[0]
            if target and not re.match(r"^[a-z]+:", target):
                path = (page.parent / target).resolve()
                assert path.is_file() or (path / "index.html").is_file(), f"{page.relative_to(site)}: {href}"


def test_the_cli_reference_holds_every_command_and_option(site):
    import argparse

    from vitviz.cli.entry import parser

    text = (site / "cli" / "index.html").read_text()

    def subcommands(p):
        return next((a.choices for a in p._actions if isinstance(a, argparse._SubParsersAction)), {})

    assert {"analyze", "stats", "faithfulness", "probe", "features", "heads"} <= set(subcommands(parser()))
    todo, seen = list(subcommands(parser()).values()), 0
    while todo:
        sub = todo.pop()
        assert f"{sub.prog}</code>" in text, sub.prog
        for action in sub._actions:
            if not isinstance(action, argparse._HelpAction):
                for flag in action.option_strings:
                    assert f"<code>{flag}</code>" in text, (sub.prog, flag)
                    seen += 1
        todo += subcommands(sub).values()
    assert seen > 100 and "python -m vitviz features train</code>" in text


def test_every_public_name_has_a_docstring_and_is_in_the_api_reference(site):
    import vitviz

    text = (site / "api" / "index.html").read_text()
    for name in vitviz.__all__:
        if name == "__version__":
            continue
        value = getattr(vitviz, name)
        assert (value.__doc__ or "").strip(), name
        assert f'id="vitviz.{vitviz._PUBLIC[name]}.{name}"' in text, name
    assert "(B, L, H, N, N)" in text  # the shapes are in the reference, not only in the code


def test_every_app_page_has_its_screenshot_in_the_app_tour():
    """Each page of the app's navigation has docs/img/app/<address>.png (scripts/docs_screenshots.py takes them),
    shown on its section's app-tour page under its title; a new page without one fails here, naming the command."""
    from ui.navigation import PAGES

    missing = []
    for p in PAGES:
        address = re.sub(r"^\d+_", "", Path(p.file).stem)
        tour = (ROOT / "docs" / "app" / f"{p.docs}.md").read_text()
        shot = ROOT / "docs" / "img" / "app" / f"{address}.png"
        if not shot.is_file() or f"## {p.title}\n" not in tour or f"(../img/app/{address}.png)" not in tour:
            missing.append(address)
    assert not missing, (f"app pages without a screenshot in the app tour: {missing}; take them with "
                         f".venv/bin/python scripts/docs_screenshots.py --pages {','.join(missing)}")


# Every picture of the page once it has loaded (lazy ones made eager first): [source, natural width].
IMAGES_JS = """async () => {
  const imgs = [...document.images];
  imgs.forEach(i => { i.loading = 'eager'; });
  await Promise.all(imgs.map(i => i.complete ? null
    : new Promise(done => { i.addEventListener('load', done); i.addEventListener('error', done); })));
  return imgs.map(i => [i.currentSrc || i.src, i.naturalWidth]);
}"""


@pytest.mark.browser
def test_every_page_of_the_built_site_opens_in_chromium_without_an_error_a_missing_picture_or_a_broken_link(
        site, served):
    """Each page of the built site, served over HTTP, in Chromium: no console error, no uncaught exception, no
    failed request (an offline reader's browser fetches nothing from elsewhere), every <img> decoded (naturalWidth
    > 0), and every link into the site answers 200 and, when it names an anchor, lands on an element with that id."""
    import urllib.error
    import urllib.parse
    import urllib.request

    from test_browser import CHROMIUM, CHROMIUM_ARGS, VIEWPORT, require_chromium

    require_chromium()
    from playwright.sync_api import sync_playwright

    pages = sorted(p.relative_to(site).as_posix() for p in site.rglob("*.html") if p.name != "404.html")
    problems, links, ids = [], {}, {}
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        tab = browser.new_page(viewport=VIEWPORT)
        current = [""]
        tab.on("console", lambda m: m.type == "error" and problems.append(f"{current[0]}: console: {m.text}"))
        tab.on("pageerror", lambda e: problems.append(f"{current[0]}: exception: {e}"))
        # A request the next page's navigation cancels (the search worker, the favicon) is no failure.
        tab.on("requestfailed", lambda r: r.failure != "net::ERR_ABORTED"
               and problems.append(f"{current[0]}: request failed: {r.url} ({r.failure})"))
        tab.on("response", lambda r: r.status >= 400 and problems.append(f"{current[0]}: HTTP {r.status}: {r.url}"))
        for name in pages:
            current[0] = name
            url = served + name.removesuffix("index.html")
            response = tab.goto(url, wait_until="load")
            if response is None or response.status != 200:
                problems.append(f"{name}: HTTP {response and response.status}")
                continue
            for src, width in tab.evaluate(IMAGES_JS):
                if not width:
                    problems.append(f"{name}: picture not loaded: {src}")
            ids[url] = set(tab.evaluate("() => [...document.querySelectorAll('[id]')].map(e => e.id)"))
            for href in tab.evaluate("() => [...document.querySelectorAll('a[href]')].map(a => a.href)"):
                if href.startswith(served):
                    links.setdefault(href, name)
        browser.close()
    assert len(pages) > 30 and len(links) > 100, (len(pages), len(links))
    for href, name in sorted(links.items()):
        target, _, anchor = href.partition("#")
        if target not in ids:  # not a page visited above: a file (a picture, the sitemap, a download)
            try:
                with urllib.request.urlopen(target, timeout=30) as answer:
                    status = answer.status
            except urllib.error.HTTPError as error:
                status = error.code
            if status != 200:
                problems.append(f"{name}: broken link {href} (HTTP {status})")
        elif anchor and urllib.parse.unquote(anchor) not in ids[target]:
            problems.append(f"{name}: link to a missing anchor {href}")
    assert not problems, "\n".join(problems)


def test_the_app_pages_links_land_on_a_heading_of_the_built_site(site):
    """Each page's first-line link and each help text's Concepts link, read as a path under mkdocs.yml's site_url,
    is a page of the built site with an element of that id (the published site is this build)."""
    from test_navigation import concept_links
    from ui import navigation

    urls = [navigation.docs_url(p) for p in navigation.PAGES]
    urls += [re.search(r"\((http[^)]+)\)", navigation.concepts_link(s)).group(1) for s in concept_links()]
    for url in urls:
        assert url.startswith(navigation.DOCS_URL), url
        path, _, anchor = url.removeprefix(navigation.DOCS_URL).partition("#")
        page = site / path / "index.html"
        assert page.is_file() and f'id="{anchor}"' in page.read_text(), url
