"""Swin Transformer: window attention read exactly, its geometry, window distances, the app and the CLI.

A tiny random Swin (2 stages of 2 blocks, 4x4 windows, 2 and 4 heads) is registered with timm under
its own name and saved as a safetensors checkpoint, so it loads the way a user's does: a timm name
plus a checkpoint file. At 72 px its grids (18x18, 9x9) are not whole windows: padding is exercised.
"""
import copy
import json

import numpy as np
import pytest
import timm
import torch
from timm.models._registry import register_model
from PIL import Image
from timm.models.swin_transformer import _create_swin_transformer

from vitviz import swin
from vitviz.trace import trace_for_analysis as capture
from vitviz.io.images import load_image
from vitviz.sources.preprocess import preprocess
from vitviz.sources.models import ModelSpec, load_model

from conftest import ASSETS

TINY_SWIN = "swin_vitviz_tiny_test"


if not timm.is_model(TINY_SWIN):
    @register_model
    def swin_vitviz_tiny_test(pretrained=False, **kwargs):
        args = dict(patch_size=4, window_size=4, embed_dim=32, depths=(2, 2), num_heads=(2, 4), img_size=64,
                    num_classes=10)
        return _create_swin_transformer(TINY_SWIN, pretrained=pretrained, **dict(args, **kwargs))


@pytest.fixture(scope="module")
def swin_checkpoint(tmp_path_factory):
    from safetensors.torch import save_file

    torch.manual_seed(0)
    model = timm.create_model(TINY_SWIN, pretrained=False)
    with torch.no_grad():  # random init leaves the bias tables near 0: make a wrong forward show
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    path = tmp_path_factory.mktemp("swin") / "swin.safetensors"
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(path))
    return path


@pytest.fixture(scope="module")
def chelsea():
    return load_image(ASSETS / "chelsea.jpg").image


def _timm_softmax(model, x):
    """timm's own window probabilities: its WindowAttention.softmax output, unfused, on a copy."""
    reference = copy.deepcopy(model)
    seen = []
    for stage in reference.layers:
        for blk in stage.blocks:
            blk.attn.fused_attn = False
            blk.attn.softmax.register_forward_hook(lambda m, i, o: seen.append(o))
    with torch.no_grad():
        reference(x)
    return seen


@pytest.mark.parametrize("img_size", [None, 72])
def test_window_capture_equals_timm_forward_and_its_softmax(swin_checkpoint, chelsea, img_size):
    loaded = load_model(ModelSpec(name=TINY_SWIN, checkpoint=str(swin_checkpoint), img_size=img_size))
    assert loaded.attention_scope == "window"
    x = preprocess([chelsea, chelsea.transpose(0)], loaded.data_config).tensor
    out = capture(loaded.model, x)
    fused = copy.deepcopy(loaded.model)
    for stage in fused.layers:
        for blk in stage.blocks:
            blk.attn.fused_attn = True  # SDPA with the bias and mask as attn_mask: an independent path
    with torch.no_grad():
        own, sdpa = loaded.model(x), fused(x)
    assert float((out.logits - own).norm() / own.norm()) < 1e-5
    assert float((out.logits - sdpa).norm() / sdpa.norm()) < 1e-5
    reference = _timm_softmax(loaded.model, x)
    assert len(out.each("attn")) == len(reference) == 4
    for probs, ref, g in zip(out.each("attn"), reference, out.geometry):
        torch.testing.assert_close(probs.reshape(ref.shape), ref, rtol=0, atol=1e-6)
        assert torch.allclose(probs.sum(-1), torch.ones(()), atol=1e-5)
        assert probs.shape == (2, g.num_windows, (2, 4)[g.stage], 16, 16)


