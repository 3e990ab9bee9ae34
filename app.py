"""vitviz, the Streamlit app: `scripts/app.sh` (sets everything up) or `streamlit run app.py`."""
import streamlit as st

st.set_page_config(page_title="vitviz", layout="wide")
PAGES = [
    st.Page("pages/1_overview.py", title="Overview & tokens", default=True),
    st.Page("pages/2_heads.py", title="Attention heads"),
    st.Page("pages/3_rollout.py", title="Rollout"),
    st.Page("pages/4_distance.py", title="Attention distance"),
    st.Page("pages/5_filters.py", title="Embedding filters"),
    st.Page("pages/6_position_embeddings.py", title="Position embeddings"),
]
st.navigation(PAGES).run()
