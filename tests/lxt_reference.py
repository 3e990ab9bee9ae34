"""lxt 2.1's relevance for a torchvision ViT, run as a script in its own process (lxt patches torch classes
globally). Usage: python lxt_reference.py {cp-lrp|attnlrp} IN.pt OUT.pt

IN.pt holds the model's constructor arguments, its state_dict (float64), the input and the class; OUT.pt gets
the relevance per pixel (B, H, W): Σ over channels of input ⊙ gradient of the class logit, as lxt's examples do.
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


def main(method: str, src: str, dst: str) -> None:
    _import_lxt()
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
    data = torch.load(src)
    model = vision_transformer.VisionTransformer(**data["config"]).double().eval()
    model.load_state_dict(data["state_dict"])
    x = data["input"].clone().requires_grad_(True)
    logits = model(x)
    logits[torch.arange(len(x)), data["classes"]].sum().backward()
    torch.save({"pixels": (x * x.grad).sum(1).detach(), "logits": logits.detach()}, dst)


if __name__ == "__main__":
    main(*sys.argv[1:4])