def test_dynamic_size_swin_builds_its_masks_per_input_as_timm_does():
    torch.manual_seed(1)
    model = timm.create_model(TINY_SWIN, pretrained=False, dynamic_img_size=True).eval()
    x = torch.randn(1, 3, 80, 96)  # not the 64 px it was built for: masks come from get_attn_mask(x)
    out = capture(model, x)
    with torch.no_grad():
        own = model(x)
    assert float((out.logits - own).norm() / own.norm()) < 1e-5
    for probs, ref in zip(out.each("attn"), _timm_softmax(model, x)):
        torch.testing.assert_close(probs.reshape(ref.shape), ref, rtol=0, atol=1e-6)
    assert [g.grid_size for g in out.geometry] == [(20, 24), (20, 24), (10, 12), (10, 12)]
    assert out.geometry[1].allowed is not None and not out.geometry[1].allowed.all()


def test_threads_sharing_one_swin_model_match_serial_bit_for_bit(swin_checkpoint, chelsea):
    from concurrent.futures import ThreadPoolExecutor

    loaded = load_model(ModelSpec(name=TINY_SWIN, checkpoint=str(swin_checkpoint)))
    inputs = [preprocess([chelsea.rotate(90 * i)], loaded.data_config).tensor for i in range(4)]
    serial = [capture(loaded.model, x).each("attn") for x in inputs]
    with ThreadPoolExecutor(4) as pool:
        threaded = list(pool.map(lambda x: capture(loaded.model, x).each("attn"), inputs * 2))
    for got, want in zip(threaded, serial * 2):
        assert all(torch.equal(a, b) for a, b in zip(got, want))


def test_geometry_strides_shifts_and_padding_follow_the_stages(swin_checkpoint):
    loaded = load_model(ModelSpec(name=TINY_SWIN, checkpoint=str(swin_checkpoint), img_size=72))
    out = capture(loaded.model, torch.zeros(1, 3, 72, 72))
    described = [(g.stage, g.block, g.grid_size, g.window_size, g.shift, g.stride, g.padded_size) for g in out.geometry]
    assert described == [(0, 0, (18, 18), (4, 4), (0, 0), (4, 4), (20, 20)),
                         (0, 1, (18, 18), (4, 4), (2, 2), (4, 4), (20, 20)),
                         (1, 0, (9, 9), (4, 4), (0, 0), (8, 8), (12, 12)),
                         (1, 1, (9, 9), (4, 4), (2, 2), (8, 8), (12, 12))]
    assert loaded.layout.grid_size == (18, 18)
    assert out.layout.prefix_tokens == () and out.layout.patch_size == (4, 4)


def test_every_token_sits_in_exactly_one_window_slot_at_its_rolled_place():
    g = swin.WindowGeometry(0, 0, 1, grid_size=(6, 6), window_size=(3, 3), shift=(1, 1), stride=(4, 4))
    positions = g.token_positions()
    assert positions.shape == (4, 9, 2)
    real = positions[positions[..., 0] >= 0]
    assert sorted(map(tuple, real)) == [(r, c) for r in range(6) for c in range(6)]
    # The roll by -1 puts token (1, 1) first and wraps row 0 / column 0 around to the last window.
    assert tuple(positions[0, 0]) == (1, 1)
    assert tuple(positions[3, 8]) == (0, 0)


def test_masked_cross_region_keys_get_no_weight_in_shifted_windows(swin_checkpoint, chelsea):
    loaded = load_model(ModelSpec(name=TINY_SWIN, checkpoint=str(swin_checkpoint)))
    out = capture(loaded.model, preprocess([chelsea], loaded.data_config).tensor)
    g, probs = out.geometry[1], out.each("attn")[1][0].numpy()  # block 2: shifted 4x4 windows on 16x16
    assert g.shifted and g.allowed is not None and not g.allowed.all()
    hidden = ~g.allowed[:, None]  # (nW, 1, T, T) over heads
    assert np.broadcast_to(hidden, probs.shape).any()
    assert probs[np.broadcast_to(hidden, probs.shape)].max() < 1e-30
    # The bottom-right window wrapped around both edges: its query at true (15, 15) reaches only itself
    # and its 2x2 corner, never the tokens from row/column 0 that share the window.
    maps = swin.window_attention_for_patch(probs, g, 15, 15)
    assert maps.shape == (2, 16, 16)
    scope = swin.query_scope(g, 15, 15)
    assert scope.sum() == 4 and scope[14:, 14:].all()
    np.testing.assert_allclose(maps.sum(axis=(1, 2)), 1, atol=1e-5)
    assert maps[:, ~scope].max() < 1e-30


