"""miyamoto.config.values: each option parser alone, at the edges of what it takes (the
bound itself, one past it), what it gives back (normalised, stripped) and what its error
says (the form expected, the text given cut short, never a secret)."""

from __future__ import annotations

import base64

import pytest

from miyamoto.config import values as v


def _error(parse, text) -> str:
    with pytest.raises(ValueError) as info:
        parse(text)
    return str(info.value)


def test_given_quotes_the_text_and_cuts_it_at_40_characters():
    assert _error(v.int_ge(1), " x ") == "must be a whole number >= 1, not 'x'"
    exact = "a" * 38  # quoted: 40 characters, kept whole
    assert _error(v.int_ge(1), exact).endswith(f"not '{exact}'")
    long = "b" * 39  # quoted: 41, cut to 37 and an ellipsis
    assert _error(v.int_ge(1), long).endswith("not '" + "b" * 36 + "...")


def test_float_ge_takes_its_bound_and_nothing_below_nor_infinite():
    parse = v.float_ge(0.5)
    assert parse.metavar == "SECONDS"
    assert parse(" 0.5 ") == 0.5 and parse("2") == 2.0 and parse("1e3") == 1000.0
    for bad in ("0.49", "-1", "nan", "inf", "-inf", "soon", ""):
        assert _error(parse, bad).startswith("must be a number >= 0.5, not "), bad
    assert v.float_ge(0)("0") == 0.0 and v.float_ge(0)("-0") == 0.0


def test_int_ge_takes_its_bound_and_nothing_below():
    parse = v.int_ge(2)
    assert parse.metavar == "N"
    assert parse(" 2 ") == 2 and parse("30") == 30
    assert _error(parse, "1") == "must be a whole number >= 2, not 1"
    assert _error(parse, "2.0") == "must be a whole number >= 2, not '2.0'"


@pytest.mark.parametrize("text", ["1", "true", " TRUE ", "yes", "On"])
def test_boolean_true(text):
    assert v.boolean(text) is True


@pytest.mark.parametrize("text", ["0", "false", "No", " off "])
def test_boolean_false(text):
    assert v.boolean(text) is False


def test_boolean_says_the_forms_it_takes():
    assert _error(v.boolean, "maybe") == \
        "must be true or false (or 1/0, yes/no, on/off), not 'maybe'"
    assert v.boolean.metavar == "BOOL"


def test_hostport_normalises_the_port_and_keeps_the_last_colon_for_it():
    assert v.hostport(" 127.0.0.1:0080 ") == "127.0.0.1:80"
    assert v.hostport("[::1]:8088") == "[::1]:8088"
    assert v.hostport("h:0") == "h:0" and v.hostport("h:65535") == "h:65535"
    for bad in ("h:65536", "h", ":80", "h:", "h:-1", "h:8o"):
        assert _error(v.hostport, bad).startswith("must be HOST:PORT, e.g. 127.0.0.1:8088"), bad


def test_zmq_endpoint_wants_tcp_and_a_host_and_port():
    assert v.zmq_endpoint(" tcp://10.0.0.1:6000 ") == "tcp://10.0.0.1:6000"
    for bad in ("udp://h:1", "h:1", "tcp://h", "tcp://h:70000", "xtcp://h:1"):
        assert _error(v.zmq_endpoint, bad) == \
            f"must be tcp://HOST:PORT, e.g. tcp://127.0.0.1:6000, not {bad!r}", bad


def test_seeds_split_on_commas_and_skip_blanks():
    assert v.seeds("tcp://a:1, ,tcp://b:2,") == ("tcp://a:1", "tcp://b:2")
    assert v.seeds("") == ()
    with pytest.raises(ValueError, match="tcp://HOST:PORT"):
        v.seeds("tcp://a:1,b:2")


def test_level_is_upper_cased_and_one_of_five():
    assert [v.level(x) for x in (" debug", "Info", "WARNING", "error", "critical")] == \
        ["DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"]
    assert _error(v.level, "loud") == \
        "must be debug, info, warning, error or critical, not 'loud'"
    with pytest.raises(ValueError):
        v.level("warn")


def test_one_of_and_log_format():
    assert v.one_of(" Fast ", ("fast", "safe")) == "fast"
    assert _error(lambda t: v.one_of(t, ("fast", "safe")), "x") == "must be fast or safe, not 'x'"
    assert v.log_format(" JSON ") == "json" and v.log_format("text") == "text"
    assert _error(v.log_format, "xml") == "must be text or json, not 'xml'"


def test_node_id_at_most_200_bytes_printable_without_separators():
    assert v.node_id(" a-1 ") == "a-1"
    assert v.node_id("x" * 200) == "x" * 200
    assert v.node_id("é" * 100) == "é" * 100  # 200 bytes
    for bad in ("x" * 201, "é" * 101, "a b", "a,b", "a/b", "a\tb", "a\x00b"):
        assert _error(v.node_id, bad).startswith("must be at most 200 printable"), bad


