"""State that survives: uploads kept by content hash and named in the URL, the view in the URL (AppTest)."""
from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest

from conftest import ASSETS

pytestmark = pytest.mark.slow
APP = str(Path(__file__).resolve().parent.parent / "app.py")
CHELSEA = ("chelsea.jpg", (ASSETS / "chelsea.jpg").read_bytes(), "image/jpeg")


def _session(params: dict | None = None) -> AppTest:
    at = AppTest.from_file(APP, default_timeout=180)
    for k, v in (params or {}).items():
        at.query_params[k] = v
    at.run()
    assert not at.exception, [e.message for e in at.exception]
    return at


def _images(at) -> list[str]:
    return at.sidebar.selectbox(key="current").options


def test_an_upload_comes_back_from_its_link_and_only_from_it():
    first = _session()
    first.sidebar.file_uploader(key="uploads").set_value([CHELSEA]).run()
    link = first.query_params["img"]
    assert "chelsea.jpg" in _images(first) and first.query_params["image"] == "chelsea.jpg"
    # F5 or a shared link: a new session with the link's query string shows the upload as the current image.
    reloaded = _session({"img": link, "image": "chelsea.jpg"})
    assert "chelsea.jpg" in _images(reloaded)
    assert reloaded.sidebar.selectbox(key="current").value == "chelsea.jpg"
    assert _images(reloaded) == ["chelsea.jpg"]  # the default sample stays out, as it did before F5
    # ... and the sidebar's list of loaded images names it on that first run (the uploader widget is empty).
    assert any("chelsea.jpg" in c.value for c in reloaded.sidebar.caption)
    assert any((b.key or "").startswith("remove_") for b in reloaded.sidebar.button)
    # Another session without the link never sees it.
    assert "chelsea.jpg" not in _images(_session())
    # A link to an image this server no longer keeps says so in a sentence.
    stale = _session({"img": "0" * 32})
    assert any("no longer kept on this server" in w.value for w in stale.sidebar.warning)


def test_the_loaded_list_removes_an_image_after_a_page_switch():
    at = _session()
    at.sidebar.file_uploader(key="uploads").set_value([CHELSEA]).run()
    at.switch_page("pages/4_distance.py").run()  # the uploader is empty here: its own x cannot remove anything
    assert "chelsea.jpg" in _images(at)
    remove = next(b for b in at.sidebar.button if (b.key or "").startswith("remove_"))
    remove.click().run()
    assert not at.exception
    assert "chelsea.jpg" not in _images(at)
    assert "img" not in at.query_params


def test_an_upload_the_page_never_ran_with_survives_a_page_switch():
    """A busy server: the upload's rerun is still waiting when the user opens another page, so the browser's next
    request carries both, and the first run to see the upload is the other page's, whose uploader is another widget
    (Streamlit gives a widget on each page its own identity). The photo must still arrive and become current."""
    at = _session()
    at.sidebar.file_uploader(key="uploads").set_value([CHELSEA])
    at.switch_page("pages/2_heads.py").run()  # one request: the upload and the page switch
    assert not at.exception, [e.message for e in at.exception]
    assert "chelsea.jpg" in _images(at)
    assert at.sidebar.selectbox(key="current").value == "chelsea.jpg"
    at.switch_page("pages/4_distance.py").run()  # and it stays, as any upload does
    assert "chelsea.jpg" in _images(at)


def test_a_link_brings_back_the_resolution_and_names_the_model():
    first = _session()
    first.sidebar.number_input(key="img_size").set_value(280).run()
    assert (first.query_params["model"], first.query_params["res"]) == ("bundled", "280")
    reloaded = _session({"model": "bundled", "res": "280"})
    assert reloaded.sidebar.number_input(key="img_size").value == 280


def test_a_rejected_upload_is_never_kept_and_each_upload_is_listed_once():
    """A file that is not an image gets its sentence while the uploader holds it, and is not stored, not named in
    the URL (so F5 cannot bring it back) and not listed; an upload the uploader lists is not listed again below it."""
    from ui.persist import content_name

    at = _session()
    bad = ("bad.jpg", b"this is not a JPEG", "image/jpeg")
    at.sidebar.file_uploader(key="uploads").set_value([bad, CHELSEA]).run()
    assert not at.exception, [e.message for e in at.exception]
    assert [e.value for e in at.error if e.value.startswith("bad.jpg")], [e.value for e in at.error]
    assert at.query_params["img"] == content_name(CHELSEA[1])
    assert "bad.jpg" not in _images(at)
    assert not [c.value for c in at.sidebar.caption if "chelsea.jpg ·" in c.value or "bad.jpg" in c.value]
    at.switch_page("pages/4_distance.py").run()  # the uploader is empty here: the box lists chelsea, once
    assert not [e.value for e in at.error if "bad.jpg" in e.value]
    assert [c.value for c in at.sidebar.caption if "jpg ·" in c.value] == [
        f":material/image: chelsea.jpg · {len(CHELSEA[1]) / 1e3:.1f} KB"]  # 38.7 KB, not "0.0 MB"
    reloaded = _session({"img": at.query_params["img"]})  # F5
    assert not [e.value for e in reloaded.error if "bad.jpg" in e.value]
    assert "bad.jpg" not in _images(reloaded) and "chelsea.jpg" in _images(reloaded)