def test_patch_map_is_its_row_placed_back_on_the_grid(swin_checkpoint, chelsea):
    loaded = load_model(ModelSpec(name=TINY_SWIN, checkpoint=str(swin_checkpoint)))
    out = capture(loaded.model, preprocess([chelsea], loaded.data_config).tensor)
    g, probs = out.geometry[0], out.each("attn")[0][0].numpy()  # regular windows: (5, 6) is in window (1, 1)
    maps = swin.window_attention_for_patch(probs, g, 5, 6)
    w, t = g.slot_of(5, 6)
    assert (w, t) == (1 * 4 + 1, 1 * 4 + 2)
    np.testing.assert_array_equal(maps[:, 4:8, 4:8].reshape(2, 16), probs[w, :, t])
    assert maps[:, :4].max() == 0 and maps[:, 8:].max() == 0


def test_uniform_attention_in_a_window_has_the_hand_computed_distance():
    # One 2x2 window, 4 px stride: each query is 0, 4, 4 and 4*sqrt(2) px from the four keys.
    g = swin.WindowGeometry(0, 0, 0, grid_size=(2, 2), window_size=(2, 2), shift=(0, 0), stride=(4, 4))
    uniform = np.full((1, 1, 3, 4, 4), 0.25)
    expected = (0 + 4 + 4 + 4 * np.sqrt(2)) / 4
    np.testing.assert_allclose(swin.mean_window_attention_distance(uniform, g), expected)
    assert swin.uniform_window_distance(g) == pytest.approx(expected)
    # A 4x4 grid of 2x2 windows at 8 px: every window gives the same.
    g4 = swin.WindowGeometry(0, 1, 0, grid_size=(4, 4), window_size=(2, 2), shift=(0, 0), stride=(8, 8))
    assert swin.uniform_window_distance(g4) == pytest.approx(2 * expected)


def test_self_only_attention_has_distance_zero_even_in_shifted_windows():
    g = swin.WindowGeometry(0, 0, 1, grid_size=(4, 4), window_size=(2, 2), shift=(1, 1), stride=(4, 4))
    own = np.broadcast_to(np.eye(4), (1, 4, 2, 4, 4))
    np.testing.assert_array_equal(swin.mean_window_attention_distance(own, g), 0)


def test_wrapped_tokens_are_measured_where_they_are_on_the_image():
    # Shift 1 on a 4x4 grid: the last window holds the four corners (3,3), (3,0), (0,3), (0,0).
    g = swin.WindowGeometry(0, 0, 1, grid_size=(4, 4), window_size=(2, 2), shift=(1, 1), stride=(4, 4))
    assert sorted(map(tuple, g.token_positions()[3])) == [(0, 0), (0, 3), (3, 0), (3, 3)]
    a = np.zeros((1, 4, 1, 4, 4))
    a[0, :, 0, :, 3] = 1  # every query looks at the window's last slot, true (0, 0) in the corner window
    a[0, :3, 0] = np.eye(4)  # the other windows: self only
    per_query = np.linalg.norm((g.token_positions()[3] - g.token_positions()[3, 3]) * 4.0, axis=-1)
    assert per_query.max() == pytest.approx(3 * np.sqrt(2) * 4)  # not sqrt(2) * 4 as in the rolled frame
    np.testing.assert_allclose(swin.mean_window_attention_distance(a, g), per_query.sum() / 16)


def test_padding_is_dropped_as_query_and_key():
    # A 3x3 grid in one 4x4 window: 7 padding slots. Uniform over all 16 slots equals uniform over the 9 real.
    g = swin.WindowGeometry(0, 0, 0, grid_size=(3, 3), window_size=(4, 4), shift=(0, 0), stride=(1, 1))
    every = swin.mean_window_attention_distance(np.full((1, 1, 1, 16, 16), 1 / 16), g)
    rows, cols = np.meshgrid(np.arange(3), np.arange(3), indexing="ij")
    centres = np.stack([rows.ravel(), cols.ravel()], 1)
    brute = np.linalg.norm(centres[:, None] - centres[None], axis=-1).mean()
    np.testing.assert_allclose(every, brute)
    assert swin.uniform_window_distance(g) == pytest.approx(brute)


