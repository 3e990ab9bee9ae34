"""Compare models: a per-head statistic against depth, several models overlaid (ViT paper Fig. 7 right); layer x layer
representation similarity (CKA) within a model or between two, a CNN included."""
import streamlit as st

from ui.compare import choose_statistic, depth_section, intro, stats_tables
from ui.navigation import heading
from ui.similarity import similarity_section
from ui.state import setup

ctx = setup()  # the tables need no image: without one, only the in-app run is unavailable
heading(__file__)
stats_tab, cka_tab = st.tabs(["Per-head statistics", "Layer similarity (CKA)"])
with cka_tab:
    similarity_section(ctx)
with stats_tab:
    intro()
    tables = stats_tables(ctx)  # uploaded, typed on this machine, or run here on the sidebar's images
    if not tables:
        st.info("Upload one or more stats.parquet files, or add this session's images with the current model.")
        st.stop()
    statistic, relative = choose_statistic()
    depth_section(tables, statistic, relative)