def _whsec(n: int) -> str:
    return "whsec_" + base64.b64encode(b"k" * n).decode()


def test_secret_takes_24_to_64_bytes_and_numbers_the_bad_entry():
    lo, hi = v.WEBHOOK_KEY_BYTES
    assert (lo, hi) == (24, 64)
    assert v.secret(f"{_whsec(24)},{_whsec(64)}") == (_whsec(24), _whsec(64))
    assert v.secret(" ") == ()
    assert _error(v.secret, f"{_whsec(24)} {_whsec(23)}") == "entry 2 must decode to 24-64 bytes, not 23"
    assert _error(v.secret, _whsec(65)) == "entry 1 must decode to 24-64 bytes, not 65"
    assert _error(v.secret, f"{_whsec(30)} plain") == \
        "entry 2 must start with whsec_ (Standard Webhooks secret)"
    assert _error(v.secret, "whsec_***") == "entry 1 is not whsec_ followed by base64"


def test_z85_key_drops_one_pair_of_matching_quotes():
    key = "a" * 40
    assert v.z85_key(f" {key} ") == key
    assert v.z85_key(f'"{key}"') == key and v.z85_key(f"'{key}'") == key
    assert v.z85_key("") == "" and v.z85_key('""') == ""
    for bad in (f"'{key}\"", f"x{key}x", "a" * 39, "a" * 41, f"'{key}", "'"):
        assert _error(v.z85_key, bad).startswith("must be a 40-character Z85"), bad


def test_cidrs_are_normalised_and_a_bad_one_is_named():
    assert v.cidrs("10.1.2.3/8, ,fd00::1/8,192.168.0.1") == \
        ("10.0.0.0/8", "fd00::/8", "192.168.0.1/32")
    assert v.cidrs("") == ()
    assert _error(v.cidrs, "10.0.0.0/8,nope") == "'nope' is not an address or CIDR block"


def test_parse_tokens_scopes_and_token_lengths():
    t16, t512 = "t" * 16, "t" * 512
    assert v.parse_tokens(f" read:{t16} ,, admin:{t512},enqueue:{t16}") == \
        (("read", t16), ("admin", t512), ("enqueue", t16))
    assert v.parse_tokens("") == ()
    scope = "must be SCOPE:TOKEN with SCOPE one of admin, enqueue, read"
    assert _error(v.parse_tokens, f"read:{t16},{t16}") == f"entry 2 {scope}"
    assert _error(v.parse_tokens, f"root:{t16}") == f"entry 1 {scope}"
    short = "entry 1: a token is 16-512 printable characters, no spaces"
    for bad in ("t" * 15, "t" * 513, "t" * 8 + " " + "t" * 8, "t" * 16 + "\x01"):
        assert _error(v.parse_tokens, f"read:{bad}") == short, bad


@pytest.mark.parametrize("fn", [v.issuer_url, v.public_url])
def test_an_issuer_or_public_url_is_http_s_with_a_host_and_no_query(fn) -> None:
    assert fn(" https://id.example.com/base/ ") == "https://id.example.com/base"
    assert fn("http://127.0.0.1:8080") == "http://127.0.0.1:8080" and fn("  ") == ""
    for bad in ("ftp://id.example.com", "https://", "https://h/?a=1", "https://h/#f",
                "https://h/\u00e9", "https://h/a b", "id.example.com"):
        with pytest.raises(ValueError, match="must be"):
            fn(bad)


def test_a_public_url_port_must_be_a_port() -> None:
    for bad in ("http://h:99999", "http://h:x/"):
        with pytest.raises(ValueError, match=r"its port is not a port"):
            v.public_url(bad)


def test_a_proxy_is_http_host_port_and_a_refusal_never_repeats_it() -> None:
    assert v.proxy_url(" http://u:pw@proxy.local:3128/ ") == "http://u:pw@proxy.local:3128/"
    assert v.proxy_url("http://10.0.0.1:8080") == "http://10.0.0.1:8080"
    assert v.proxy_url("") == "" and v.proxy_url("   ") == ""
    for bad in ("http://proxy.local", "http://u:secretpw@proxy.local:99999",
                "https://proxy.local:3128", "http://:3128", "http://proxy.local:3128/x",
                "http://proxy.local:3128/?a", "http://proxy.local:3128/#f",
                "http://proxy.local:x"):
        with pytest.raises(ValueError) as e:
            v.proxy_url(bad)
        assert "HTTP CONNECT proxy" in str(e.value) and "secretpw" not in str(e.value)


def test_a_signing_key_is_16_to_200_characters() -> None:
    for ok in ("s" * 16, "s" * 200, ""):
        assert v.signing_key(ok) == ok
    for bad in ("s" * 15, "s" * 201, "sig_with a space_x", "sig_\u00e9" * 5):
        with pytest.raises(ValueError, match="16-200 printable ASCII") as e:
            v.signing_key(bad)
        assert bad not in str(e.value)
