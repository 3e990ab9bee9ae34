"""The app's navigation: pages grouped in sections in the order a newcomer follows, each page under its section with
its title as its heading and its question as its first line. (The sidebar as drawn, every page visible without
"View more", is in tests/test_browser.py.)"""
import ast
import re
from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest

from ui import navigation

ROOT = Path(__file__).resolve().parent.parent
APP = str(ROOT / "app.py")
# Written out here, not read from ui/navigation.py: the order and the words are what this test holds.
EXPECTED = {
    "Start": ["Overview"],
    "Attention": ["Attention heads", "Attention rollout", "Attention distance", "Attention anatomy", "Queries & keys"],
    "Attribution": ["Attribution", "Faithfulness"],
    "Representations": ["Probes", "Painted concepts", "Features", "Readout"],
    "Weights": ["Embedding filters", "Position embeddings"],
    "Repair": ["Registers & sinks"],
    "Across models": ["Compare models"],
}


def _mkdocs() -> dict:
    import yaml

    return yaml.safe_load((ROOT / "mkdocs.yml").read_text())


def _nav_files(nav) -> list[str]:
    """Every Markdown file of mkdocs.yml's nav, at any depth."""
    if isinstance(nav, str):
        return [nav]
    items = nav.values() if isinstance(nav, dict) else nav
    return [f for item in items for f in _nav_files(item)]


def _docs_link(info: navigation.PageInfo) -> str:
    """The address of the page's section of the app tour, made here from mkdocs.yml's site_url and MkDocs' own
    heading ids (Python-Markdown's slugify), not by ui/navigation.py."""
    from markdown.extensions.toc import slugify

    return f"{_mkdocs()['site_url']}app/{info.docs}/#{slugify(info.title, '-')}"


def test_every_page_links_its_section_of_the_published_docs_and_that_section_is_in_the_nav():
    """Each page's first line links ``<site_url>app/<docs>/#<title>``: the published site (a user who only runs the
    app has no built one), its app-tour page in mkdocs.yml's nav, and a heading there with the page's title."""
    config = _mkdocs()
    assert config["site_url"].startswith("https://") and config["site_url"].endswith("/")
    nav = _nav_files(config["nav"])
    for info in navigation.PAGES:
        assert f"app/{info.docs}.md" in nav, info
        headings = re.findall(r"^#+ (.+)$", (ROOT / "docs" / "app" / f"{info.docs}.md").read_text(), re.M)
        assert info.title in headings, (info.docs, info.title)
        assert f"]({_docs_link(info)})" in navigation.first_line(info) and info.question in navigation.first_line(info)
    assert len({_docs_link(p) for p in navigation.PAGES}) == len(navigation.PAGES)  # one section per page


def concept_links() -> dict[str, list[str]]:
    """Each ``concepts_link("section")`` written in pages/ and ui/: section -> the files that use it."""
    found: dict[str, list[str]] = {}
    for path in sorted([*(ROOT / "pages").glob("*.py"), *(ROOT / "ui").glob("*.py")]):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "concepts_link":
                found.setdefault(node.args[0].value, []).append(path.name)
    return found


def test_help_texts_that_use_a_defined_term_link_its_section_of_the_concepts_page():
    from markdown.extensions.toc import slugify

    links = concept_links()
    assert {"chance", "distance-conventions", "patches-tokens-and-layers", "definitions-used"} <= set(links)
    assert len({f for files in links.values() for f in files}) >= 6  # overview, rollout, distance, faithfulness, ...
    sections = {slugify(h, "-") for h in re.findall(r"^#+ (.+)$", (ROOT / "docs" / "concepts.md").read_text(), re.M)}
    assert set(links) <= sections, set(links) - sections
    assert "concepts.md" in _nav_files(_mkdocs()["nav"])
    assert navigation.concepts_link("chance") == f"([Concepts]({_mkdocs()['site_url']}concepts/#chance))"


def test_every_page_file_is_in_one_section_once():
    files = [p.file for p in navigation.PAGES]
    assert sorted(files) == sorted(f"pages/{p.name}" for p in (ROOT / "pages").glob("*.py"))
    assert len(set(files)) == len(files)
    for p in navigation.PAGES:
        assert p.question.endswith("?") and p.title and (ROOT / "docs" / "app" / f"{p.docs}.md").exists(), p


@pytest.mark.slow
def test_app_py_groups_the_pages_in_sections(monkeypatch):
    import streamlit

    seen = []
    real = streamlit.navigation

    def recording(pages, **kwargs):
        seen.append((pages, kwargs))
        return real(pages, **kwargs)

    monkeypatch.setattr(streamlit, "navigation", recording)
    at = AppTest.from_file(APP, default_timeout=240).run()
    assert not at.exception, [e.message for e in at.exception]
    pages, kwargs = seen[-1]
    got = {section: [p.title for p in ps] for section, ps in pages.items()}
    assert list(got) == list(EXPECTED) and got == EXPECTED
    assert kwargs.get("expanded") is True  # Streamlit otherwise folds pages past the tenth under "View more"
    by_title = {p.title: p for ps in pages.values() for p in ps}
    assert by_title["Overview"]._default  # the page a bare address opens
    # Deep links keep their addresses: the URL path comes from the file name, not the (changed) titles.
    assert by_title["Attention rollout"].url_path == "rollout" and by_title["Painted concepts"].url_path == "concepts"
    assert any(h.value.startswith("Overview · ") for h in at.header)


@pytest.mark.slow
def test_every_page_opens_with_its_title_and_its_question():
    at = AppTest.from_file(APP, default_timeout=300).run()
    for section, titles in EXPECTED.items():
        for title, info in zip(titles, navigation.SECTIONS[section]):
            at.switch_page(info.file).run()
            assert not at.exception, (info.file, [e.message for e in at.exception])
            heading = at.main.header[0].value
            assert heading == title or heading.startswith(f"{title} · "), (info.file, heading)
            # the first line under the heading: the question and the link to the page's documentation
            assert at.main.markdown[0].value == f"**{info.question}** · [How to read this page]({_docs_link(info)})"


def test_the_readme_and_get_started_list_every_page_with_its_question():
    """The front page's table and Get started's say what each page answers in the app's own words, linked to its
    app-tour section: a page added to ui/navigation.py without them fails here."""
    for doc, folder in ((ROOT / "README.md", "docs/app/"), (ROOT / "docs" / "get-started.md", "app/")):
        text = doc.read_text()
        for p in navigation.PAGES:
            assert p.question in text and f"[{p.title}]({folder}{p.docs}.md#" in text, (doc.name, p.title)
