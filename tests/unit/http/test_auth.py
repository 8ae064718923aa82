"""API tokens and their scopes (``miyamoto.http.auth``): which token may use which route,
and what a refusal says (never the token). The routes' own needs: test_api.py."""

from __future__ import annotations

import pytest

from miyamoto.http import auth
from miyamoto.http.auth import ADMIN, ENQUEUE, OPEN, READ, TASK, Denied, Tokens

pytestmark = pytest.mark.timeout(10)

A, E, R = "admin-token-aaaaaaaaaaaa", "enqueue-token-eeeeeeeeee", "read-token-rrrrrrrrrrrr"
TOKENS = Tokens([(ADMIN, A), (ENQUEUE, E), (READ, R)])


def test_scopes_widest_first() -> None:
    assert (ADMIN, ENQUEUE, READ) == ("admin", "enqueue", "read")


def test_the_scope_of_a_bearer_token() -> None:
    assert TOKENS.scope_of(f"Bearer {A}") == ADMIN
    assert TOKENS.scope_of(f"bearer {E}") == ENQUEUE
    assert TOKENS.scope_of(f"  BEARER   {R}  ") == READ
    for bad in (None, "", f"Basic {A}", "Bearer", "Bearer   ", f"Bearer {A}x", A,
                f"Token {A}"):
        assert TOKENS.scope_of(bad) is None, bad


def test_the_first_entry_of_a_token_listed_twice_wins() -> None:
    twice = Tokens([(READ, R), (ADMIN, R)])
    assert twice.scope_of(f"Bearer {R}") == READ


def test_without_tokens_every_route_is_open() -> None:
    none = Tokens(())
    assert not none.enabled and TOKENS.enabled
    for need in (ADMIN, ENQUEUE, READ, TASK, OPEN):
        none.check(None, need)


@pytest.mark.parametrize("token,allowed", [
    (A, {ADMIN, ENQUEUE, READ, TASK, OPEN}), (E, {ENQUEUE, TASK, OPEN}),
    (R, {READ, TASK, OPEN})])
def test_each_scope_grants_its_routes(token: str, allowed: set[str]) -> None:
    for need in (ADMIN, ENQUEUE, READ, TASK, OPEN):
        if need in allowed:
            TOKENS.check(f"Bearer {token}", need)
        else:
            with pytest.raises(Denied) as e:
                TOKENS.check(f"Bearer {token}", need)
            assert e.value.status == 403 and token not in e.value.message
            assert "does not allow this route" in e.value.message


def test_refusals_say_which_scope_is_needed() -> None:
    with pytest.raises(Denied) as e:
        TOKENS.check(f"Bearer {R}", ADMIN)
    assert e.value.message == ("this token's scope (read) does not allow this route "
                               "(it needs admin)")
    with pytest.raises(Denied) as e:
        TOKENS.check(f"Bearer {R}", ENQUEUE)
    assert e.value.message.endswith("(it needs enqueue or admin)")
    with pytest.raises(Denied) as e:
        TOKENS.check(f"Bearer {E}", READ)
    assert e.value.message.endswith("(it needs read or admin)")


def test_no_token_or_an_unknown_one_is_401() -> None:
    TOKENS.check(None, OPEN)
    with pytest.raises(Denied) as e:
        TOKENS.check(None, TASK)
    assert e.value.status == 401 and e.value.message.endswith("is missing")
    with pytest.raises(Denied) as e:
        TOKENS.check("Bearer not-one-of-ours", READ)
    assert e.value.status == 401 and e.value.message.endswith("is not a valid API token")
    assert "not-one-of-ours" not in e.value.message


def test_a_token_that_is_not_utf8_text_is_compared_not_raised() -> None:
    assert TOKENS.scope_of("Bearer \udcff") is None
    assert auth._digest("\udcff") != auth._digest("\udcfe")
