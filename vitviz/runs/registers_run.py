"""The register search over an image set and its files: ``python -m vitviz registers INPUT... --out DIR``
writes ``DIR/registers.json`` and ``DIR/norms.parquet``; ``analyze --registers DIR/registers.json`` reads
the first back (:func:`load_register`)."""
from __future__ import annotations

import json
import os
import secrets
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from ..errors import VitvizError
from ..adapters import editing
from ..explainers import get_method
from ..perturbation.curves import (RANDOM_SEEDS, SEED_PREFIX, ChanceBand, Faithfulness, default_fractions, random_map,
                                   random_seed_maps, split_random_seeds)
from ..perturbation.protocols import protocol_curves
from ..analyses.registers import (OUTLIER_FACTOR, Outliers, Search, TestTimeRegister, check_register, register_from_json,
                        search_register_neurons, why_no_register)

REGISTERS_NAME = "registers.json"
NORMS_NAME = "norms.parquet"
NORMS_COLUMNS = {
    "image": "the file as given, or relative to the folder given",
    "layer": "1-based block whose output the norm is of (before the final norm)",
    "token": "0-based index into the sequence (prefix tokens first, then patches in raster order)",
    "token_name": "cls, reg0.. (trained registers), or patch <raster index>",
    "norm": "L2 norm of the token leaving the block",
    "outlier": "the patch is above threshold x the median patch norm of its image and layer",
}


def search_images(loaded, images: list, batch_size: int = 8, factor: float = OUTLIER_FACTOR,
                  detect_layer: int = -1, top: int | None = 50) -> Search:
    """:func:`vitviz.analyses.registers.search_register_neurons` over decoded images (``LoadedImage`` or PIL), b at a time."""
    from ..sources.preprocess import preprocess

    pil = [getattr(im, "image", im) for im in images]
    device = next(loaded.model.parameters())

    def batches():
        for i in range(0, len(pil), batch_size):
            yield preprocess(pil[i:i + batch_size], loaded.data_config).tensor.to(device.device, device.dtype)

    try:
        return search_register_neurons(loaded.model, batches(), loaded.layout, factor, detect_layer, top)
    except ValueError as exc:
        raise VitvizError(str(exc)) from exc


def norms_table(outliers: Outliers, names: list[str]) -> pd.DataFrame:
    """One row per image, layer and token (:data:`NORMS_COLUMNS`)."""
    B, L, N = outliers.norms.shape
    layout = outliers.layout
    token_names = list(layout.prefix_tokens) + [f"patch {p}" for p in range(layout.num_patches)]
    outlier = np.zeros((B, L, N), dtype=bool)
    outlier[:, :, layout.patch_slice] = outliers.mask
    return pd.DataFrame({
        "image": np.repeat(np.asarray(names, dtype=object), L * N),
        "layer": np.tile(np.repeat(np.arange(1, L + 1), N), B).astype(np.int16),
        "token": np.tile(np.arange(N), B * L).astype(np.int32),
        "token_name": np.tile(np.asarray(token_names, dtype=object), B * L),
        "norm": outliers.norms.reshape(-1).astype(np.float32),
        "outlier": outlier.reshape(-1),
    })


def write_search(out: Path, search: Search, names: list[str], facts: dict) -> None:
    """``registers.json`` and ``norms.parquet`` into ``out``, each written to a temporary file and renamed:
    a reader finds the previous pair or this one, never half a file (the json goes last and names the table)."""
    data = search.to_json() | facts | {"norms_table": NORMS_NAME, "norms_columns": NORMS_COLUMNS,
                                       "images_searched": names}
    # Own names, opened exclusively ("x"): mkstemp's files are private (0600), and the renamed outputs would stay so;
    # these get the user's umask like every other output.
    tag = secrets.token_hex(8)
    table_tmp, json_tmp = out / f".norms-{tag}.parquet", out / f".registers-{tag}.json"
    try:
        with open(table_tmp, "xb") as f:
            norms_table(search.outliers, names).to_parquet(f, index=False)
        with open(json_tmp, "x") as f:
            json.dump(data, f, indent=2)
        os.replace(table_tmp, out / NORMS_NAME)
        os.replace(json_tmp, out / REGISTERS_NAME)
    finally:
        for p in (table_tmp, json_tmp):  # left only when something failed before its rename
            p.unlink(missing_ok=True)


