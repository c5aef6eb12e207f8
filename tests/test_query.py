"""Long-query splitting and what a query names: paths, modules, symbols, stack frames."""

from __future__ import annotations

import pytest

from indexer.tokens import CONTENT_MAX_TOKENS, default_counter
from retrieval.search.query import Evidence, Frame, RepoNames, extract_refs, split_query

ISSUE = """\
Merging dataArray into dataset using dataset method fails

While it's possible to merge a dataset and a dataarray object using the top-level
`merge()` function, if you try the same thing with the `ds.merge()` method it fails.

```python
import xarray as xr
ds = xr.Dataset({'a': 0})
da = xr.DataArray(1, name='b')
ds.merge(da)  # fails
```

Traceback (most recent call last):
  File "mwe.py", line 6, in <module>
    actual = ds.merge(da)
  File "/home/u/Code/xarray/xarray/core/dataset.py", line 3591, in merge
    fill_value=fill_value,
  File "/home/u/Code/xarray/xarray/core/merge.py", line 394, in coerce_pandas_values
    for k, v in obj.items():
AttributeError: 'DataArray' object has no attribute 'items'
"""


@pytest.fixture(scope="module")
def count():
    return default_counter().count


def test_short_query_is_one_part(count) -> None:
    assert split_query("where do we retry uploads", count) == ["where do we retry uploads"]
    assert split_query("", count) == []


def test_long_query_parts_fit_and_lose_nothing(count) -> None:
    text = (ISSUE + "\n\n") * 6
    assert count(text) > 3 * CONTENT_MAX_TOKENS
    parts = split_query(text, count)
    assert len(parts) > 1
    assert "".join(parts) == text
    assert all(count(p) <= CONTENT_MAX_TOKENS for p in parts)
    assert all(p.strip() for p in parts)


@pytest.mark.parametrize("max_tokens", [8, 30, 100])
def test_parts_fit_small_windows(count, max_tokens: int) -> None:
    parts = split_query(ISSUE, count, max_tokens)
    assert "".join(parts) == ISSUE
    assert all(count(p) <= max_tokens for p in parts)


def test_unbroken_run_is_cut_hard(count) -> None:
    blob = "x" * 3000 + " tail"  # no whitespace for 3000 characters
    parts = split_query(blob, count, 50)
    assert "".join(parts) == blob
    assert all(count(p) <= 50 for p in parts)


def test_paragraphs_are_preferred_boundaries(count) -> None:
    para = "word " * 100
    text = f"{para}\n\n{para}\n\n{para}"
    parts = split_query(text, count, 110)
    assert [p.strip() for p in parts] == [para.strip()] * 3


def test_extracts_python_traceback_frames() -> None:
    refs = extract_refs(ISSUE)
    assert Frame("/home/u/Code/xarray/xarray/core/dataset.py", 3591, "merge") in refs.frames
    assert Frame("/home/u/Code/xarray/xarray/core/merge.py", 394,
                 "coerce_pandas_values") in refs.frames
    assert Frame("mwe.py", 6, None) in refs.frames  # "<module>" names no function
    assert "ds.merge" in refs.symbols and "coerce_pandas_values" in refs.symbols
    assert "DataArray" in refs.symbols


def test_extracts_other_frame_styles_paths_and_modules() -> None:
    text = """
    /usr/lib/python3.6/dist-packages/_pytest/python.py:197: in pytest_pycollect_makeitem
    at renderCart (web/static/cart.js:12:5)
    at com.shop.Cart.total(Cart.java:88)
    See src/codeveil/fusion.py and xarray.core.dataset for `Dataset.merge`, and call
    prepare_body() from requests.models.PreparedRequest.
    """
    refs = extract_refs(text)
    assert Frame("/usr/lib/python3.6/dist-packages/_pytest/python.py", 197,
                 "pytest_pycollect_makeitem") in refs.frames
    assert Frame("web/static/cart.js", 12, "renderCart") in refs.frames
    assert Frame("Cart.java", 88, "total") in refs.frames
    assert "src/codeveil/fusion.py" in refs.paths
    assert "xarray.core.dataset" in refs.modules
    assert "requests.models.PreparedRequest" in refs.modules
    assert {"Dataset.merge", "prepare_body", "Cart.total"} <= set(refs.symbols)


