"""One error family at the edges: whatever a user can cause raises a :class:`vitviz.errors.VitvizError` subclass
(its message the sentence the app and the CLI show), ``ValueError`` stays for programming errors inside vitviz,
and the app (``ui/``, ``pages/``, ``app.py``) catches ``VitvizError``, never ``ValueError``: a bug's ValueError
must not be shown to a user as if it were their mistake.

The checkers read the code with ``ast`` and are tested on planted sources: a new ``raise ValueError`` and an
``except ValueError`` in a page each fail them.
"""
import ast
import math
from pathlib import Path

import pytest

from vitviz.errors import (FileContentError, MethodError, ModelError, ModelNotSupported, OptionError,
                           ViewNotApplicable, VitvizError)

ROOT = Path(__file__).resolve().parent.parent

# (file under vitviz/, enclosing function) -> why a ValueError there is a programming error, not a user's.
PROGRAMMING_ERRORS = {
    ("residual/logit_lens.py", "LogitLens.patch_probabilities"): "a caller reading per-patch ranks of a lens it read without them",
    ("residual/direct.py", "Readout._sources"): "a caller reading shares it asked not to compute",
    ("explainers/base.py", "register_method"): "a method class registered twice or with an unknown need (import time)",
    ("adapters/registry.py", "register_adapter"): "an adapter class registered twice (import time)",
    ("adapters/registry.py", "adapter_for"): "a model no adapter claims reaching the adapters (loaders refuse it "
                                             "first with why_unsupported, as a ModelError)",
    ("layout.py", "TokenLayout.to_grid"): "patch values of another layout handed over by calling code",
    ("layout.py", "TokenLayout.patch_grid"): "token values of another layout handed over by calling code",
    ("analyses/stats.py", "statistics_table"): "calling code passing as many names as images",
    ("analyses/stats.py", "table_for_images"): "calling code passing as many names as images",
    ("analyses/anatomy.py", "layer_qkv"): "calling code passing a batch where one image is read",
    ("analyses/flow.py", "FlowNetwork.__init__"): "an internal capacity scale that overflows int32",
    ("analyses/registers.py", "Repair.__post_init__"): "a Repair built with a register for another kind (the UI and "
                                                        "CLI build it from the kind)",
    ("analyses/registers.py", "Repair.edit"): "calling code leaving out the unrepaired sinks sink masking needs",
    ("explainers/base.py", "to_patch_grid"): "a coarse map whose grid calling code did not match to the "
                                               "layout",
    ("explainers/text.py", "TextTarget.bind"): "a TextTarget used before it was given a lens's text tower",
    ("io/output.py", "NpzStream.append"): "calling code appending arrays of another dtype or shape under one name",
    ("perturbation/stats.py", "bootstrap_mean"): "calling code asking an interval of no values",
    ("runs/engines.py", "_chunks"): "calling code passing batch sizes that do not add up to the files",
}


def _qualnames(tree: ast.AST):
    """Each node with the dotted name of the class/function it sits in ("" at module level)."""
    def walk(node, scope):
        for child in ast.iter_child_nodes(node):
            inner = scope
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                inner = f"{scope}.{child.name}" if scope else child.name
            yield child, inner
            yield from walk(child, inner)
    yield from walk(tree, "")


def _names(node) -> list[str]:
    """The exception names an ``except`` clause or a ``raise`` names (``ValueError``, ``(TypeError, ValueError)``)."""
    if node is None:
        return []
    if isinstance(node, ast.Call):
        return _names(node.func)
    if isinstance(node, ast.Tuple):
        return [n for e in node.elts for n in _names(e)]
    if isinstance(node, ast.Name):
        return [node.id]
    if isinstance(node, ast.Attribute):
        return [node.attr]
    return []


def value_error_raises(package: Path) -> dict[tuple[str, str], int]:
    """(file relative to ``package``, enclosing function) -> how many ``raise ValueError`` it holds."""
    found = {}
    for f in sorted(package.rglob("*.py")):
        for node, scope in _qualnames(ast.parse(f.read_text())):
            if isinstance(node, ast.Raise) and "ValueError" in _names(node.exc):
                key = (f.relative_to(package).as_posix(), scope)
                found[key] = found.get(key, 0) + 1
    return found


