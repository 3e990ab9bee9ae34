"""The app's pages in sections, in the order a newcomer follows them: app.py's navigation, each page's heading and
the question it answers, and the documentation's app tour all read this one list.

A page's title is its sidebar label and the start of its heading (``Title`` or ``Title · detail``); its question is
the page's first line under the heading, with a link to the page's section of the documentation's app tour
(``docs`` names its page, docs/app/<docs>.md) on the published site, whose address is mkdocs.yml's ``site_url``.
"""
from __future__ import annotations

import re
import unicodedata
from dataclasses import dataclass
from pathlib import Path

import streamlit as st

ROOT = Path(__file__).resolve().parent.parent


def _site_url() -> str:
    """mkdocs.yml's ``site_url``: the one place that says where the documentation site is published. The app links
    there (not to a site built in the checkout: a user who only ran the app has none, and a browser does not follow
    an http page's link to a file:// address)."""
    found = re.search(r"^site_url:\s*(\S+)\s*$", (ROOT / "mkdocs.yml").read_text(), re.M)
    return found.group(1).rstrip("/") + "/"


DOCS_URL = _site_url()


def anchor(title: str) -> str:
    """A heading's id as MkDocs' table of contents makes it (Python-Markdown's ``slugify``): "Registers & sinks" ->
    "registers-sinks"."""
    text = unicodedata.normalize("NFKD", title).encode("ascii", "ignore").decode()
    return re.sub(r"[-\s]+", "-", re.sub(r"[^\w\s-]", "", text).strip().lower())


@dataclass(frozen=True)
class PageInfo:
    """One app page: ``file`` relative to the repository root, the sidebar ``title``, the ``question`` it answers."""

    file: str
    title: str
    question: str
    docs: str


SECTIONS: dict[str, list[PageInfo]] = {
    "Start": [
        PageInfo("pages/1_overview.py", "Overview",
                 "What does the model see of this image: its patches, its top classes, its tokens?", "start"),
    ],
    "Attention": [
        PageInfo("pages/2_heads.py", "Attention heads",
                 "Where does each head of each layer look from a patch or the class token?", "attention"),
        PageInfo("pages/3_rollout.py", "Attention rollout",
                 "Which patches reach the output when attention is followed through every layer?", "attention"),
        PageInfo("pages/4_distance.py", "Attention distance",
                 "How far does each head look: locally like a convolution or across the whole image?", "attention"),
        PageInfo("pages/7_anatomy.py", "Attention anatomy",
                 "How is one attention row computed, step by step from queries and keys to the weights?",
                 "attention"),
        PageInfo("pages/13_queries_keys.py", "Queries & keys",
                 "Which queries meet which keys in each head, over a whole image set?", "attention"),
    ],
    "Attribution": [
        PageInfo("pages/10_attribution.py", "Attribution",
                 "Which pixels and patches made the model choose this class?", "attribution"),
        PageInfo("pages/8_faithfulness.py", "Faithfulness",
                 "Which map can I trust: does deleting the patches it ranks first change the prediction most?",
                 "attribution"),
    ],
    "Representations": [
        PageInfo("pages/14_probes.py", "Probes",
                 "What does each layer know: can a linear probe read my labels from its tokens?", "representations"),
        PageInfo("pages/15_concepts.py", "Painted concepts",
                 "Where in the image and from which layer on does the model hold a concept I paint?",
                 "representations"),
        PageInfo("pages/12_features.py", "Features",
                 "Which sparse features (SAE latents) fire on this image, and where?", "representations"),
        PageInfo("pages/16_readout.py", "Readout",
                 "What did each head, MLP and patch write toward the answer, in the answer's own units?",
                 "representations"),
    ],
    "Weights": [
        PageInfo("pages/5_filters.py", "Embedding filters",
                 "What do the patch-embedding filters look for before any attention?", "weights"),
        PageInfo("pages/6_position_embeddings.py", "Position embeddings",
                 "Has the model learned where each patch sits in the grid?", "weights"),
    ],
    "Repair": [
        PageInfo("pages/11_registers.py", "Registers & sinks",
                 "Which tokens store global information in background patches, and does a register repair the maps?",
                 "repair"),
    ],
    "Across models": [
        PageInfo("pages/9_compare.py", "Compare models",
                 "How do models differ in how far their heads look, layer by layer?", "compare"),
    ],
}
PAGES: list[PageInfo] = [p for pages in SECTIONS.values() for p in pages]


def page_info(file: str) -> PageInfo:
    """The page whose file name is ``file``'s (a page passes its ``__file__``)."""
    name = Path(file).name
    return next(p for p in PAGES if Path(p.file).name == name)


def docs_url(info: PageInfo) -> str:
    """The page's section of the documentation's app tour: ``<site_url>app/<docs>/#<title's anchor>``."""
    return f"{DOCS_URL}app/{info.docs}/#{anchor(info.title)}"


def concepts_link(section: str) -> str:
    """A Markdown link to ``section`` (a heading's anchor) of the Concepts page, for a help text that uses a term
    the page defines: "… inside: chance ([Concepts](…/concepts/#chance))"."""
    return f"([Concepts]({DOCS_URL}concepts/#{section}))"


def first_line(info: PageInfo) -> str:
    """The page's first line: its question, in bold, and the link to its part of the documentation."""
    return f"**{info.question}** · [How to read this page]({docs_url(info)})"


def heading(file: str, detail: str | None = None) -> None:
    """The page's heading (its sidebar title, `` · detail`` when given) and, as its first line, its question and
    the link to its documentation."""
    info = page_info(file)
    st.header(info.title + (f" · {detail}" if detail else ""))
    st.markdown(first_line(info))
