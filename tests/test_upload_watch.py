"""The upload watch (ui.uploads.watch_uploads): after a page switch it looks a fixed number of times for an upload
that landed after its own rerun was dropped, however long the page's runs take (AppTest, the watch's look counted)."""
import time

import pytest
from streamlit.testing.v1 import AppTest

from ui import uploads


def _script():
    import streamlit as st

    from ui import uploads

    uploads.watch_uploads()
    st.write("ran")


@pytest.fixture
def looks(monkeypatch):
    """The watch's looks counted; the page each run draws is the session's "page"; every run 100 s later than the
    last (a page's run on a busy server)."""
    import streamlit as st

    count = {"looks": 0, "now": 1000.0}

    def unclaimed(seen):
        count["looks"] += 1
        return []

    def later():
        count["now"] += 100.0
        return count["now"]

    monkeypatch.setattr(uploads, "_unclaimed_images", unclaimed)
    monkeypatch.setattr(uploads, "_page_id", lambda: st.session_state.get("page", "landing"))
    monkeypatch.setattr(time, "monotonic", later)
    return count


def test_a_switch_gives_the_watch_its_looks_however_slow_the_runs_and_the_first_page_none(looks):
    at = AppTest.from_function(_script, default_timeout=30)
    at.run()
    assert looks["looks"] == 0  # the session's first page: its own uploader reruns it
    at.session_state["page"] = "heads"  # a page switch
    for _ in range(uploads.UPLOAD_WATCH_LOOKS + 5):
        at.run()
        assert not at.exception, [e.message for e in at.exception]
    assert looks["looks"] == uploads.UPLOAD_WATCH_LOOKS
    at.session_state["page"] = "rollout"  # another switch: a new window
    at.run()
    assert looks["looks"] == uploads.UPLOAD_WATCH_LOOKS + 1


def _stopped_after_the_upload():
    import streamlit as st

    from ui import state, uploads

    images = uploads.sidebar_images()
    if st.session_state.pop("stop_here", False):
        st.stop()  # where a page switch's rerun can stop a busy server's run: the upload stored, no box drawn yet
    config = {"input_size": (3, 224, 224), "interpolation": "bicubic", "mean": (0.485, 0.456, 0.406),
              "std": (0.229, 0.224, 0.225), "crop_pct": 0.9, "crop_mode": "center"}
    _, current, _ = state._current_image(images, config)
    st.header(current.name)


def test_an_upload_stored_by_a_run_stopped_before_the_image_boxes_is_the_current_image():
    """A run that stores an upload can be stopped at its next Streamlit call (a page switch arriving); the next run
    must still show the upload: on the old code it stayed in the set, and the image before it stayed current."""
    from conftest import ASSETS

    def files(*names):
        return [(name, (ASSETS / name).read_bytes(), "image/jpeg") for name in names]

    at = AppTest.from_function(_stopped_after_the_upload, default_timeout=60).run()
    at = at.sidebar.file_uploader(key="uploads").set_value(files("chelsea.jpg")).run()
    assert [h.value for h in at.header] == ["chelsea.jpg"]
    at.session_state["stop_here"] = True
    at = at.sidebar.file_uploader(key="uploads").set_value(files("chelsea.jpg", "coffee.jpg")).run()
    assert not at.header  # stopped before the boxes
    at = at.run()
    assert not at.exception, [e.message for e in at.exception]
    assert [h.value for h in at.header] == ["coffee.jpg"]
    assert at.sidebar.selectbox(key="current").options == ["chelsea.jpg", "coffee.jpg"]


def _samples_box_replayed():
    import streamlit as st

    from ui import uploads

    if st.session_state.pop("replay", False):
        uploads._samples_picked()  # the box's callback, fired with the value it already had (a busy page switch)
    st.write(", ".join(im.name for im in uploads.sidebar_images()))


def test_a_samples_callback_carrying_the_kept_set_is_no_choice_and_an_upload_still_replaces_the_default():
    from conftest import ASSETS

    at = AppTest.from_function(_samples_box_replayed, default_timeout=60).run()
    assert at.markdown[-1].value == "astronaut.jpg"  # the default sample, so that a first visit shows something
    at.session_state["replay"] = True
    at = at.sidebar.file_uploader(key="uploads").set_value(
        [("chelsea.jpg", (ASSETS / "chelsea.jpg").read_bytes(), "image/jpeg")]).run()
    assert not at.exception, [e.message for e in at.exception]
    assert at.markdown[-1].value == "chelsea.jpg"
    at = at.sidebar.multiselect(key="samples").set_value(["rocket.jpg"]).run()  # a real choice is kept
    assert at.markdown[-1].value == "chelsea.jpg, rocket.jpg"
