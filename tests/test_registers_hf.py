"""The test-time register through the Hugging Face adapters (vitviz/adapters/hf_*.py): the edit written through
``edit=`` equals the same intervention done by hand on the library's own modules, run by the library's own forward
(forward hooks on its embeddings and MLP output projections); the families that cannot take the token say why."""
import copy

import numpy as np
import pytest
import torch

transformers = pytest.importorskip("transformers")

from vitviz.analyses import registers as R  # noqa: E402
from vitviz.adapters import adapter_for, run  # noqa: E402
from vitviz.sources.preprocess import preprocess  # noqa: E402
from vitviz.sources.models import ModelSpec, load_model  # noqa: E402

from test_hf_hybrid import HF_FAMILIES, chelsea, hf_folders  # noqa: E402,F401  (shared fixtures)

TAKE = ("vit", "deit_distilled", "dinov2", "dinov2_registers", "clip", "dinov3")
REFUSE = {"siglip": "pooling head", "beit": "relative position bias"}
NEURONS = ((0, 5), (1, 17), (1, 40))  # (layer 0-based, hidden unit) of the tiny models (3 layers, 128 units)


def _library(family: str, folder: str):
    return getattr(transformers, HF_FAMILIES[family][1]).from_pretrained(folder, attn_implementation="eager").eval()


def _by_hand(family: str, model, x: torch.Tensor, register: R.TestTimeRegister, prefix: int):
    """The library's forward on a copy, with the register put in by hooks on its own modules: the token inserted
    after the ``prefix`` tokens where the layers start (after CLIP's pre_layrnorm), and each chosen neuron's
    activation (the input of the MLP's output projection) moved onto it."""
    model = copy.deepcopy(model)
    base = model.base_model if hasattr(model, "base_model") and family != "dinov3" else model
    vision = getattr(base, "vision_model", base)
    start = vision.pre_layrnorm if family == "clip" else vision.embeddings
    layers = {"vit": lambda: base.layers, "deit_distilled": lambda: base.layers,
              "dinov2": lambda: base.encoder.layer, "dinov2_registers": lambda: base.encoder.layer,
              "clip": lambda: vision.encoder.layers, "dinov3": lambda: model.model.layer}[family]()

    def insert(module, args, out):
        extra = (out[:, prefix:].mean(1, keepdim=True) if register.init == "mean"
                 else out.new_zeros(out.shape[0], 1, out.shape[2]))
        return torch.cat([out[:, :prefix], extra, out[:, prefix:]], dim=1)

    start.register_forward_hook(insert)
    for layer in sorted({n[0] for n in register.neurons}):
        units = [i for l, i in register.neurons if l == layer]
        mod = layers[layer]
        projection = mod.output.dense if hasattr(mod, "output") else getattr(mod.mlp, "fc2", None) or mod.mlp.down_proj

        def move(module, args, units=units):
            h = args[0].clone()
            h[:, prefix, units] = args[0][:, prefix + 1:, units].max(dim=1).values
            h[:, prefix + 1:, units] = 0
            return (h,)
        projection.register_forward_pre_hook(move)
    with torch.no_grad():
        out = model(pixel_values=x)
    return out


@pytest.mark.parametrize("init", ["zero", "mean"])
@pytest.mark.parametrize("family", TAKE)
def test_register_through_edit_equals_the_same_done_by_hand_on_the_library_modules(family, init, hf_folders, chelsea):  # noqa: F811
    """Tolerance 1e-5 relative: float32 through 3 layers in two orders of the same arithmetic (eager vs the
    spelled-out forward differ by ~1e-7 relative per op; the adapters' own parity tests hold 1e-5)."""
    loaded = load_model(ModelSpec(name=hf_folders[family]))
    assert R.why_no_register(loaded.model) is None
    layout = loaded.layout
    x = preprocess([chelsea, chelsea.transpose(0)], loaded.data_config).tensor
    library = _library(family, hf_folders[family])
    for neurons in (NEURONS, ()):
        register = R.TestTimeRegister(neurons, init)
        with torch.no_grad():
            ours = run(loaded.model, x, keep=("final_norm", "pooled", "logits"), edit=register.edit(layout))
        ref = _by_hand(family, library, x, register, layout.num_prefix_tokens)
        last = getattr(ref, "last_hidden_state", None)
        if last is not None:
            assert last.shape[1] == layout.num_tokens + 1
            assert float((ours["final_norm"] - last).abs().max() / last.abs().max()) <= 1e-5
        if getattr(ref, "logits", None) is not None:
            assert float((ours["logits"] - ref.logits).abs().max() / ref.logits.abs().max()) <= 1e-5
        if getattr(ref, "pooler_output", None) is not None:
            assert float((ours["pooled"] - ref.pooler_output).abs().max() / ref.pooler_output.abs().max()) <= 1e-5


