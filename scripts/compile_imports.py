"""Byte-compile what vitviz and its tests import, once, right after the install (scripts/ensure_venv.sh).

pip installs with ``--no-compile``: byte-compiling every file of the stack (21,000 files, most of them never
imported: CUDA tooling, test suites, unused model families) took ~80 s of the install's ~200 s of CPU, one file
after another. Importing the stack once here writes the .pyc of exactly the modules the app and the tests load,
~16 s of CPU. The import writes them even where the environment sets PYTHONDONTWRITEBYTECODE=1 (this script turns
the flag off for itself only); without the .pyc, every process would compile what it imports again.

Each name is imported on its own: a missing optional package (Ray outside the test install) is skipped.
Usage: python scripts/compile_imports.py [--dev]
"""
import importlib
import sys

sys.dont_write_bytecode = False

RUNTIME = ["torch", "torchvision", "timm", "timm.models", "safetensors.torch", "numpy", "PIL.Image", "onnx",
           "sklearn.decomposition", "sklearn.cluster", "scipy.sparse.csgraph", "plotly.graph_objects", "plotly.io",
           "pandas", "pyarrow.parquet", "streamlit", "streamlit.web.bootstrap", "streamlit.runtime.scriptrunner",
           "streamlit_image_coordinates", "transformers", "tqdm", "vitviz.cli", "vitviz.analyses.per_image",
           "vitviz.explainers.base", "vitviz.explainers.rules", "vitviz.runs.registers_run", "vitviz.perturbation.protocols",
           "matplotlib.figure",
           "matplotlib.backends.backend_svg", "matplotlib.backends.backend_pdf"]
# transformers imports a family's modeling file when its class is first used: the families vitviz reads.
HF_CLASSES = ["AutoConfig", "AutoImageProcessor", "ViTForImageClassification", "DeiTForImageClassificationWithTeacher",
              "Dinov2Model", "Dinov2WithRegistersModel", "CLIPVisionModel", "SiglipVisionModel",
              "BeitForImageClassification", "DINOv3ViTModel", "SwinForImageClassification",
              "Swinv2ForImageClassification"]
DEV = ["pytest", "xdist", "playwright.sync_api", "psutil", "onnxruntime", "ray", "ray.data", "cv2",
       "ttach", "pytorch_grad_cam", "streamlit.testing.v1"]


def main(argv: list[str]) -> int:
    names = RUNTIME + (DEV if "--dev" in argv else [])
    missing = []
    for name in names:
        try:
            importlib.import_module(name)
        except Exception as error:  # noqa: BLE001  (an optional package absent, or broken: pip has said so already)
            missing.append(f"{name} ({type(error).__name__})")
    try:
        import transformers

        for cls in HF_CLASSES:
            getattr(transformers, cls)
    except Exception as error:  # noqa: BLE001
        missing.append(f"transformers classes ({type(error).__name__})")
    if missing:
        print("compile_imports: not imported: " + ", ".join(missing), file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
