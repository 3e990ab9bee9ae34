"""Probes · painted concepts: paint patches as concept (and not concept) on the session's images; a patch probe per
layer says from which layer on the concept is readable, and its probability map says where else it fires."""
import streamlit as st

from ui.concepts_page import (accuracy_section, canvas, concept_lens, files_section, fit_on_press, intro, layer_choice,
                              maps_section, paint_section)
from ui.navigation import heading
from ui.state import setup

ctx = setup()
if ctx is None:
    st.stop()
heading(__file__)
intro()
lens = concept_lens(ctx)  # concepts are probed on the backbone, never through a probe head
if lens is None:
    st.stop()
c = canvas(ctx, lens)  # the sidebar's images at the model's input: painted and drawn on
painted, key, run = paint_section(ctx, c)  # the picture to paint on, what is painted, the Fit button
concept = fit_on_press(ctx, lens, painted, key, run)  # kept for exactly these paintings
if concept is None:
    st.stop()
layer = layer_choice(concept)
accuracy_section(lens, concept, layer)
maps_section(ctx, c, concept, painted, layer)
files_section(concept)
