"""Features: a sparse autoencoder's latents on the current image and across the image set."""
import streamlit as st

from ui.features import (about_sae, choose_sae, codes_of, deletion_section, drivers_section, intro, latent_section,
                         patch_section, top_section, train_section, words_section)
from ui.navigation import heading
from ui.state import setup

ctx = setup()
if ctx is None:
    st.stop()
heading(__file__, ctx.image.name)
intro()
trained = train_section(ctx)  # the "Train an SAE here" box; the SAE trained in this session, if any
chosen = choose_sae(ctx, trained)  # that one or one at a typed path, checked against the sidebar's model
if chosen is None:
    st.stop()
about_sae(ctx, chosen.sae)
codes = codes_of(ctx, chosen.sae, chosen.ident, chosen.point)  # the image set's latent codes, computed once
top = top_section(ctx, codes)  # the current image's strongest latents as maps
if top is None:
    st.stop()
firing = patch_section(ctx, codes, top)  # the latents firing at a clicked patch
latent = latent_section(ctx, codes, top, firing)  # one latent over the image set
words_section(ctx, chosen, latent)  # its direction read through the head (and against words, for CLIP)
drivers_section(ctx, chosen)  # on a toggle
deletion_section(ctx, chosen)  # on a toggle