def test_window_maps_take_their_colour_limits_from_the_window_only():
    from vitviz.figures.overlay import render_maps

    # Swin-T's stage 1: a 7x7 window on the 56x56 grid, 1.6% of the cells.
    maps = np.zeros((1, 56, 56))
    maps[0, 7:14, 21:28] = np.arange(1, 50).reshape(7, 7)
    window = maps[0] > 0
    image = Image.new("RGB", (224, 224), "grey")
    inside = render_maps(image, maps, region=window)
    assert inside.scales[0].hi == pytest.approx(np.percentile(np.arange(1, 50), 99))
    assert len(inside.clipped[0]) == 1 and inside.excluded.size == 0  # the outside is not listed as excluded
    # Over the whole grid the 99th percentile falls among the window's cells: most of the window is clipped (32 of 49).
    assert len(render_maps(image, maps).clipped[0]) > 24


def test_a_swin_with_another_block_gets_the_not_supported_sentence(swin_checkpoint):
    from vitviz.errors import ModelError
    from vitviz.sources.models import check_supported

    model = timm.create_model(TINY_SWIN, pretrained=False)
    model.layers[1].blocks[0] = torch.nn.Identity()
    with pytest.raises(ModelError, match=r"not supported yet: stage 2 block 1 is a Identity without one attention module"):
        check_supported(model, TINY_SWIN)
    with pytest.raises(ModelError, match=r"'resnet18' is not supported yet: .*Swin Transformers"):
        check_supported(timm.create_model("resnet18", pretrained=False), "resnet18")


@pytest.mark.parametrize("img_size", [64, 72])
def test_memory_budget_counts_the_window_attention_swin_captures(img_size):
    from vitviz.sources.budget import architecture, check_resolution
    from vitviz.errors import ModelError

    arch = architecture(TINY_SWIN)
    model = timm.create_model(TINY_SWIN, pretrained=False, img_size=img_size).eval()
    out = capture(model, torch.zeros(1, 3, img_size, img_size))
    assert arch.attention_bytes(img_size) == sum(a.numel() * 4 for a in out.each("attn"))  # padding included
    check_resolution(TINY_SWIN, img_size, arch.attention_bytes(img_size))
    with pytest.raises(ModelError, match=rf"Input resolution {img_size} px: .*\(4 blocks of window attention in 2 "
                                         r"stages.*the largest size that fits is \d+ px"):
        check_resolution(TINY_SWIN, img_size, arch.attention_bytes(img_size) - 1)


def test_model_card_and_layout_describe_stages_without_prefix_tokens(swin_checkpoint):
    loaded = load_model(ModelSpec(name=TINY_SWIN, checkpoint=str(swin_checkpoint)))
    card = loaded.card()
    assert card["layers"] == 4 and card["heads"] == "2, 4 (per stage)" and card["stage_depths"] == [2, 2]
    assert card["token_layout"]["prefix_tokens"] == () and card["token_layout"]["grid_size"] == (16, 16)
    assert loaded.native_pos_embed is None


def test_cli_writes_window_distances_per_block(swin_checkpoint, tmp_path):
    from vitviz.cli import main

    argv = ["analyze", str(ASSETS / "coffee.jpg"), str(ASSETS / "chelsea.jpg"), "--out", str(tmp_path),
            "--model", TINY_SWIN, "--checkpoint", str(swin_checkpoint)]
    assert main(argv) == 0
    data = np.load(tmp_path / "analysis.npz")
    assert data["window_distance"].shape == (2, 4, 4)
    assert np.isnan(data["window_distance"][:, :2, 2:]).all()  # stage 1 has 2 heads, stage 2 four
    loaded = load_model(ModelSpec(name=TINY_SWIN, checkpoint=str(swin_checkpoint)))
    x = preprocess([load_image(ASSETS / "coffee.jpg").image], loaded.data_config).tensor
    out = capture(loaded.model, x)
    np.testing.assert_allclose(data["window_distance"][0, 3], swin.mean_window_attention_distance(
        out.each("attn")[3], out.geometry[3])[0], rtol=1e-6)
    np.testing.assert_allclose(data["logits"][0], out.logits[0].numpy(), rtol=1e-5)
    settings = json.loads((tmp_path / "settings.json").read_text())
    assert settings["model"]["family"] == "SwinTransformer"
    assert [g["stride_px"] for g in settings["window_geometry"]] == [[4, 4], [4, 4], [8, 8], [8, 8]]


