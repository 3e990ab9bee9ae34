"""Linear probes (vitviz.probes): labelled images, per-layer features, nested cross-validation, the exported head."""
from __future__ import annotations

import csv
import json

import numpy as np
import pytest
import timm
import torch
from PIL import Image

from vitviz import probes
from vitviz.lens import Lens
from vitviz.sources.models import ModelSpec, _finish
from vitviz.probes.data import LabelError
from vitviz.probes.features import layer_features
from vitviz.probes.linear import export_head, fit_probe, score_layer, wilson

TINY_PROBE = dict(depth=3, embed_dim=32, num_heads=2, img_size=32)


def tiny_lens(seed: int = 0, name: str = "vit_small_patch16_224", **kw) -> Lens:
    torch.manual_seed(seed)
    model = timm.create_model(name, pretrained=False, num_classes=0, **(TINY_PROBE | kw))
    return Lens(_finish(model, ModelSpec(name=name, device="cpu"), "random", f"tiny {name}", []))


def noise_images(folder, n: int, seed: int, size: int = 32) -> list:
    rng = np.random.default_rng(seed)
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for i in range(n):
        path = folder / f"img{i}.png"
        Image.fromarray(rng.integers(0, 256, (size, size, 3), dtype=np.uint8)).save(path)
        paths.append(path)
    return paths


def write_csv(path, rows, header=("path", "label")):
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(header)
        w.writerows(rows)
    return path


# --- labelled images ---------------------------------------------------------------------------------------

def test_label_file_and_folders_give_the_same_images_and_classes(tmp_path):
    for cls, seed in (("cat", 0), ("dog", 1)):
        noise_images(tmp_path / "root" / cls, 3, seed)
    folders = probes.from_folders([tmp_path / "root"])
    rows = [(f"root/{c}/img{i}.png", c) for c in ("dog", "cat") for i in range(3)]
    listed = probes.from_label_file(write_csv(tmp_path / "labels.csv", rows))
    assert folders.classes == listed.classes == ("cat", "dog")
    assert sorted(zip(map(str, folders.names), folders.labels)) == sorted(
        (n.removeprefix("root/"), c) for n, c in zip(listed.names, listed.labels))
    assert listed.targets() == [1, 1, 1, 0, 0, 0]


@pytest.mark.parametrize("rows, expected", [
    ([("a/img0.png", "x"), ("a/missing.png", "x"), ("a/img1.png", "y"), ("a/img2.png", "y")],
     "labels.csv line 3: "),
    ([("a/img0.png", "x"), ("a/img1.png", "x"), ("a/img2.png", "x")], "every image has the class 'x'"),
    ([("a/img0.png", "x"), ("a/img1.png", "x"), ("a/img2.png", "y")], "labels.csv line 4: class 'y' has this one image"),
    ([("a/img0.png", "x"), ("a/img1.png", ""), ("a/img2.png", "y")], "labels.csv line 3: a/img1.png has no label"),
    ([("a/img0.png", "x"), ("a/img1.png", "x"), ("a/img0.png", "y")], "labels.csv line 4: a/img0.png is listed twice "
                                                                       "(first on line 2)"),
])
def test_bad_label_files_get_a_sentence_naming_the_file_and_line(tmp_path, rows, expected):
    noise_images(tmp_path / "a", 3, 0)
    with pytest.raises(LabelError) as err:
        probes.from_label_file(write_csv(tmp_path / "labels.csv", rows))
    assert expected in str(err.value)
    if "missing" in str(rows):
        assert "missing.png does not exist" in str(err.value)


def test_label_file_without_a_label_column_and_parquet_rows_are_named(tmp_path):
    noise_images(tmp_path / "a", 3, 0)
    with pytest.raises(LabelError, match="labels.csv line 1: the header has no 'label' column"):
        probes.from_label_file(write_csv(tmp_path / "labels.csv", [("a/img0.png", "x")], header=("path", "class")))
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"path": ["a/img0.png", "a/img1.png", "a/nope.png"], "label": ["x", "y", "y"]}),
                   tmp_path / "labels.parquet")
    with pytest.raises(LabelError, match="labels.parquet row 3: .*nope.png does not exist"):
        probes.from_label_file(tmp_path / "labels.parquet")


def test_a_class_folder_with_one_image_is_named(tmp_path):
    noise_images(tmp_path / "root" / "cat", 3, 0)
    noise_images(tmp_path / "root" / "dog", 1, 1)
    with pytest.raises(LabelError, match=r"root/dog/: class 'dog' has this one image"):
        probes.from_folders([tmp_path / "root"])


