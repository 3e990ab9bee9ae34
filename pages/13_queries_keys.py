"""Queries & keys: one head's queries and keys in one picture (AttentionViz), every head of a layer as small
multiples, and heads switched off (ablation) or swapped between two images (patching)."""
import streamlit as st

from ui.navigation import heading
from ui.queries_keys import (ablation_section, action, choose, grid_section, heading_text, intro, patching_section,
                             qk_inputs, scatter_section, windows_note)
from ui.state import setup

ctx = setup()
if ctx is None:
    st.stop()
heading(__file__, heading_text(ctx))  # "8 images": the first MAX_IMAGES of the sidebar's set
if windows_note(ctx):  # Swin: queries and keys meet only inside a window
    st.stop()
inp = qk_inputs(ctx)  # the image set as the model takes it, and its cache identity
intro(ctx)
choice = choose(ctx.lens)  # layer, head, projection, colour
if not scatter_section(inp, choice):  # one head's queries and keys; a clicked token's attention beside them
    st.stop()
grid_section(inp, choice)  # every head of the layer, on a press
if action() == "Ablate":
    ablation_section(inp, choice)  # heads switched off, one at a time
else:
    patching_section(inp)  # heads swapped in from the current image