def test_cli_refuses_global_attention_options_for_swin_with_a_sentence(swin_checkpoint, tmp_path, capsys):
    from vitviz.cli import main

    argv = ["analyze", str(ASSETS / "coffee.jpg"), "--out", str(tmp_path), "--model", TINY_SWIN,
            "--checkpoint", str(swin_checkpoint), "--flow"]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "--flow" in err and "Traceback" not in err
    assert not (tmp_path / "analysis.npz").exists()


def test_cli_stats_says_in_a_sentence_that_it_needs_global_attention(swin_checkpoint, tmp_path, capsys):
    from vitviz.cli import main

    argv = ["stats", str(ASSETS / "coffee.jpg"), "--out", str(tmp_path / "stats"), "--model", TINY_SWIN,
            "--checkpoint", str(swin_checkpoint), "--workers", "0"]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "attends within shifted windows" in err and "Traceback" not in err


@pytest.mark.slow
def test_app_pages_with_a_swin_checkpoint_show_windows_or_a_sentence(swin_checkpoint):
    from streamlit.testing.v1 import AppTest

    from test_app import APP, _decode, _heatmaps, _traces

    at = AppTest.from_file(APP, default_timeout=180).run()
    at.sidebar.selectbox(key="model_choice").set_value("timm model by name").run()
    at.sidebar.text_input(key="timm_query").input(TINY_SWIN).run()
    at.sidebar.text_input(key="ckpt_path").input(str(swin_checkpoint)).run()  # first: a pick without weights is taken back
    at.sidebar.selectbox(key="timm_name").set_value(TINY_SWIN).run()
    assert not at.exception and not at.error, [e.value for e in at.error]
    expected = {"pages/1_overview.py": "not supported yet for window attention",
                "pages/3_rollout.py": "Rollout and attention flow do not apply",
                "pages/6_position_embeddings.py": "no learned absolute position embedding (it encodes position with a "
                                                   "relative position bias per window",
                "pages/7_anatomy.py": "not supported yet for window attention",
                "pages/8_faithfulness.py": "not supported yet for window attention",
                "pages/9_compare.py": "the current model attends within windows (Swin)"}
    for page, sentence in expected.items():
        at.switch_page(page).run()
        assert not at.exception, (page, [e.message for e in at.exception])
        assert any(sentence in i.value for i in at.info), (page, [i.value for i in at.info])
    at.switch_page("pages/5_filters.py").run()
    assert not at.exception and not at.error
    at.switch_page("pages/2_heads.py").run()
    assert not at.exception, [e.message for e in at.exception]
    # The last block: shifted 4x4 windows (shift 2) on the 8x8 stage-2 grid, one map per head. The
    # default query is the centre patch (row 5, col 5), whose rolled window is rows and columns 3-6.
    maps = _heatmaps(at, "window_heads_grid")
    assert len(maps) == 4 and all(m.shape == (8, 8) for m in maps)
    window = np.zeros((8, 8), bool)
    window[2:6, 2:6] = True
    for m in maps:
        assert abs(m.sum() - 1) < 1e-5 and m[window].min() > 0 and m[~window].max() == 0
    # A query in the window that wrapped around the corner reaches only its own 2x2 region.
    at.session_state["window_point"] = (60.0, 60.0)
    at.run()
    corner = np.zeros((8, 8), bool)
    corner[6:, 6:] = True
    for m in _heatmaps(at, "window_heads_grid"):
        assert abs(m[corner].sum() - 1) < 1e-5 and m[~corner].max() < 1e-30
    # A typed row and column pick the same way; the enlarged view keeps the query's reach and one token around it.
    at.number_input(key="window_row_(8, 8)").set_value(1).run()
    at.radio(key="window_view").set_value("the query's window, enlarged").run()
    assert not at.exception, [e.message for e in at.exception]
    assert at.session_state["window_point"] == (7 * 8 + 4.0, 4.0)  # (x, y) of row 1, col 8's centre
    enlarged = _heatmaps(at, "window_heads_grid")
    assert all(m.shape == (3, 3) for m in enlarged)  # rows 1-2 (wrapped off row 8) + one below, cols 7-8 + one left
    np.testing.assert_allclose([m.sum() for m in enlarged], 1, atol=1e-5)
    at.switch_page("pages/4_distance.py").run()
    assert not at.exception, [e.message for e in at.exception]
    dots = [t for t in _traces(at, "window_distance_plot") if t.get("name", "").startswith("head ")]
    assert [len(_decode(t["x"])) for t in dots] == [4, 4, 2, 2]  # heads 3 and 4 exist only in stage 2
    at.sidebar.multiselect(key="samples").set_value(["astronaut.jpg", "chelsea.jpg"]).run()
    at.radio(key="distance_scope").set_value(at.radio(key="distance_scope").options[1]).run()
    assert not at.exception, [e.message for e in at.exception]
    dots = [t for t in _traces(at, "window_distance_plot") if t.get("name", "").startswith("head ")]
    assert all(_decode(t["error_y"]["array"]).max() > 0 for t in dots)  # the spread over the two images