# --- features ----------------------------------------------------------------------------------------------

@pytest.mark.parametrize("name", ["vit_small_patch16_224", "vit_small_patch14_reg4_dinov2"])
def test_features_of_every_layer_equal_timm_forward_intermediates_through_the_final_norm(tmp_path, name):
    kw = {"img_size": 28} if "14" in name else {}
    lens = tiny_lens(1, name, **kw)
    paths = noise_images(tmp_path / "x", 3, 2)
    images = probes.LabelledImages(tuple(paths), tuple(map(str, paths)), ("a", "b", "a"), ("1", "2", "3"))
    both, _ = layer_features(lens, images, "cls+mean", batch_size=2)
    x = lens.preprocess(paths).tensor
    L, D = lens.num_layers, lens.model.embed_dim
    with torch.no_grad():
        _, inter = lens.model.forward_intermediates(x, indices=list(range(L)), norm=True, output_fmt="NLC",
                                                    return_prefix_tokens=True)
    for i, (patches, prefix) in enumerate(inter):
        # float32 forward pass of 3 blocks vs the same pass: equal to a few roundings of the activations
        np.testing.assert_allclose(both[i, :, :D], prefix[:, 0].double().numpy(), rtol=0, atol=1e-5)
        np.testing.assert_allclose(both[i, :, D:], patches.mean(1).double().numpy(), rtol=0, atol=1e-5)
    assert both.shape == (L, 3, 2 * D)


# --- fitting -----------------------------------------------------------------------------------------------

def test_wilson_interval_matches_the_hand_computed_one():
    # p = 0.8, n = 10, z = 1.96: centre 0.71674, half-width 0.22658
    low, high = wilson(8, 10)
    assert low == pytest.approx(0.49016, abs=1e-4) and high == pytest.approx(0.94331, abs=1e-4)


@pytest.mark.parametrize("classes", [2, 3])
def test_exported_head_equals_sklearn_decision_function(classes):
    rng = np.random.default_rng(classes)
    y = np.repeat(np.arange(classes), 12)
    X = rng.normal(size=(len(y), 20)) * rng.uniform(0.1, 30, size=20) + rng.normal(size=20) * 5
    X[:, :3] += y[:, None] * 2.0
    pipeline, _ = fit_probe(X, y)
    weight, bias = export_head(pipeline, classes)
    logits = X @ weight.T + bias
    reference = pipeline.decision_function(X)
    got = logits[:, 1] - logits[:, 0] if classes == 2 else logits
    np.testing.assert_allclose(got, reference, rtol=1e-9, atol=1e-9 * np.abs(reference).max())
    assert weight.shape == (classes, 20)
    # the softmax of the head is sklearn's probability
    p = np.exp(logits - logits.max(1, keepdims=True))
    np.testing.assert_allclose(p / p.sum(1, keepdims=True), pipeline.predict_proba(X), atol=1e-9)


def test_nested_cross_validation_never_shows_a_fold_its_test_images(monkeypatch):
    from vitviz.probes import linear as fit_module

    rng = np.random.default_rng(0)
    y = np.repeat([0, 1], 10)
    X = rng.normal(size=(20, 5))
    X[:, 0] += 6 * y
    seen = []
    real = fit_module.fit_probe
    monkeypatch.setattr(fit_module, "fit_probe", lambda Xs, ys, *a: (seen.append(Xs.copy()), real(Xs, ys, *a))[1])
    score = score_layer(X, y, layer=4)
    assert score.layer == 4 and score.folds == 5 and len(seen) == 5
    # each outer fold's probe (C search included) saw only its 16 training images, and every image was held out once
    held_out = [[i for i in range(20) if not (X[i] == s).all(1).any()] for s in seen]
    assert all(len(s) == 16 for s in seen) and sorted(sum(held_out, [])) == list(range(20))
    assert score.accuracy >= 0.9 and score.low <= score.accuracy <= score.high


