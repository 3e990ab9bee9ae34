"""vitviz, the Streamlit app: `streamlit run app.py` (or scripts/app.sh, which sets everything up)."""
from pathlib import Path

import streamlit as st
import torch

from vitviz.capture import capture
from vitviz.errors import VitvizError
from vitviz.figures import attention_overlay
from vitviz.images import load_image, load_images, preprocess
from vitviz.maps import query_attention_map
from vitviz.models import ModelSpec, load_model

ASSETS = Path(__file__).parent / "assets"
SAMPLES = sorted(p.name for p in ASSETS.glob("*.jpg"))

st.set_page_config(page_title="vitviz", layout="wide")


@st.cache_resource(show_spinner="Loading the model ...")
def cached_model(spec: ModelSpec):
    return load_model(spec)


@st.cache_data(max_entries=64, show_spinner="Running the model ...")
def cached_attention(spec: ModelSpec, sha256: str, _image):
    """Attention (L, H, N, N) and the model-input image for one image; keyed by its hash."""
    loaded = cached_model(spec)
    batch = preprocess([_image], loaded.data_config)
    return capture(loaded.model, batch.tensor).attention[0].numpy(), batch.images[0]


st.sidebar.title("vitviz")
spec = ModelSpec(device=st.sidebar.selectbox("Device", ["auto", "cpu"] + (["cuda"] if torch.cuda.is_available() else [])))
try:
    loaded = cached_model(spec)
except VitvizError as exc:
    st.error(str(exc))
    st.stop()
st.sidebar.caption(f"{loaded.label} · {loaded.device}")

uploads = st.sidebar.file_uploader("Images", type=["jpg", "jpeg", "png", "webp", "bmp", "tif", "tiff", "gif"],
                                   accept_multiple_files=True)
images, problems = load_images([(u.name, u.getvalue()) for u in uploads or []])
for problem in problems:
    st.error(str(problem))
if not images:
    sample = st.sidebar.selectbox("Sample image", SAMPLES)
    images = [load_image(ASSETS / sample)]
current = images[[im.name for im in images].index(st.sidebar.selectbox("Current image", [im.name for im in images]))]
for note in current.notes:
    st.info(f"{current.name}: {note}")

attention, model_input = cached_attention(spec, current.sha256, current.image)
layers, heads = attention.shape[:2]
col_layer, col_head = st.columns(2)
layer = col_layer.slider("Layer", 1, layers, layers) - 1
head = col_head.slider("Head", 1, heads, 1) - 1
query = "cls" if loaded.layout.has_class_token else "mean"
grid = query_attention_map(attention, loaded.layout, layer, head, query)
st.plotly_chart(attention_overlay(model_input, grid, loaded.layout,
                                  title=f"{current.name}: layer {layer + 1}, head {head + 1}, query {query}"))
