"""vitviz, the Streamlit app: `scripts/app.sh` (sets everything up) or `streamlit run app.py`."""
import sys

import streamlit as st

st.set_page_config(page_title="vitviz", layout="wide")
# The page list first: ui.navigation needs only Streamlit. Until the script calls st.navigation, a cold server's
# sidebar lists the pages/ folder's file names ("overview", "heads"), for as long as the imports below take.
from ui import navigation  # noqa: E402

# Sections in the order a newcomer follows them (ui/navigation.py); expanded: every page shows without "View more".
SECTIONS = {section: [st.Page(p.file, title=p.title, default=p.file == "pages/1_overview.py") for p in pages]
            for section, pages in navigation.SECTIONS.items()}
page = st.navigation(SECTIONS, expanded=True)
# The first run after a server start imports PyTorch, timm and Plotly (about 10 s): say so instead of a blank page.
with st.spinner("Starting vitviz: loading PyTorch, timm and Plotly (once per server start) …", show_time=True) \
        if "torch" not in sys.modules else st.empty():
    import ui.warmup  # noqa: F401  (before any session draws a figure: see its docstring)
    from ui.onboarding import first_visit
    from ui.guard import guarded
# Streamlit's default side padding costs the head grid ~90 px at 1440 px: tiles stay >= 220 px.
st.markdown("<style>.block-container, [data-testid='stMainBlockContainer'] {padding: 2.5rem 1.5rem 2rem;}</style>",
            unsafe_allow_html=True)
if first_visit(page.url_path):  # a sample picked in the first visit's explanation opens the heads page
    st.switch_page(next(p for pages in SECTIONS.values() for p in pages if p.title == "Attention heads"))
with guarded(f"the {page.title} page"):  # a failure shows a sentence; what was drawn stays
    page.run()
