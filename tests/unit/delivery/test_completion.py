"""The completion token and report of a long task (miyamoto/delivery/completion.py)."""

from __future__ import annotations

import pytest

from miyamoto.delivery import completion as c

pytestmark = pytest.mark.timeout(10)

KEY = c.derive_key(b"a secret every node shares")
NOW = 1_000_000.0


def test_a_minted_token_verifies_for_its_attempt():
    tok = c.mint(KEY, "t1", 0, 3, NOW + 300)
    assert c.verify(KEY, "t1", tok, NOW) == c.Grant("t1", 0, 3, NOW + 300)


@pytest.mark.parametrize("task_id,key", [("t2", KEY), ("t1", c.derive_key(b"another"))])
def test_a_token_for_another_task_or_key_is_refused(task_id, key):
    tok = c.mint(KEY, "t1", 0, 1, NOW + 300)
    with pytest.raises(c.TokenError, match="not valid"):
        c.verify(key, task_id, tok, NOW)


def test_a_token_whose_attempt_is_changed_is_refused():
    run, attempt, exp, mac = c.mint(KEY, "t1", 0, 1, NOW + 300).split(".")
    with pytest.raises(c.TokenError, match="not valid"):
        c.verify(KEY, "t1", ".".join([run, "2", exp, mac]), NOW)
    with pytest.raises(c.TokenError, match="not valid"):  # a longer expiry is forged too
        c.verify(KEY, "t1", ".".join([run, attempt, str(int(exp) + 1), mac]), NOW)


def test_an_expired_token_is_refused():
    tok = c.mint(KEY, "t1", 0, 1, NOW + 10)
    with pytest.raises(c.TokenError, match="expired"):
        c.verify(KEY, "t1", tok, NOW + 10)


@pytest.mark.parametrize("tok", ["", "x", "1.2.3", "a.b.c.d", "1.2.3.4.5", "1" * 13 + ".1.1.x"])
def test_a_malformed_token_is_refused_without_the_key_in_the_error(tok):
    with pytest.raises(c.TokenError) as e:
        c.verify(KEY, "t1", tok, NOW)
    assert KEY.hex() not in str(e.value)


def test_fields_of_up_to_twelve_digits_verify():
    tok = c.mint(KEY, "t1", 999_999_999_999, 999_999_999_999, 999_999_999_999)
    assert c.verify(KEY, "t1", tok, NOW).run == 999_999_999_999
    longer = c.mint(KEY, "t1", 10**12, 1, NOW + 300)  # signed, but 13 digits: refused
    with pytest.raises(c.TokenError, match="malformed"):
        c.verify(KEY, "t1", longer, NOW)


def test_the_url_carries_the_token():
    assert c.url("http://n:8088/", "t1", "0.1.2.m") == \
        "http://n:8088/tasks/t1/complete?token=0.1.2.m"


def test_a_report_is_a_state_and_a_bounded_result():
    assert c.parse_report({"state": "succeeded", "result": {"n": 1}}) == \
        c.Report("succeeded", {"n": 1})
    assert c.parse_report({"state": "failed"}) == c.Report("failed")
    for body, field in [([], "body"), ({"state": "done"}, "state"),
                        ({"state": "failed", "x": 1}, "x"),
                        ({"state": "failed", "result": "r" * 5000}, "result")]:
        with pytest.raises(c.ReportError) as e:
            c.parse_report(body)
        assert e.value.field == field

