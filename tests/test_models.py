"""Loading: local checkpoints (safe formats only), names, devices, offline behaviour."""
import pickle

import pytest
import torch
from safetensors.torch import save_file

from vitviz.trace import trace_for_analysis as capture
from vitviz.errors import ModelError
from vitviz.sources.models import ModelSpec, load_model, resolve_device

ARCH = "vit_small_patch16_224.augreg_in21k_ft_in1k"


@pytest.fixture(scope="module")
def source_model():
    import timm

    torch.manual_seed(0)
    return timm.create_model(ARCH, pretrained=False, depth=2, img_size=224).eval()


def _spec(path, img_size):
    return ModelSpec(name=ARCH, checkpoint=str(path), img_size=img_size)


@pytest.mark.parametrize("suffix", [".safetensors", ".pth"])
def test_checkpoint_round_trip_at_another_resolution(tmp_path, source_model, suffix, monkeypatch):
    import timm

    state = {k: v.contiguous() for k, v in source_model.state_dict().items()}
    path = tmp_path / f"weights{suffix}"
    if suffix == ".safetensors":
        save_file(state, str(path))
    else:
        torch.save({"state_dict": state, "epoch": 3}, str(path))
    # The checkpoint is for a 2-layer variant: build that depth when the name is asked for.
    real_create = timm.create_model
    monkeypatch.setattr(timm, "create_model", lambda name, **kw: real_create(name, **(kw | {"depth": 2})))

    same = load_model(_spec(path, 224))
    for key, value in state.items():
        assert torch.equal(same.model.state_dict()[key], value), key
    x = torch.randn(1, 3, 224, 224)
    with torch.inference_mode():
        assert torch.allclose(capture(same.model, x).logits, source_model(x), atol=1e-5)

    larger = load_model(_spec(path, 288))
    assert larger.layout.grid_size == (18, 18)
    assert larger.data_config["input_size"] == (3, 288, 288)
    assert larger.model.pos_embed.shape == (1, 1 + 18 * 18, 384)
    assert "local file" in larger.weights_source
    out = capture(larger.model, torch.randn(2, 3, 288, 288))
    assert out.stack("attn").shape == (2, 2, 6, 325, 325)


class _RunsCode:
    def __reduce__(self):
        return (print, ("pwned",))


def test_pickle_that_would_run_code_is_refused(tmp_path, capsys):
    path = tmp_path / "evil.pth"
    torch.save({"state_dict": {"x": torch.zeros(1)}, "payload": _RunsCode()}, str(path))
    with pytest.raises(ModelError, match="evil.pth: it contains Python objects other than tensors.*refuses"):
        load_model(_spec(path, None))
    assert "pwned" not in capsys.readouterr().out
    plain = tmp_path / "plain.bin"
    plain.write_bytes(pickle.dumps(_RunsCode()))
    with pytest.raises(ModelError, match="plain.bin"):
        load_model(_spec(plain, None))
    assert "pwned" not in capsys.readouterr().out


def test_checkpoint_problems_are_named(tmp_path, source_model):
    with pytest.raises(ModelError, match="missing.safetensors: no such file"):
        load_model(_spec(tmp_path / "missing.safetensors", None))
    wrong = tmp_path / "wrong.safetensors"
    save_file({"foo": torch.zeros(3)}, str(wrong))
    with pytest.raises(ModelError, match="wrong.safetensors does not fit"):
        load_model(_spec(wrong, None))
    txt = tmp_path / "weights.txt"
    txt.write_text("hi")
    with pytest.raises(ModelError, match="weights.txt: unsupported file type"):
        load_model(_spec(txt, None))
    garbage = tmp_path / "garbage.safetensors"
    garbage.write_bytes(b"\x00" * 100)
    with pytest.raises(ModelError, match="garbage.safetensors: it could not be read"):
        load_model(_spec(garbage, None))


def test_unknown_model_suggests_close_names():
    with pytest.raises(ModelError, match="Unknown model 'vit_base_patch16_22'.*Did you mean vit_base_patch16_224"):
        load_model(ModelSpec(name="vit_base_patch16_22"))


def test_offline_pretrained_download_says_so_quickly(network_calls):
    with pytest.raises(ModelError, match="not in the local Hugging Face cache.*offline.*bundled model"):
        load_model(ModelSpec(name="vit_tiny_patch16_224.augreg_in21k"))
    assert network_calls == []  # no minute of download retries: nothing was even tried


def test_unsupported_family_by_name():
    with pytest.raises(ModelError, match="'resnet18' is not supported yet"):
        load_model(ModelSpec(name="resnet18"))


def test_device_resolution():
    assert resolve_device("cpu").type == "cpu"
    if not torch.cuda.is_available():
        assert resolve_device("auto").type in ("cpu", "mps")
        with pytest.raises(ModelError, match="'cuda' was asked for, but this machine has no CUDA GPU"):
            resolve_device("cuda")
    with pytest.raises(ModelError, match="'tpu7' is not a device name"):
        resolve_device("tpu7")


def test_half_precision_on_cpu_is_refused():
    with pytest.raises(ModelError, match="float16 is for GPUs"):
        load_model(ModelSpec(device="cpu", dtype="float16"))


def test_bundled_resolution_must_be_a_multiple_of_the_patch():
    with pytest.raises(ModelError, match="225 px is not a multiple of the bundled model's patch size 14"):
        load_model(ModelSpec(img_size=225))


def test_search_models_finds_tagged_names_and_never_invents_one():
    from vitviz.sources.models import search_models

    found = search_models("deit3_small_patch16_224")
    assert "deit3_small_patch16_224.fb_in1k" in found
    assert search_models("my_custom_vit") == []  # the query is a search, not a model name