def load_register(path: Path, model, layout, k: int | None = None, init: str = "zero") -> tuple[TestTimeRegister, dict]:
    """The test-time register a registers.json describes, checked against ``model``; a sentence naming the
    file for every mistake a user can make (not JSON, no neurons, another model's neurons, a model that
    cannot take the extra token)."""
    where = f"--registers {path}"
    try:
        data = json.loads(Path(path).read_text())
    except OSError as exc:
        raise VitvizError(f"{where}: cannot be read ({exc.strerror or exc}).") from exc
    except ValueError as exc:
        raise VitvizError(f"{where}: is not JSON ({exc}); give the registers.json that "
                          "`python -m vitviz registers` wrote.") from exc
    if not isinstance(data, dict):
        raise VitvizError(f"{where}: is not a registers.json (expected an object with 'neurons').")
    if k is not None and k < 1:
        raise VitvizError(f"--register-neurons must be 1 or more, not {k}.")
    why = why_no_register(model)
    if why is not None:
        raise VitvizError(why)
    try:
        register = register_from_json(data, k, init)
    except ValueError as exc:
        raise VitvizError(f"{where}: {exc}.") from exc
    try:
        check_register(model, register, layout)
    except ValueError as exc:
        raise VitvizError(f"{where}: {exc} (was it written for another model?).") from exc
    return register, data


@dataclass
class RepairFaithfulness:
    """Deletion / insertion AUCs of maps before and after a repair, on one image, each beside its random band.

    Attributes:
        before, after: the curves of the maps and of the seeded random maps (``random_seed_*``); ``after`` is
            scored with the repair run in every forward (the repaired model is the model then).
        band_before, band_after: the random maps' chance band of each.
    """

    before: Faithfulness
    after: Faithfulness
    band_before: ChanceBand
    band_after: ChanceBand

    def table(self) -> list[dict]:
        """One row per method and side: AUCs and the verdict against that side's random band."""
        rows = []
        for side, result, band in (("before", self.before, self.band_before), ("after", self.after, self.band_after)):
            others, _ = split_random_seeds(result)
            for m in others:
                d, i = float(result.deletion_auc[m]), float(result.insertion_auc[m])
                rows.append({"method": result.methods[m], "side": side, "deletion_auc": d, "insertion_auc": i,
                             "deletion_vs_random": band.compare("deletion", d),
                             "insertion_vs_random": band.compare("insertion", i)})
        for side, band in (("before", self.band_before), ("after", self.band_after)):
            (dm, ds), (im, isd) = band.band("deletion"), band.band("insertion")
            rows.append({"method": f"random ({band.seeds} seeds, mean ± s.d.)", "side": side,
                         "deletion_auc": dm, "insertion_auc": im, "deletion_vs_random": f"± {ds:.3f}",
                         "insertion_vs_random": f"± {isd:.3f}"})
        return rows


