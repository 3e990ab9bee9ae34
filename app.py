"""vitviz, the Streamlit app: `scripts/app.sh` (sets everything up) or `streamlit run app.py`."""
import sys

import streamlit as st

st.set_page_config(page_title="vitviz", layout="wide")
# The first run after a server start imports PyTorch, timm and Plotly (about 10 s): say so instead of a blank page.
with st.spinner("Starting vitviz: loading PyTorch, timm and Plotly (once per server start) …", show_time=True) \
        if "torch" not in sys.modules else st.empty():
    import ui.warmup  # noqa: F401  (before any session draws a figure: see its docstring)
    from ui.onboarding import first_visit
    from ui.guard import guarded
# Streamlit's default side padding costs the head grid ~90 px at 1440 px: tiles stay >= 220 px.
st.markdown("<style>.block-container, [data-testid='stMainBlockContainer'] {padding: 2.5rem 1.5rem 2rem;}</style>",
            unsafe_allow_html=True)
PAGES = [
    st.Page("pages/1_overview.py", title="Overview & tokens", default=True),
    st.Page("pages/2_heads.py", title="Attention heads"),
    st.Page("pages/3_rollout.py", title="Rollout"),
    st.Page("pages/4_distance.py", title="Attention distance"),
    st.Page("pages/5_filters.py", title="Embedding filters"),
    st.Page("pages/6_position_embeddings.py", title="Position embeddings"),
    st.Page("pages/7_anatomy.py", title="Attention anatomy"),
    st.Page("pages/8_faithfulness.py", title="Faithfulness"),
    st.Page("pages/9_compare.py", title="Compare models"),
    st.Page("pages/10_attribution.py", title="Attribution"),
    st.Page("pages/11_registers.py", title="Registers & sinks"),
    st.Page("pages/12_features.py", title="Features (SAE)"),
    st.Page("pages/13_queries_keys.py", title="Queries & keys"),
    st.Page("pages/14_probes.py", title="Probes"),
    st.Page("pages/15_concepts.py", title="Probes · painted concepts"),
    st.Page("pages/16_readout.py", title="Readout"),
]
page = st.navigation(PAGES)
if first_visit(page.url_path):  # a sample picked in the first visit's explanation opens the heads page
    st.switch_page(next(p for p in PAGES if p.title == "Attention heads"))
with guarded(f"the {page.title} page"):  # a failure shows a sentence; what was drawn stays
    page.run()
