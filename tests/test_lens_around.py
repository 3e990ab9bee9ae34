"""A model given bare runs through the same forward as an opened one (``Lens.around(model).trace``), and the
trace's options the library's functions use (``grad=None``, ``fast=``, ``layout=``) do what they say."""
import torch

from conftest import timm_unfused_attention, tiny_model
from vitviz.lens import Lens


def _case():
    model = tiny_model("vit_augreg")
    torch.manual_seed(1)
    return model, torch.randn(2, 3, 64, 64)


def test_a_bare_models_trace_holds_timms_own_attention_and_logits():
    model, x = _case()
    lens = Lens.around(model)
    trace = lens.trace(x, keep=("attn", "logits"))
    # float32 on a 2-block, 17-token model: the fused and unfused softmax agree to a few ulps of probabilities <= 1
    assert torch.allclose(trace.stack("attn"), timm_unfused_attention(model, x), rtol=0, atol=1e-6)
    with torch.no_grad():
        expected = model(x)
    assert torch.allclose(trace["logits"], expected, rtol=0, atol=1e-5 * expected.abs().max())
    assert lens.num_layers == 2 and lens.layout.num_tokens == 17 and trace.lens is lens


def test_grad_none_runs_in_the_callers_autograd_context():
    model, x = _case()
    lens = Lens.around(model)
    x = x.requires_grad_(True)
    with torch.enable_grad():
        attached = lens.trace(x, keep="logits", grad=None)["logits"]
    assert attached.requires_grad  # a gradient method differentiates it
    with torch.no_grad():
        detached = lens.trace(x, keep="logits", grad=None)["logits"]
    assert not detached.requires_grad
    assert not lens.trace(x, keep="logits")["logits"].requires_grad  # the default: inference mode


def test_the_fused_scoring_forward_gives_the_same_logits():
    model, x = _case()
    lens = Lens.around(model)
    plain, fast = lens.trace(x, keep="logits")["logits"], lens.trace(x, keep="logits", fast=True)["logits"]
    assert torch.allclose(fast, plain, rtol=0, atol=1e-5 * plain.abs().max())


def test_layout_given_is_the_traces_layout():
    from dataclasses import replace

    model, x = _case()
    lens = Lens.around(model)
    other = replace(lens.layout, prefix_tokens=lens.layout.prefix_tokens + ("reg",))
    assert lens.trace(x, keep="logits", layout=other).layout == other
    assert lens.trace(x, keep="logits").layout == lens.layout