def repair_faithfulness(loaded, image, repair, methods: tuple[str, ...] = ("attnlrp", "rollout"),
                        sinks=None, target: int | None = None, seeds: int = RANDOM_SEEDS, *,
                        before: Faithfulness | None = None, after=None) -> RepairFaithfulness:
    """Rollout (of the readout, all layers, mean over heads) and, where the family allows, AttnLRP of one image
    (PIL) before and after ``repair`` (:class:`vitviz.analyses.registers.Repair`), each beside the random band: does
    the repair cost faithfulness?

    Scored as the Faithfulness page scores its defaults (:func:`vitviz.perturbation.protocols.protocol_curves`:
    MoRF is the deletion curve, insertion the insertion curve; removed patches become the mean colour; 11 steps;
    signed maps in their signed order; random seeds 0 .. ``seeds`` - 1), so "before" is that page's row.

    Args:
        target: the class scored and explained on both sides (default the unrepaired top-1 with a head); a headless
            model scores each side's pre-logits cosine with its own unperturbed vector.
        before: the unrepaired curves when already computed with these settings (the Faithfulness page's, its
            ``random_seed_*`` rows included): kept as they are, and the "after" maps are those of its methods.
        after: the repaired image's :class:`vitviz.analyses.per_image.ImageAnalyses` when already computed.
    """
    from ..lens import Lens
    from ..sources.preprocess import preprocess
    from ..analyses.per_image import analyse_images

    model, layout = loaded.model, loaded.layout
    x = preprocess([image], loaded.data_config).tensor
    param = next(model.parameters())
    x = x.to(param.device, param.dtype)
    lens = Lens(loaded)
    plain = None
    if before is None or (sinks is None and repair.kind == "sinks") or (target is None and before.target is None
                                                                          and loaded.has_head):
        plain = analyse_images(loaded, [image])
    sinks = plain.sinks if sinks is None and plain is not None else sinks
    if target is None and before is not None:
        target = before.target
    if target is None and plain is not None and plain.trace.logits is not None:
        target = int(plain.trace.logits[0].argmax())
    if before is not None:
        methods = tuple(before.methods[m] for m in split_random_seeds(before)[0])
        rand = {n: random_map(layout.grid_size, int(n[len(SEED_PREFIX):])) for n in before.methods
                if n.startswith(SEED_PREFIX)}
    else:
        methods = tuple(m for m in methods if m == "rollout" or get_method(m).why_not(lens) is None)
        rand = random_seed_maps(layout.grid_size, seeds=seeds)
    if repair.kind == "register":  # LeGrad and Grad-CAM read the patch tokens by position: not the extra token yet
        methods = tuple(m for m in methods if m not in ("legrad", "gradcam"))
    if before is None:
        before = _curves(model, x[0], _maps(lens, x, plain.image(0), methods, target, None) | rand, layout, target)
    if after is None:
        after = analyse_repaired(loaded, [image], repair, sinks).image(0)
    edit = repair.edit(model, layout, sinks, param.device)
    after_maps = _maps(lens, x, after, methods, target, edit) | rand
    with editing(edit):
        f1 = _curves(model, x[0], after_maps, layout, target)
    return RepairFaithfulness(before, f1, split_random_seeds(before)[1], split_random_seeds(f1)[1])


def _maps(lens, x, analysed, methods, target, edit) -> dict[str, np.ndarray]:
    """One side's maps: rollout of ``analysed``'s attention (all layers, mean fusion), attributions with ``edit`` run
    in the forward (signed maps in their signed order, as the Faithfulness page's default)."""
    from ..explainers import explain
    from ..explainers.targets import default_target
    from ..analyses.rollout import rollout

    out = {}
    for m in methods:
        if m == "rollout":
            out[m] = rollout(analysed.attention, analysed.layout).map
        else:
            with editing(edit):
                out[m] = explain(lens, x, m, default_target(lens.model, target)).patches[0]
    return out


def _curves(model, image, maps, layout, target) -> Faithfulness:
    """MoRF and insertion curves of ``maps`` on one input (3, H, W), as the Faithfulness page computes them."""
    curves = protocol_curves(model, image, maps, layout, protocols=("morf", "insertion"), replacement="mean",
                             fractions=default_fractions(11), target=target)
    return curves.faithfulness(maps, layout.num_patches)


def analyse_repaired(loaded, images: list, repair, sinks: list | None = None):
    """``images`` (PIL) through the model with ``repair`` (:class:`vitviz.analyses.registers.Repair`) run in the
    forward, analysed (:class:`vitviz.analyses.per_image.Analysed`); its layout is the repaired one (the test-time
    register is one more prefix token).

    ``sinks``: per image, the sinks of the unrepaired forward (sink masking drops them); found here with one plain
    forward when not given.

    Raises:
        ViewNotApplicable: window attention, or a repair this model cannot take (the sentence says why).
    """
    from ..analyses.per_image import analyse_images
    from ..errors import ViewNotApplicable

    if loaded.attention_scope == "window":
        raise ViewNotApplicable("a repair needs global attention; this model attends within windows")
    why = repair.why_not(loaded.model, loaded.layout)
    if why:
        raise ViewNotApplicable(why)
    if repair.kind == "sinks" and sinks is None:
        sinks = analyse_images(loaded, images).sinks
    layout, device = loaded.layout, next(loaded.model.parameters()).device  # the layout of the model's own input size
    return analyse_images(loaded, images, edit=repair.edit(loaded.model, layout, sinks, device),
                          layout=repair.layout(layout))
