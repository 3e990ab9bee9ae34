"""Rollout: attention rollout with its settings, gradient rollout for models with a head, raw attention."""
import streamlit as st

from ui.navigation import heading
from ui.rollout import (flow_section, gradient_section, readout_controls, repair_section, rollout_controls,
                        rollout_maps, rollout_section, shown_controls)
from ui.state import setup, view_applies

ctx = setup()
if ctx is None:
    st.stop()
heading(__file__, ctx.image.name)
view_applies(ctx, "rollout")
choice = rollout_controls(ctx)  # fusion, discard, layers and what is kept out
readout = readout_controls(ctx, choice)  # the readout's row or a clicked patch's (the browser's view: and its depth)
if readout is None:
    st.stop()  # a patch is to be read out and none is clicked yet
maps = rollout_maps(ctx, choice, readout.query)
shown = shown_controls(choice, readout)  # depth, display and the map beside rollout
rollout_section(ctx, choice, readout.query, maps, shown)
repair_section(ctx, choice, readout.query, shown.display)
gradient_section(ctx, shown.display)
flow_section(ctx, choice, readout.query, maps, shown)
