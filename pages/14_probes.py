"""Probes: what each layer knows — a linear probe per layer on the session's images sorted into named groups."""
import streamlit as st

from ui.navigation import heading
from ui.probes import accuracy_section, head_section, intro, layer_choice, probe_backbone, sort_section, train_section
from ui.state import setup

ctx = setup()
if ctx is None:
    st.stop()
heading(__file__)
intro()
backbone = probe_backbone(ctx)  # probes are trained on the backbone, never on a probe head
if backbone is None:
    st.stop()
choice = sort_section(ctx)  # the groups, the pooling and a group box under each image
result = train_section(backbone, choice)  # on the button, then kept for these images, groups and pooling
if result is None:
    st.stop()
result = layer_choice(result)
accuracy_section(backbone, choice.pooling, result)
head_section(ctx, result)  # the probe's files, and the button that makes it the model's head