@pytest.mark.slow
def test_attribution_page_with_a_swin_checkpoint_offers_every_method(swin_checkpoint):
    """The Attribution page with a timm Swin offers every method and refuses none; its default maps (AttnLRP, LeGrad,
    Grad-CAM) are the library's on the same input, per stage-1 patch (16x16 at 64 px)."""
    import base64

    from streamlit.testing.v1 import AppTest

    from test_app import APP
    from ui.state import SAMPLES
    import attribution_names as A

    at = AppTest.from_file(APP, default_timeout=180).run()
    at.sidebar.selectbox(key="model_choice").set_value("timm model by name").run()
    at.sidebar.text_input(key="timm_query").input(TINY_SWIN).run()
    at.sidebar.text_input(key="ckpt_path").input(str(swin_checkpoint)).run()  # first: a pick without weights is taken back
    at.sidebar.selectbox(key="timm_name").set_value(TINY_SWIN).run()
    at.switch_page("pages/10_attribution.py").run()
    assert not at.exception, [e.message for e in at.exception]
    assert not at.error and not at.info, ([e.value for e in at.error], [i.value for i in at.info])
    assert at.multiselect(key="attr_methods").options == ["AttnLRP", "CP-LRP", "LeGrad", "Grad-CAM", "Gradient × Input"]
    captions = " ".join(c.value for c in at.caption)
    assert "does not apply" not in captions and "not offered" not in captions
    charts = {c.proto.id: json.loads(c.proto.spec) for c in at.get("plotly_chart")}
    maps = next(spec for key, spec in charts.items() if "attr_maps" in key)
    heatmaps = [t for t in maps["data"] if t["type"] == "heatmap"]
    assert len(heatmaps) == 3  # the defaults: AttnLRP, LeGrad, Grad-CAM

    def z(trace):
        v = trace["z"]
        if isinstance(v, dict):
            shape = [int(n) for n in str(v["shape"]).split(",")]
            v = np.frombuffer(base64.b64decode(v["bdata"]), dtype=v["dtype"]).reshape(shape)
        return np.asarray(v, dtype=float)[::-1]

    loaded = load_model(ModelSpec(name=TINY_SWIN, checkpoint=str(swin_checkpoint)))
    x = preprocess([load_image(ASSETS / SAMPLES[0]).image], loaded.data_config).tensor
    refs = [A.relevance(loaded.model, x, "attnlrp").patches[0], A.legrad(loaded.model, x).patches[0],
            A.gradcam(loaded.model, x).patches[0]]
    for trace, ref in zip(heatmaps, refs):
        assert ref.shape == (16, 16)
        np.testing.assert_allclose(z(trace), ref, atol=1e-5 * np.abs(ref).max())