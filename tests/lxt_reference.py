"""lxt 2.1's relevance for a torchvision ViT or a Hugging Face ViT, run as a script in its own process (lxt
patches torch classes globally). Usage: python lxt_reference.py {cp-lrp|attnlrp} IN.pt OUT.pt

IN.pt holds the input and the classes, and either the torchvision model's constructor arguments and state_dict
(float64) or ``folder``, a transformers ViT's save_pretrained folder; OUT.pt gets the relevance per pixel (B, H, W):
Σ over channels of input ⊙ gradient of the class logit, as lxt's examples do.
"""
import sys
import types
import warnings

import torch


def _import_lxt():
    """lxt 2.1 imports the LLM modules of transformers 4 at package import; under transformers 5 some of those
    names are gone. Its language-model maps are not used here: stand-ins let ``lxt.efficient`` import."""
    for name in ("llama", "qwen2", "qwen3", "gemma3", "bert", "gpt2"):
        stub = types.ModuleType(f"lxt.efficient.models.{name}")
        setattr(stub, f"modeling_{name}", types.ModuleType(f"modeling_{name}"))
        stub.attnLRP = {}
        sys.modules[stub.__name__] = stub
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # 'zennit' is not installed (only lxt's zennit patches need it)
        import lxt.efficient  # noqa: F401


def _hf_vit(method: str, folder: str):
    """A transformers ViT (SDPA attention, float64) with lxt's rules: its LayerNorm and identity-rule activation
    patches on the classes, and its attention wrapper (uniform rule at q, k, v; CP-LRP: q and k detached) around
    the SDPA function. lxt's own ``patch_attention`` replaces transformers' attention registry with a plain dict,
    which transformers 5 can no longer call (``get_interface``): the same wrapper is registered by hand instead.
    SDPA rather than eager: eager computes the softmax in float32 even in a float64 model."""
    from lxt.efficient.patches import (cp_wrap_attention_forward, layer_norm_forward, non_linear_forward, patch_method,
                                       wrap_attention_forward)
    from transformers import ViTForImageClassification, activations
    from transformers.integrations.sdpa_attention import sdpa_attention_forward
    from transformers.models.vit import modeling_vit

    patch_method(layer_norm_forward, torch.nn.LayerNorm)
    patch_method(non_linear_forward, activations.GELUActivation, keep_original=True)
    wrap = cp_wrap_attention_forward if method == "cp-lrp" else wrap_attention_forward
    modeling_vit.ALL_ATTENTION_FUNCTIONS["sdpa"] = wrap(sdpa_attention_forward)
    model = ViTForImageClassification.from_pretrained(folder, attn_implementation="sdpa").double().eval()
    return lambda x: model(pixel_values=x).logits


def main(method: str, src: str, dst: str) -> None:
    _import_lxt()
    data = torch.load(src, weights_only=True)
    if "folder" in data:
        forward = _hf_vit(method, data["folder"])
        x = data["input"].clone().requires_grad_(True)
        logits = forward(x)
        logits[torch.arange(len(x)), data["classes"]].sum().backward()
        torch.save({"pixels": (x * x.grad).sum(1).detach(), "logits": logits.detach()}, dst)
        return
    from functools import partial

    from lxt.efficient import monkey_patch
    from lxt.efficient.patches import layer_norm_forward, non_linear_forward, patch_method, wrap_attention_forward
    from torchvision.models import vision_transformer

    if method == "cp-lrp":
        monkey_patch(vision_transformer)  # lxt's own map for torchvision's ViT (vit_torch.cp_LRP)
    else:  # AttnLRP: the same norm and activation rules, and lxt's uniform rule at attention's q, k, v
        mha = vision_transformer.nn.MultiheadAttention
        monkey_patch(vision_transformer, {
            vision_transformer.nn.GELU: partial(patch_method, non_linear_forward, keep_original=True),
            vision_transformer.nn.LayerNorm: partial(patch_method, layer_norm_forward),
            mha: lambda cls: patch_method(wrap_attention_forward(cls.forward), cls),
        })
    model = vision_transformer.VisionTransformer(**data["config"]).double().eval()
    model.load_state_dict(data["state_dict"])
    x = data["input"].clone().requires_grad_(True)
    logits = model(x)
    logits[torch.arange(len(x)), data["classes"]].sum().backward()
    torch.save({"pixels": (x * x.grad).sum(1).detach(), "logits": logits.detach()}, dst)


if __name__ == "__main__":
    main(*sys.argv[1:4])
