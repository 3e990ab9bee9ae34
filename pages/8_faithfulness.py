"""Faithfulness: which map to trust, by deleting and inserting patches in the order each map ranks them."""
import streamlit as st

from ui.faithfulness import auc_section, choose, dataset_view, maps_section, model_saw_section, perturbation_run
from ui.navigation import heading
from ui.state import setup, view_applies

ctx = setup()
heading(__file__, ctx.image.name if ctx is not None else None)
view = st.radio("View", ["this image", "a finished run over an image set"], horizontal=True, key="faith_view",
                help="A run over an image set comes from `python -m vitviz faithfulness`: its auc.parquet gives "
                     "intervals over images and paired differences, which one image cannot.")
if view != "this image":
    dataset_view()  # needs no image: the table of a `vitviz faithfulness` run
    st.stop()
if ctx is None:
    st.stop()
view_applies(ctx, "faithfulness")
choice = choose(ctx)  # methods, target, steps and the protocol's settings
if choice is None:
    st.stop()
run = perturbation_run(ctx, choice)  # on the button, then kept for this image and these settings
if run is None:
    st.stop()
auc_section(ctx, choice, run)
model_saw_section(ctx, choice, run.result)
maps_section(ctx, run.result)
