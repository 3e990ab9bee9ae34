"""The session-state keys the shared sidebar keeps, named once.

Two kinds: a widget's key (its value is what the widget shows; Streamlit forgets it on a page switch) and the
sidebar's own records. A widget's value survives page switches under :func:`kept` (see :mod:`ui.widgets`).
"""
from __future__ import annotations

# The sidebar's widgets
MODEL_CHOICE = "model_choice"  # bundled / timm by name / Hugging Face
TIMM_QUERY = "timm_query"
TIMM_NAME = "timm_name"
HF_NAME = "hf_name"
IMG_SIZE = "img_size"
DEVICE = "device"
DTYPE = "dtype"
CKPT_PATH = "ckpt_path"
CLASS_NAMES = "class_names"
HEAD_UPLOAD = "head_upload"
USE_TRAINED_HEAD = "use_trained_head"
SAMPLE_PICKS = "samples"  # the sample photos chosen
FRAMING = "framing"
CURRENT = "current"  # the current image's name
# The boxes that say which model is asked for: a failed load's sentence stays until one of them changes.
MODEL_BOXES = (MODEL_CHOICE, TIMM_QUERY, TIMM_NAME, HF_NAME, IMG_SIZE, DEVICE, DTYPE, CKPT_PATH)

# Widget memory (ui.widgets)
RESEED = "reseed"  # widget keys whose browser value is dropped on the next run

# Uploads (ui.uploads)
IMAGE_STORE = "image_store"  # name -> bytes of every uploaded image
UPLOADER_GENERATION = "uploader_generation"  # bumped to empty the uploader (a new key is a new, empty widget)
UPLOADER_CHANGED = "uploader_changed"  # set by the uploader's on_change: the user added or removed a file
UPLOADER_HELD = "uploader_held"  # file_id -> name the uploader held at the last run
UPLOADER_PAGE = "uploader_page"  # the page whose uploader that was
UPLOADS_SEEN = "uploads_seen"  # file_ids a run has stored or refused
UPLOADS_REFUSED = "uploads_refused"  # file_id -> the sentence refusing it
UPLOAD_WATCH_PAGE = "upload_watch_page"  # the page the upload watch belongs to (ui.uploads.watch_uploads)
UPLOAD_WATCH_LEFT = "upload_watch_left"  # looks the upload watch has left on that page (ui.uploads.UPLOAD_WATCH_LOOKS)
SAMPLES_BY_DEFAULT = "samples_by_default"  # "shown"/"hidden" while the sample set is the app's choice, not the user's

# The model (ui.model_box, ui.recovery)
GOOD_SPEC = "good_spec"  # the ModelSpec that loaded last
FAILED_SPECS = "failed_specs"  # ModelSpec -> the sentence it failed with (not tried again this session)
REVERTED_FROM = "reverted_from"  # the spec whose failure put the sidebar back (once per failure)
LOAD_FAILURE = "load_failure"  # (sentence, failed spec, the spec gone back to, the model boxes then)
CKPT_GENERATION = "ckpt_generation"  # bumped to empty the checkpoint uploader
CKPT_DIGESTS = "ckpt_digests"  # uploaded checkpoint file_id -> its SHA-256 prefix
CKPT_UPLOADS = "ckpt_uploads"  # the path a checkpoint upload is read from -> the upload
PROBE_HEAD = "probe_head"  # the probe.safetensors the Probes page trained, when chosen as the head

# Shared by the pages
PATCH = "patch"  # the clicked patch: a raster index (0-based) of the grid it was picked on
PERSIST_RESTORED = "persist_restored"  # a link's uploads were brought back (once per session)
PERSIST_MODEL_SEEDED = "persist_model_seeded"  # a link's model seeded the model boxes (once per session)
OPENED_FROM_DISTANCE = "opened_from_distance"  # (layer, head), 1-based: a dot clicked on the distance plot (ui.heads)
HEADS_LAYER = "heads_layer"  # the heads page's Layer slider (1-based)
COMPARE_HEAD = "compare_head"  # the heads page's Compare layers head (1-based)
# The position-embedding page's selected position (ui.posembed): the grid's shape and the Row / Column sliders
POS_SHAPE, POS_ROW, POS_COL = "pos_shape", "pos_row", "pos_col"

RAN = "_vitviz_ran"  # this session has run a page (ui.state's legacy-navigation check)


KEPT = "kept_"  # the prefix of a widget's kept value


def kept(key: str) -> str:
    """The key under which widget ``key``'s value outlives page switches."""
    return KEPT + key