def value_error_handlers(files, root: Path = ROOT) -> list[str]:
    """``file:line`` (relative to ``root``) of every ``except`` clause that names ValueError."""
    return [f"{f.relative_to(root).as_posix()}:{node.lineno}" for f in files
            for node in ast.walk(ast.parse(f.read_text()))
            if isinstance(node, ast.ExceptHandler) and "ValueError" in _names(node.type)]


def _app_files():
    return sorted([*(ROOT / "ui").rglob("*.py"), *(ROOT / "pages").rglob("*.py"), ROOT / "app.py"])


def test_user_errors_are_vitviz_errors():
    """A ``raise ValueError`` outside the allow-list is a user's error that the app would not catch (or a new
    programming error: then it goes into the list, with its reason)."""
    found = value_error_raises(ROOT / "vitviz")
    unlisted = sorted(set(found) - set(PROGRAMMING_ERRORS))
    assert not unlisted, ("raise a vitviz.errors.VitvizError subclass (OptionError, ViewNotApplicable, "
                          f"FileContentError, ...) for a user's error, or list a programming error: {unlisted}")
    stale = sorted(set(PROGRAMMING_ERRORS) - set(found))
    assert not stale, f"allow-list entries with no raise ValueError left: {stale}"


def test_the_app_never_catches_value_error():
    assert value_error_handlers(_app_files()) == []


def test_checkers_catch_planted_sites(tmp_path):
    pkg = tmp_path / "pkg"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "sub" / "m.py").write_text("class A:\n    def f(self, x):\n        if x:\n            raise ValueError('bad')\n"
                                      "        raise OptionError('fine')\n")
    (pkg / "n.py").write_text("def g():\n    raise ValueError\n")
    assert value_error_raises(pkg) == {("sub/m.py", "A.f"): 1, ("n.py", "g"): 1}
    page = tmp_path / "page.py"
    page.write_text("try:\n    pass\nexcept VitvizError:\n    pass\ntry:\n    pass\nexcept (TypeError, ValueError):\n"
                    "    pass\n")
    assert value_error_handlers([page], tmp_path) == ["page.py:7"]


@pytest.mark.parametrize("cls", [OptionError, ViewNotApplicable, FileContentError, MethodError, ModelNotSupported])
def test_the_family_is_also_value_error(cls):
    """Code and tests that caught these sites' ValueError before the family existed still catch them."""
    assert issubclass(cls, VitvizError) and issubclass(cls, ValueError)
    assert issubclass(ModelNotSupported, ModelError)


def test_user_errors_raise_the_family_with_their_sentence():
    from vitviz.analyses.clusters import check_k
    from vitviz.analyses.rollout import fuse_heads
    from vitviz.figures.colour import ColourScale
    from vitviz.perturbation.curves import default_fractions

    import numpy as np
    with pytest.raises(OptionError, match=r"^head fusion must be one of .*, not 'median'$"):
        fuse_heads(np.ones((1, 2, 3, 3)), "median")
    with pytest.raises(OptionError, match=r"^the number of clusters must be between 2 and 12, not 40$"):
        check_k(40, 100)
    with pytest.raises(OptionError, match=r"^the perturbation curve needs at least 2 steps, not 1$"):
        default_fractions(1)


NUMBER_TEXTS = ["0.8", " 12 ", "-3", "+4.5", ".5", "5.", "1e3", "1E-2", "inf", "-Infinity", "nan", "1.5", "abc", "",
                "1,5", "0x10", "1e", "--1", "12a", 7, 2.9, -2.9, float("inf"), float("nan"), None, {}, [1]]


@pytest.mark.parametrize("value", NUMBER_TEXTS, ids=repr)
def test_ui_numbers_read_as_python_does(value):
    """The app's number readers give float()'s and int()'s value, and the default exactly where they refuse."""
    from ui.numbers import number, whole

    def python(convert):
        try:
            return convert(value)
        except (TypeError, ValueError, OverflowError):
            return "default"

    def same(a, b):
        return a == b or (isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b))

    assert same(number(value, "default"), python(float))
    assert same(whole(value, "default"), python(int))