def test_fit_scores_every_layer_saves_the_head_and_its_logits_equal_sklearn(tmp_path):
    lens = tiny_lens(3)
    paths = noise_images(tmp_path / "x", 10, 4)
    labels = ["a", "b", "c", "a", "b", "c", "a", "b", "a", "b"]
    result = probes.fit(lens, paths, labels, pooling="mean", layer=2)
    assert [row["layer"] for row in result.table] == [1, 2, 3] and result.layer == 2
    assert result.classes == ("a", "b", "c") and result.chance == pytest.approx(0.4)
    out = result.save(tmp_path / "probe")
    from safetensors.torch import load_file

    tensors = load_file(out)
    assert tensors["weight"].shape == (3, 32) and tensors["bias"].shape == (3,)
    info = json.loads((tmp_path / "probe" / "probe.json").read_text())
    assert info["layer"] == 2 and info["pooling"] == "mean" and info["classes"] == ["a", "b", "c"]
    assert [row["layer"] for row in info["layers"]] == [1, 2, 3] and info["chance"] == pytest.approx(0.4)
    assert len(info["images"]) == 10 and len(info["images"][0]["sha256"]) == 64
    # the saved float32 head on the layer's features equals sklearn's decision function of the same fit
    y = np.array([result.classes.index(c) for c in labels])
    pipeline, _ = fit_probe(result.features[1], y)
    reference = pipeline.decision_function(result.features[1])
    logits = result.head(torch.from_numpy(result.features[1]).float()).double().numpy()
    np.testing.assert_allclose(logits, reference, rtol=0, atol=1e-5 * np.abs(reference).max())


# --- the planted concept ---------------------------------------------------------------------------------

class PlantedLens(Lens):
    """Test only: images of group 1 get ``direction`` added to every token at block ``block`` (0-based) through
    ``edit=`` on its ``resid_post``. Groups are assigned by image identity, not content (all images are the same
    noise distribution), so nothing before the block can tell them apart."""

    def __init__(self, loaded, block: int, direction: torch.Tensor, groups: dict):
        super().__init__(loaded)
        object.__setattr__(self, "plant", (block, direction, groups))

    def trace(self, x, keep=("attn",), edit=None, **kw):
        block, direction, groups = self.plant
        tensor = x.tensor if hasattr(x, "tensor") else x
        mask = torch.tensor([groups[t.numpy().tobytes()] for t in tensor], dtype=tensor.dtype)

        def add(value, point):
            return value + mask[:, None, None] * direction

        return super().trace(x, keep=keep, edit={f"blocks.{block}.resid_post": add, **(edit or {})}, **kw)


def test_a_planted_concept_is_at_chance_before_its_block_and_decodable_from_it_on(tmp_path):
    base = tiny_lens(7, depth=5)
    block = 2  # 0-based: layers 1-2 (1-based) have no trace of the groups, layers 3-5 carry the direction
    paths = noise_images(tmp_path / "x", 32, 8)
    labels = ["planted" if i % 2 else "plain" for i in range(32)]
    keys = [t.numpy().tobytes() for t in base.preprocess(paths).tensor]
    gen = torch.Generator().manual_seed(0)
    direction = torch.randn(base.model.embed_dim, generator=gen)
    direction = 3 * (direction - direction.mean()) / (direction - direction.mean()).norm() * np.sqrt(32)
    lens = PlantedLens(base.loaded, block, direction, {k: float(c == "planted") for k, c in zip(keys, labels)})
    result = probes.fit(lens, paths, labels, pooling="cls")
    accuracy = [s.accuracy for s in result.layers]
    assert result.chance == 0.5
    assert all(a <= 0.75 for a in accuracy[:block]), accuracy  # chance 0.5; 0.75 is 2.8 binomial sd above it
    assert all(a >= 0.95 for a in accuracy[block:]), accuracy
    assert result.layer == block + 1  # the best, the earliest of equals
    assert all(s.low <= s.accuracy <= s.high for s in result.layers)


def test_the_head_refitted_on_another_layer_is_sklearns_fit_of_that_layer(tmp_path):
    lens = tiny_lens(4)
    paths = noise_images(tmp_path / "x", 8, 5)
    labels = ["a", "b"] * 4
    result = probes.fit(lens, paths, labels, pooling="cls", layer=1)
    other = result.at_layer(3)
    assert other.layer == 3 and other.table == result.table
    y = np.array([result.classes.index(c) for c in labels])
    weight, bias = export_head(fit_probe(result.features[2], y)[0], 2)
    np.testing.assert_allclose(other.weight, weight) and np.testing.assert_allclose(other.bias, bias)
    assert not np.allclose(other.weight, result.weight)
    with pytest.raises(probes.LabelError.__mro__[1], match="layer 4 is not a layer of this model: its layers are 1 to 3"):
        result.at_layer(4)


