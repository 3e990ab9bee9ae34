"""The Faithfulness page's dataset view: a finished run's auc.parquet read back as intervals and sentences."""
import numpy as np
import pandas as pd
import pytest

from vitviz.perturbation.stats import summarise


def _run_table(folder):
    rng = np.random.default_rng(0)
    rows = []
    for i in range(8):
        level = rng.uniform(0.7, 0.9)
        seeds = level + rng.normal(0, 0.01, 4)
        rows += [(f"im{i}.jpg", f"random_seed_{s}", "morf", v) for s, v in enumerate(seeds)]
        rows += [(f"im{i}.jpg", "random", "morf", seeds.mean()), (f"im{i}.jpg", "attnlrp", "morf", level - 0.1),
                 (f"im{i}.jpg", "rollout", "morf", seeds.mean() + 0.003 * (-1) ** i)]  # mean difference 0
        rows += [(f"im{i}.jpg", "random", "lerf", level), (f"im{i}.jpg", "attnlrp", "lerf", level + 0.1),
                 (f"im{i}.jpg", "rollout", "lerf", level - 0.05)]  # higher LeRF is better
    table = pd.DataFrame(rows, columns=["image", "method", "protocol", "auc"])
    folder.mkdir()
    table.to_parquet(folder / "auc.parquet")
    return table


@pytest.mark.slow
def test_dataset_view_shows_each_methods_interval_and_verdict(tmp_path):
    from streamlit.testing.v1 import AppTest

    from test_app import APP

    table = _run_table(tmp_path / "run")
    at = AppTest.from_file(APP, default_timeout=300).run()
    at.switch_page("pages/8_faithfulness.py").run()
    at.radio(key="faith_view").set_value("a finished run over an image set").run()
    at.text_input(key="faith_ds_path").set_value(str(tmp_path / "run")).run()
    assert not at.exception, [e.message for e in at.exception]
    shown = at.dataframe[0].value.set_index("method")
    expected = {r["method"]: r for r in summarise(table)["protocols"]["morf"]["methods"]}
    for method, label in (("attnlrp", "AttnLRP"), ("rollout", "rollout"), ("random", "random")):
        # float64 AUCs: the page shows summarise()'s numbers (the same computation, 8 images), summed(8, EPS64) at most
        assert shown.loc[label, "mean AUC"] == pytest.approx(expected[method]["mean"], abs=1e-12)
        assert shown.loc[label, "95 % low"] == pytest.approx(expected[method]["low"], abs=1e-12)
    assert shown.loc["AttnLRP", "against random"] == "better than random"
    assert shown.loc["rollout", "against random"] == "cannot be told from chance"
    pairs = at.dataframe[1].value
    assert len(pairs) == 3 and (pairs["verdict"] == "AttnLRP is more faithful").sum() == 2
    assert any("AttnLRP is better than random" in m.value for m in at.markdown)
    at.radio(key="faith_ds_protocol").set_value("lerf").run()
    shown = at.dataframe[0].value.set_index("method")
    assert shown.loc["rollout", "against random"] == "worse than random"
    assert (at.dataframe[1].value["verdict"] == "AttnLRP is more faithful").sum() == 2

    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "auc.parquet").write_text("not parquet")
    at.text_input(key="faith_ds_path").set_value(str(tmp_path / "bad")).run()
    assert not at.exception and "not a Parquet file" in at.error[0].value


@pytest.mark.slow
def test_this_image_states_the_chosen_replacement_and_its_table_downloads_rerun_nothing():
    """The top caption names the replacement chosen (blur, not the mean colour); after a run, every download button
    (the AUC table's csv included) is a plain browser download."""
    from streamlit.testing.v1 import AppTest

    from test_app import APP

    def protocol_caption(at):
        return next(c.value for c in at.caption if c.value.startswith("Protocol:"))

    at = AppTest.from_file(APP, default_timeout=300).run()
    at.switch_page("pages/8_faithfulness.py").run()
    assert not at.exception, [e.message for e in at.exception]
    assert "the dataset mean colour" in protocol_caption(at)
    at.selectbox(key="faith_replacement").set_value("blur").run()
    caption = protocol_caption(at)
    assert "Gaussian-blurred copy of the input" in caption and "mean colour" not in caption
    at.multiselect(key="faith_methods").set_value(["rollout"]).run()
    at.number_input(key="faith_steps").set_value(3).run()
    at.button(key="faith_run").click().run()
    assert not at.exception, [e.message for e in at.exception]
    assert "Gaussian-blurred copy of the input" in protocol_caption(at)
    buttons = [b.proto for b in at.get("download_button")]
    assert "Data (csv)" in [b.label for b in buttons]
    assert [b.label for b in buttons if not b.ignore_rerun] == []


def _colour_bar(at, key: str) -> dict:
    """The colour-bar marker of the chart whose id contains ``key``: its colour scale and limits."""
    import json

    chart = next(c for c in at.get("plotly_chart") if key in (c.proto.id or ""))
    traces = json.loads(chart.proto.spec)["data"]
    return next(t["marker"] for t in traces if t.get("marker", {}).get("showscale"))


@pytest.mark.slow
def test_each_methods_map_keeps_its_colour_rule_signed_diverging_and_legrad_sequential():
    """AttnLRP (signed) was drawn Inferno from 0 here, its negative values invisible, while the heads and Attribution
    pages draw it red/blue around 0: one colour rule per method. LeGrad (never negative) stays sequential."""
    from streamlit.testing.v1 import AppTest

    from test_app import APP
    from vitviz.figures.colour import reference_stops

    at = AppTest.from_file(APP, default_timeout=300).run()
    at.switch_page("pages/8_faithfulness.py").run()
    at.multiselect(key="faith_methods").set_value(["attnlrp", "legrad"]).run()
    at.number_input(key="faith_steps").set_value(3).run()
    at.button(key="faith_run").click().run()
    assert not at.exception, [e.message for e in at.exception]
    signed = _colour_bar(at, "faith_map_attnlrp")
    assert signed["colorscale"] == reference_stops("RdBu_r")
    assert signed["cmin"] == pytest.approx(-signed["cmax"]) and signed["cmax"] > 0
    legrad = _colour_bar(at, "faith_map_legrad")
    assert legrad["colorscale"] == reference_stops("Inferno") and legrad["cmin"] == 0
