"""One perturbation test for one image: the Registers' "faithfulness before and after" reuses the Faithfulness page's
own numbers (the same code path and cache entry), and the two scoring functions of vitviz.perturbation compute the
same curves for the same settings."""
from pathlib import Path

import numpy as np
import pytest
import torch

from test_registers import load_planted, planted_checkpoint  # noqa: F401  (shared fixture)

from conftest import tiny_model
from vitviz.layout import TokenLayout
from vitviz.perturbation.curves import perturbation_curves, random_seed_maps
from vitviz.perturbation.protocols import protocol_curves

APP = str(Path(__file__).resolve().parent.parent / "app.py")


@pytest.mark.parametrize("family", ["vit_augreg", "dinov2"])
def test_perturbation_curves_and_protocol_curves_give_the_same_numbers_for_the_same_settings(family):
    """Deletion (perturbation_curves) is MoRF with the mean replacement (protocol_curves), insertion is insertion:
    the same inputs through the same forward. One input per forward on both sides, so no batch shape can change a
    rounding: the curves are equal bit for bit, with a head (class probability) and without (pre-logits cosine)."""
    from vitviz.adapters import adapter_for

    model = tiny_model(family) if family != "dinov2" else _headless()
    layout = TokenLayout.from_model(model)
    torch.manual_seed(1)
    image = torch.randn(3, 64, 64)
    rng = np.random.default_rng(0)
    maps = {"a": rng.random(layout.grid_size), "ties": np.zeros(layout.grid_size)} | random_seed_maps(layout.grid_size,
                                                                                                      seeds=2)
    fractions = np.linspace(0, 1, 7)
    old = perturbation_curves(model, image, maps, layout, fractions=fractions, batch_size=1)
    new = protocol_curves(model, image, maps, layout, protocols=("morf", "insertion"), replacement="mean",
                          fractions=fractions, batch_size=1).faithfulness(maps, layout.num_patches)
    assert (adapter_for(model).num_classes(model) > 0) == (family != "dinov2")
    assert new.methods == old.methods and new.score == old.score and new.target == old.target
    np.testing.assert_array_equal(new.counts, old.counts)
    np.testing.assert_array_equal(new.deletion, old.deletion)
    np.testing.assert_array_equal(new.insertion, old.insertion)
    assert np.ptp(old.deletion[0]) > 0.1 * old.deletion[0].max()  # the curves move: not two flat lines


def _headless():
    model = tiny_model("vit_augreg")
    model.reset_classifier(0)
    return model


@pytest.mark.slow
def test_registers_before_rows_are_the_faithfulness_pages_rows_and_only_the_after_runs(planted_checkpoint,
                                                                                       monkeypatch):
    """On the planted ViT-Ti: the Faithfulness page with its defaults (AttnLRP, rollout, random), then the Registers
    page's "Faithfulness before and after test-time register": its "before" AUCs equal the Faithfulness page's table
    exactly (the same cached computation), and pressing it runs the perturbation curves once, for the "after" only
    (MoRF and insertion under the repair)."""
    from streamlit.testing.v1 import AppTest

    import ui.image_faithfulness
    import vitviz.runs.registers_run
    from vitviz.perturbation import protocols

    calls = []

    def counting(model, image, maps, layout, **kwargs):
        calls.append(tuple(kwargs["protocols"]))
        return protocols.protocol_curves(model, image, maps, layout, **kwargs)

    monkeypatch.setattr(ui.image_faithfulness, "protocol_curves", counting)
    monkeypatch.setattr(vitviz.runs.registers_run, "protocol_curves", counting)
    _, weights = planted_checkpoint
    at = AppTest.from_file(APP, default_timeout=600).run()
    load_planted(at, weights)
    at.switch_page("pages/8_faithfulness.py").run()
    at.button(key="faith_run").click().run()
    assert not at.exception, [e.message for e in at.exception]
    assert calls == [("morf", "lerf", "insertion")]
    page = next(d.value for d in at.dataframe if "deletion AUC ↓" in d.value).set_index("method")

    at.switch_page("pages/11_registers.py").run()
    assert not at.exception, [e.message for e in at.exception]
    button = at.button(key="register_faithfulness_run")
    assert "the Faithfulness page's 'before' is reused" in button.label
    button.click().run()
    assert not at.exception, [e.message for e in at.exception]
    assert calls == [("morf", "lerf", "insertion"), ("morf", "insertion")]
    table = next(d.value for d in at.dataframe if "before / after" in d.value)
    before = table[table["before / after"] == "before"].set_index("method")
    for method, on_page in (("AttnLRP", "AttnLRP (signed order)"), ("rollout", "rollout")):
        for column in ("deletion AUC ↓", "insertion AUC ↑"):
            assert before.loc[method, column] == page.loc[on_page, column], (method, column)
    assert set(table[table["before / after"] == "after"]["method"]) >= {"AttnLRP", "rollout"}
