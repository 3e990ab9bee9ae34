"""Attention heads: every head of a layer over the image; query, direction, threshold; compare layers."""
import streamlit as st

from ui import windows
from ui.explorer import browser_draws
from ui.heads import attribution_section, browser_view, names_section, open_from_distance, server_view
from ui.navigation import heading
from ui.state import setup

ctx = setup()
if ctx is None:
    st.stop()
heading(__file__, ctx.image.name)
if ctx.lens.scope == "window":  # Swin: each head's window around a clicked patch
    windows.heads_view(ctx)
    st.stop()
open_from_distance()  # a head clicked on the distance page: its layer and head, set in this run

# The grid, Compare layers, the figure for a paper and the repair's before / after, in one fragment: a slider moved
# there redraws them only, not the sidebar and its caches.
if browser_draws():
    browser_view(ctx)
else:
    server_view(ctx)
attribution_section(ctx)  # computed when asked for, as on the Attribution page
names_section(ctx)  # what each head writes toward, for models whose readout vitviz.residual reads
