"""The form parser of the enqueue path (``formdata.form_pairs``) is ``parse_qsl`` with the
options the API used, made cheaper: it must agree with it on every input, errors included."""

from __future__ import annotations

from urllib.parse import parse_qsl

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from miyamoto.tasks import formdata
from miyamoto.tasks.validate import MAX_FORM_FIELDS

pytestmark = pytest.mark.timeout(60)


def _outcome(fn, text):
    try:
        return fn(text)
    except (ValueError, UnicodeDecodeError) as e:
        return type(e)


def _form_pairs(text):
    return formdata.form_pairs(text, MAX_FORM_FIELDS)


def _reference(text):
    return parse_qsl(text, keep_blank_values=True, max_num_fields=MAX_FORM_FIELDS,
                     errors="strict")


@settings(max_examples=3000, deadline=None)
@given(st.lists(st.sampled_from(list("ab=&+% 0F2e8acé") + ["%e2%82%ac", "%ff", "%41"]),
                max_size=30).map("".join))
def test_agrees_with_parse_qsl(text):
    assert _outcome(_form_pairs, text) == _outcome(_reference, text)
    assert _outcome(_form_pairs, text) == _outcome(_reference, text)  # again, from the cache


def test_the_field_cap_and_the_cache_bound():
    at_cap = "&".join(["a=1"] * MAX_FORM_FIELDS)
    assert len(_form_pairs(at_cap)) == MAX_FORM_FIELDS
    with pytest.raises(ValueError):
        _form_pairs(at_cap + "&b=2")
    for i in range(formdata._MAX_UNQUOTED + 10):
        _form_pairs(f"k=%41{i}")
    _form_pairs("k=" + "%41" * 1000)
    assert len(formdata._UNQUOTED) <= formdata._MAX_UNQUOTED
    assert all(len(k) <= formdata._MAX_UNQUOTED_LEN for k in formdata._UNQUOTED)