def test_the_c_search_chooses_what_sklearns_grid_search_chooses():
    from sklearn.model_selection import GridSearchCV, StratifiedKFold

    from vitviz.probes.linear import CS, _pipeline

    rng = np.random.default_rng(3)
    for trial in range(4):
        y = np.repeat(np.arange(3), 6)
        X = rng.normal(size=(18, 12))
        X[:, 0] += y * (0.3 + 0.4 * trial)
        C = fit_probe(X, y, seed=trial)[1].C
        cv = StratifiedKFold(n_splits=3, shuffle=True, random_state=trial)
        search = GridSearchCV(_pipeline(1.0, trial), {"logisticregression__C": list(CS)}, cv=cv).fit(X, y)
        assert C == search.best_params_["logisticregression__C"], trial


def _noisy_pair(trial: int, seed: int = 0):
    """30 images, 2 classes, one weak signal feature among 40 (the C search's accuracies differ between Cs)."""
    rng = np.random.default_rng(seed)
    for _ in range(trial + 1):
        y = np.repeat(np.arange(2), 15)
        X = rng.normal(size=(30, 40))
        X[:, 0] += y * 1.5
    return X, y


@pytest.mark.parametrize("trial, edge, beyond", [(2, "smallest", True), (5, "smallest", False), (4, None, False)])
def test_the_c_search_reports_its_accuracies_and_a_choice_at_the_grids_end(trial, edge, beyond):
    """Accuracies against scikit-learn's GridSearchCV (the same folds: mean_test_score); C = 1e-3 chosen as the
    best of all (trial 2: the best C may lie below), as a tie with 1e-2 (trial 5: flat), and inside (trial 4)."""
    from sklearn.model_selection import GridSearchCV, StratifiedKFold

    from vitviz.probes.linear import CS, _pipeline

    X, y = _noisy_pair(trial)
    _, search = fit_probe(X, y, seed=trial)
    cv = StratifiedKFold(n_splits=3, shuffle=True, random_state=trial)
    grid = GridSearchCV(_pipeline(1.0, trial), {"logisticregression__C": list(CS)}, cv=cv).fit(X, y)
    # the same three fold accuracies (multiples of 1/10), summed in another order: a few ulp
    np.testing.assert_allclose(search.accuracy, grid.cv_results_["mean_test_score"], rtol=0, atol=1e-12)
    assert search.C == grid.best_params_["logisticregression__C"] and search.grid == tuple(CS)
    assert (search.edge, search.beyond) == (edge, beyond)
    note = search.note()
    if edge is None:
        assert note is None
    else:
        assert note.startswith("C = 0.001 is the smallest of the search's range (0.001 to 10)")
        assert ("may lie below the range" in note) == beyond and ("flat there" in note) == (not beyond)


def test_a_largest_c_above_its_neighbour_may_lie_above_the_range():
    from vitviz.probes.linear import CSearch

    search = CSearch((0.1, 1.0, 10.0), (0.5, 0.6, 0.7), 10.0, 3)
    assert (search.edge, search.beyond) == ("largest", True)
    assert search.note() == ("C = 10 is the largest of the search's range (0.1 to 10); it scored 0.700 against 0.600 "
                             "for C = 1: the best C may lie above the range.")
    assert CSearch((0.1, 1.0), (), 1.0, 0).edge is None  # a class with one image: nothing was searched


def test_a_layers_c_at_edge_counts_the_outer_folds_whose_search_chose_an_end():
    """Against GridSearchCV on each outer fold's training images (what the nested cross-validation runs)."""
    from sklearn.model_selection import GridSearchCV, StratifiedKFold

    from vitviz.probes.linear import CS, _pipeline

    X, y = _noisy_pair(2)
    score = score_layer(X, y, layer=1, seed=0)
    outer = StratifiedKFold(n_splits=5, shuffle=True, random_state=0)
    ends = 0
    for train, _ in outer.split(X, y):
        inner = StratifiedKFold(n_splits=3, shuffle=True, random_state=0)
        C = GridSearchCV(_pipeline(1.0, 0), {"logisticregression__C": list(CS)}, cv=inner).fit(
            X[train], y[train]).best_params_["logisticregression__C"]
        ends += C in (CS[0], CS[-1])
    assert score.C_at_edge == ends and score.to_dict()["C_at_edge"] == ends
    assert 0 < ends < 5  # the data set makes the count tell something
