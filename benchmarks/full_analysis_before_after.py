"""Full analysis / plain forward with a numpy attention, the one call path the code before and after
issue 10's device work share: run it once per tree, each run's ratio is its own same-run figure.

    git archive 5908527 vitviz | tar -x -C /tmp/before     # main before the placement work
    OMP_NUM_THREADS=1 PYTHONPATH=/tmp/before .venv/bin/python benchmarks/full_analysis_before_after.py
    OMP_NUM_THREADS=1 PYTHONPATH=$PWD .venv/bin/python benchmarks/full_analysis_before_after.py
"""
import sys, time, statistics, torch, timm
from vitviz.trace import trace_for_analysis as capture
from vitviz.analyses.distance import mean_attention_distance
from vitviz.analyses.maps import head_scores
from vitviz.analyses.tokens import attention_sinks
from vitviz.analyses.rollout import rollout
def full(model, x):
    out = capture(model, x)
    a = out.stack("attn").numpy()
    d = mean_attention_distance(a, out.layout)
    for ai, di in zip(a, d):
        attention_sinks(ai, out.layout); rollout(ai, out.layout); head_scores(ai, out.layout, di)
def t(f):
    s = time.perf_counter(); f(); return time.perf_counter() - s
with torch.inference_mode():
    for name in ("vit_small_patch14_dinov2", "vit_base_patch16_224"):
        torch.manual_seed(0)
        m = timm.create_model(name, pretrained=False, img_size=224).eval()
        for b in (1, 8):
            x = torch.randn(b, 3, 224, 224)
            t(lambda: m(x)); t(lambda: full(m, x))
            p, f = [], []
            for _ in range(5):
                p.append(t(lambda: m(x))); f.append(t(lambda: full(m, x)))
            p, f = statistics.median(p), statistics.median(f)
            print(f"{name} B{b}: plain {p:.3f} full {f:.3f} ratio {f/p:.2f}", flush=True)
