"""The pipeline's per-image results read one Trace (vitviz.analyses.per_image.ImageAnalyses): a batch's forward sliced to one
image equals the analyses computed from the front door's own trace of that image, head scores are computed only when
read, and the app's byte budget weighs a per-image result by the memory it holds (its attention stack once)."""
import numpy as np
import pytest
import timm
import torch

import vitviz
from conftest import ASSETS
from vitviz.analyses.distance import mean_attention_distance
from vitviz.analyses.maps import cls_focus, head_entropy
from vitviz.analyses.tokens import artifact_tokens, attention_sinks
from vitviz.io.images import load_image
from vitviz.analyses.per_image import analyse_images as forward

NAME = "deit_tiny_distilled_patch16_224"


@pytest.fixture(scope="module")
def lens(tmp_path_factory):
    from safetensors.torch import save_file

    torch.manual_seed(0)
    model = timm.create_model(NAME, pretrained=False, img_size=64).eval()
    with torch.no_grad():  # random init leaves attention near uniform: randomise so a wrong slice shows
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.1)
    path = tmp_path_factory.mktemp("deit") / "deit.safetensors"
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(path))
    return vitviz.open(NAME, checkpoint=str(path), img_size=64)


@pytest.fixture(scope="module")
def images():
    return [load_image(ASSETS / name).image for name in ("rocket.jpg", "coffee.jpg", "chelsea.jpg")]


def test_one_image_of_a_batch_is_the_front_doors_trace_of_it_analysed(lens, images):
    fwd = forward(lens.loaded, images)
    reference = lens.trace(lens.preprocess(images), keep=("attn", "resid_post", "final_norm", "logits"))
    layout = reference.layout
    for i in range(3):
        one = fwd.image(i)
        attention = reference.stack("attn")[i].numpy()
        np.testing.assert_array_equal(one.attention, attention)
        assert one.attention.shape == (12, 3, 18, 18) and not one.trace.batched
        norms = reference.stack("resid_post")[i].norm(dim=-1).numpy()
        np.testing.assert_array_equal(one.token_norms, norms)
        np.testing.assert_array_equal(one.features, reference["final_norm"][i].numpy())
        np.testing.assert_array_equal(one.logits, reference.logits[i].numpy())
        np.testing.assert_array_equal(one.artifacts, artifact_tokens(norms[-1], layout))
        np.testing.assert_array_equal(one.distance, mean_attention_distance(attention[None], layout)[0])
        np.testing.assert_array_equal(one.sinks.received, attention_sinks(attention, layout).received)
        assert one.model_input is fwd.batch.images[i] and one.layout == layout


def test_head_scores_are_computed_when_read_not_for_every_forward(lens, images, monkeypatch):
    import vitviz.analyses.maps as maps

    entropies = []
    entropy = maps._entropy
    monkeypatch.setattr(maps, "_entropy", lambda rows: entropies.append(rows.shape) or entropy(rows))
    one = forward(lens.loaded, images[:2]).image(1)
    assert entropies == []  # no log of any attention weight paid for yet (analyze never reads the scores)
    scores = one.head_scores
    assert entropies  # now they are computed
    np.testing.assert_array_equal(scores["entropy"], head_entropy(one.attention, one.layout))
    np.testing.assert_array_equal(scores["cls_focus"], cls_focus(one.attention, one.layout))
    assert scores["distance"] is one.distance and one.head_scores is scores  # kept once read


def test_the_byte_budget_weighs_a_per_image_result_by_what_it_holds(lens, images):
    from ui.memo import nbytes

    one = forward(lens.loaded, images[:1]).image(0)
    attention, norms, features, logits = 12 * 3 * 18 * 18 * 4, 12 * 18 * 4, 18 * 192 * 4, 1000 * 4
    inputs = nbytes(one.trace.inputs)  # the normalised tensor and the model-input image
    assert inputs >= 3 * 64 * 64 * 4 + 64 * 64 * 3
    # The attention stack and its per-layer slices are one block of memory: counted once, not twice.
    assert nbytes(one.trace) == attention + norms + features + logits + inputs