def test_plain_prose_names_nothing() -> None:
    refs = extract_refs("how do I check whether a number is prime")
    assert not refs


REPO = [
    # (path, symbol, lines)
    ("xarray/core/dataset.py", "Dataset", (1, 40)),
    ("xarray/core/dataset.py", "Dataset > merge", (3570, 3600)),
    ("xarray/core/merge.py", "coerce_pandas_values", (380, 400)),
    ("xarray/core/merge.py", "merge_core", (500, 560)),
    ("xarray/tests/test_merge.py", "TestMerge > test_merge", (1, 30)),
    ("src/_pytest/python.py", "pytest_pycollect_makeitem", (190, 210)),
    ("docs/merge.py", "", (1, 5)),
]


@pytest.fixture
def names() -> RepoNames:
    return RepoNames([r[0] for r in REPO], [r[1] for r in REPO], [r[2] for r in REPO])


def test_paths_resolve_by_trailing_components(names: RepoNames) -> None:
    assert names.resolve_path("/home/u/Code/xarray/xarray/core/merge.py") == [
        "xarray/core/merge.py"]
    assert names.resolve_path("/usr/lib/dist-packages/_pytest/python.py") == [
        "src/_pytest/python.py"]
    # A bare file name means every file of that name.
    assert names.resolve_path("merge.py") == ["docs/merge.py", "xarray/core/merge.py"]
    # One shared component of a longer path is another file, not this one.
    assert names.resolve_path("other/place/merge.py") == []
    assert names.resolve_module("xarray.core.dataset.Dataset") == [
        ("xarray/core/dataset.py", ["Dataset"])]


def test_symbols_resolve_qualified_and_bare(names: RepoNames) -> None:
    assert names.symbol_docs("Dataset.merge") == [1]
    assert names.symbol_docs("ds.merge") == [1]  # a lower-case qualifier is a variable
    assert names.symbol_docs("coerce_pandas_values") == [2]
    assert names.symbol_docs("nothing_like_this") == []


def test_evidence_ranks_the_frame_line_first(names: RepoNames) -> None:
    ev = Evidence.resolve(extract_refs(ISSUE), names)
    ranked = sorted(ev.scores, key=lambda i: -ev.scores[i])
    # Frame file + line + function beats frame file alone; unrelated files get nothing.
    assert ranked[0] in (1, 2)
    assert set(ranked[:2]) == {1, 2}
    assert ev.scores[1] > ev.scores[0] and ev.scores[2] > ev.scores[3]
    assert 4 not in ev.scores and 5 not in ev.scores
    assert "xarray/core/merge.py" in ev.matched["frames"]


def test_lexical_terms_leave_out_prose_stop_words() -> None:
    from retrieval.search.query import lexical_terms

    terms = lexical_terms("The session is closed if is_valid() fails. If x IN y")
    assert "the" not in terms and terms.count("is") == 1  # the part of `is_valid` stays
    assert terms[:4] == ["session", "closed", "is_valid", "is"]
    assert "if" not in terms and terms[-3:] == ["x", "in", "y"]  # capitals stay


def test_lexical_terms_weigh_code_words() -> None:
    from retrieval.search.query import lexical_terms

    text = "Calling `fit` breaks in\n    model.fit(raw_data)\nwhen data is raw"
    once = lexical_terms(text)
    assert len(once) == len(set(once))
    twice = lexical_terms(text, code_weight=2)
    assert twice.count("fit") == 2 and twice.count("raw_data") == 2
    assert twice.count("calling") == 1 and twice.count("breaks") == 1