@pytest.mark.parametrize("family", TAKE)
def test_an_empty_zero_register_moves_the_output_only_through_the_extra_key(family, hf_folders, chelsea):  # noqa: F811
    """No neurons, a zero token: nothing is written into the token by hand, yet from layer 1 on it is a key and
    value every token attends to (its key is k(LN(0)) = k(LN's bias), not 0), so the output moves a little. Masking
    that one key out of every layer (rows renormalised) brings back the plain output exactly (up to rounding):
    the token moved it only as an extra key."""
    loaded = load_model(ModelSpec(name=hf_folders[family]))
    layout = loaded.layout
    x = preprocess([chelsea], loaded.data_config).tensor
    register = R.TestTimeRegister(())
    after = register.layout(layout)
    extra = torch.zeros(1, adapter_for(loaded.model).num_layers(loaded.model), after.num_tokens, dtype=torch.bool)
    extra[:, :, layout.num_prefix_tokens] = True
    with torch.no_grad():
        plain = run(loaded.model, x, keep=("pooled",))["pooled"]
        moved = run(loaded.model, x, keep=("pooled",), edit=register.edit(layout))["pooled"]
        masked = run(loaded.model, x, keep=("pooled",),
                     edit=R.compose_edits(register.edit(layout), R.mask_keys(extra)))["pooled"]
    assert float((moved - plain).abs().max() / plain.abs().max()) > 1e-4  # the extra key mattered
    assert float((masked - plain).abs().max() / plain.abs().max()) <= 1e-5


@pytest.mark.parametrize("family", list(REFUSE))
def test_families_that_cannot_take_the_extra_token_say_why(family, hf_folders):  # noqa: F811
    loaded = load_model(ModelSpec(name=hf_folders[family]))
    why = R.why_no_register(loaded.model)
    assert why is not None and REFUSE[family] in why


@pytest.mark.parametrize("family", ["dinov2_registers", "dinov3"])
def test_trained_registers_are_prefix_tokens_and_the_norm_plot_puts_them_apart(family, hf_folders, chelsea):  # noqa: F811
    """DINOv2 with registers and DINOv3 (CLS + 4 registers): the layout names the registers as prefix tokens; the norms
    by layer equal the norms of the library's own hidden states (``output_hidden_states``: each layer's output before
    the final norm); the norm plot's register trace is the registers' largest norm and its patch traces count the
    patches alone (a layout that took the registers for patches gives other patch medians)."""
    from vitviz.figures.registers_figures import norm_by_layer

    loaded = load_model(ModelSpec(name=hf_folders[family]))
    layout = loaded.layout
    assert layout.prefix_tokens == ("cls", "reg0", "reg1", "reg2", "reg3")
    x = preprocess([chelsea, chelsea.transpose(0)], loaded.data_config).tensor
    norms = R.token_norms(loaded.model, x).numpy()
    with torch.no_grad():
        hidden = _library(family, hf_folders[family])(pixel_values=x, output_hidden_states=True).hidden_states[1:]
    own = torch.stack([h.norm(dim=-1) for h in hidden], dim=1).numpy()  # (B, L, N)
    # float32 norms of the same hidden states from two forwards (spelled out and the library's): rounding ~1e-6
    np.testing.assert_allclose(norms, own, rtol=1e-4)
    traces = {t.name: np.asarray(t.y, dtype=float) for t in norm_by_layer(R.find_outliers(norms, layout)).data}
    np.testing.assert_allclose(traces["registers (reg0-reg3)"], own[:, :, 1:5].max(axis=(0, 2)), rtol=1e-4)
    np.testing.assert_allclose(traces["CLS"], own[:, :, 0].max(axis=0), rtol=1e-4)
    patches = own[:, :, 5:].transpose(1, 0, 2).reshape(own.shape[1], -1)
    np.testing.assert_allclose(traces["patches: median"], np.median(patches, axis=1), rtol=1e-4)
    np.testing.assert_allclose(traces["patches: max"], patches.max(axis=1), rtol=1e-4)
    mixed = own[:, :, 1:].transpose(1, 0, 2).reshape(own.shape[1], -1)  # registers counted as patches
    assert not np.allclose(np.median(mixed, axis=1), np.median(patches, axis=1), rtol=1e-4)
