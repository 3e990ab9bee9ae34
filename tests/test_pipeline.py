"""The one pipeline reduces each layer's attention as the forward runs; those per-layer results must be
the whole-array analyses' results (which their own tests check against references from the papers)."""
import numpy as np

from vitviz.distance import mean_attention_distance
from vitviz.maps import cls_focus, head_entropy
from vitviz.pipeline import forward
from vitviz.tokens import attention_sinks

# Both sides sum the same float32 terms in float64, possibly in another order: reassociating n terms moves a
# float64 sum by at most n * 2**-53 relative, n <= H * N = 6 * 257 here -> 1.7e-13; 1e-12 leaves margin.
RTOL = 1e-12


def test_per_layer_reductions_equal_the_whole_array_analyses(bundled, sample_images):
    fwd = forward(bundled, [im.image for im in sample_images[:2]])
    attention, layout = fwd.capture.attention, fwd.layout
    np.testing.assert_allclose(fwd.distance, mean_attention_distance(attention, layout), rtol=RTOL)
    for i in range(2):
        whole = attention_sinks(attention[i], layout)
        np.testing.assert_allclose(fwd.sinks[i].received, whole.received, rtol=RTOL)
        assert [s.tolist() for s in fwd.sinks[i].sinks] == [s.tolist() for s in whole.sinks]
        scores = fwd.head_scores(i)
        np.testing.assert_allclose(scores["entropy"], head_entropy(attention[i], layout), rtol=RTOL)
        np.testing.assert_allclose(scores["cls_focus"], cls_focus(attention[i], layout), rtol=RTOL)
        np.testing.assert_array_equal(scores["distance"], fwd.distance[i])
    # The bundled model has sinks in some layer and the two images differ: a swapped image or layer shows.
    assert any(len(s) for s in fwd.sinks[0].sinks)
    assert not np.allclose(fwd.entropy[0], fwd.entropy[1], rtol=1e-3)
    assert not np.allclose(fwd.distance[0][0], fwd.distance[0][-1], rtol=1e-3)
