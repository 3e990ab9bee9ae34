"""The app's pages in sections, in the order a newcomer follows them: app.py's navigation, each page's heading and
the question it answers, and the documentation's app tour all read this one list.

A page's title is its sidebar label and the start of its heading (``Title`` or ``Title · detail``); its question is
the page's first line under the heading. ``docs`` names the app-tour page of the documentation site (docs/app/).
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import streamlit as st


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


def heading(file: str, detail: str | None = None) -> None:
    """The page's heading (its sidebar title, `` · detail`` when given) and, as its first line, its question."""
    info = page_info(file)
    st.header(info.title + (f" · {detail}" if detail else ""))
    st.markdown(f"**{info.question}**")
