"""The keys targets check the caller by: their text forms parsed, and the options that
carry them refused at start naming the option, never quoting a key."""

from __future__ import annotations

import base64
import os

import pytest
from cryptography.hazmat.primitives import serialization

from keymaker import ED_SEED, ec_pem, ed_key, ed_pem, public_pem, rsa_key, rsa_pem, whsk
from miyamoto.config import keys
from miyamoto.config import settings as config_mod
from miyamoto.config.settings import ConfigError

ISSUER = "https://tasks.example.com"


def test_oidc_keys_rsa_is_rs256_p256_is_es256():
    assert keys.algorithm(keys.oidc_private_key(rsa_pem())) == "RS256"
    assert keys.algorithm(keys.oidc_private_key(ec_pem())) == "ES256"


def test_a_pem_survives_an_ini_value_or_an_env_var_that_lost_its_newlines():
    pem = rsa_pem()
    body = pem.strip().splitlines()
    one_line = " ".join(body)  # a newline-less environment variable
    indented = "\n  ".join(body)  # as a file's continuation lines after configparser
    for text in (one_line, indented, "\n" + pem + "\n"):
        assert keys.oidc_private_key(text).private_numbers().d == rsa_key().private_numbers().d


@pytest.mark.parametrize("text,why", [
    ("", "one PEM block"),
    ("not a key", "one PEM block"),
    ("-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----", "not a readable"),
    (rsa_pem() + rsa_pem(1), "one PEM block"),
    (ec_pem("p384"), "P-256"),
    (ed_pem(), r"RSA \(RS256\) or EC P-256"),
])
def test_a_bad_oidc_signing_key_says_why_without_quoting_it(text, why):
    with pytest.raises(ValueError, match=why) as e:
        keys.oidc_private_key(text)
    assert "MII" not in str(e.value)


def test_a_small_rsa_key_is_refused():
    with pytest.raises(ValueError, match="at least 2048 bits, not 1024"):
        keys.oidc_private_key(rsa_pem(bits=1024))


def test_an_encrypted_key_is_refused_asking_for_it_unencrypted():
    pem = rsa_key().private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                  serialization.BestAvailableEncryption(b"pw")).decode()
    with pytest.raises(ValueError, match="encrypted"):
        keys.oidc_private_key(pem)


def test_previous_public_keys_are_one_block_after_another():
    two = public_pem(rsa_key(1)) + public_pem(rsa_key(2))
    assert len(keys.oidc_public_keys(two)) == 2
    with pytest.raises(ValueError, match="block 2: an EC key must be on P-256"):
        from keymaker import ec_key
        keys.oidc_public_keys(public_pem(rsa_key(1)) + public_pem(ec_key("p384")))
    with pytest.raises(ValueError, match="must hold PEM public keys"):
        keys.oidc_public_keys("nothing")
    garbled = "-----BEGIN PUBLIC KEY-----\nbm90IGEga2V5\n-----END PUBLIC KEY-----\n"
    with pytest.raises(ValueError, match="^block 2 is not a readable PEM public key$"):
        keys.oidc_public_keys(public_pem(rsa_key(1)) + garbled)


def test_ed25519_key_as_whsk_seed_whsk_with_public_key_or_pem():
    want = keys.public_raw(ed_key().public_key())
    for text in (whsk(), whsk(with_public=True), ed_pem()):
        assert keys.public_raw(keys.ed25519_private_key(text).public_key()) == want
    assert keys.whpk(ed_key().public_key()) == "whpk_" + base64.b64encode(want).decode()


@pytest.mark.parametrize("text,why", [
    ("whsk_***", "not whsk_ followed by base64"),
    ("whsk_" + base64.b64encode(b"x" * 31).decode(), "32 or 64 bytes, not 31"),
    ("whsk_" + base64.b64encode(ED_SEED + b"\0" * 32).decode(), "not the public key"),
    (rsa_pem(), "must be an Ed25519 key"),
    ("whsec_abc", "whsk_<base64> or a PEM"),
    ("-----BEGIN PRIVATE KEY-----\nbm90IGEga2V5\n-----END PRIVATE KEY-----\n",
     "is not a readable PEM private key"),
])
def test_a_bad_ed25519_key_says_why(text, why):
    with pytest.raises(ValueError, match=why):
        keys.ed25519_private_key(text)


def load(env: dict, ini: str = "", tmp=None) -> config_mod.Config:
    path = None
    if ini:
        path = os.path.join(tmp, "m.ini")
        with open(path, "w") as f:
            f.write(ini)
    return config_mod.load(path, env=env)


def env(**kw: str) -> dict[str, str]:
    return {"MIYAMOTO_" + k.upper(): v for k, v in kw.items()}


def test_config_takes_the_oidc_and_ed25519_options_from_env_files_and_the_ini(tmp_path):
    pem = tmp_path / "oidc.pem"
    pem.write_text(rsa_pem())
    old = tmp_path / "old.pem"
    old.write_text(public_pem(rsa_key(1)))
    c = load({"MIYAMOTO_OIDC_ISSUER": ISSUER + "/", "MIYAMOTO_OIDC_SIGNING_KEY_FILE": str(pem),
              "MIYAMOTO_OIDC_PREVIOUS_PUBLIC_KEY_FILE": str(old),
              "MIYAMOTO_ED25519_SIGNING_KEY": whsk()})
    assert c.oidc_issuer == ISSUER  # the trailing / dropped: ISSUER/.well-known/... joins
    assert c.oidc_signing_key == rsa_pem().strip() and c.ed25519_signing_key == whsk()
    red = c.redacted()
    assert red["oidc_signing_key"] == red["ed25519_signing_key"] == "***"
    indented = "\n  ".join(rsa_pem().strip().splitlines())
    ini = (f"[miyamoto]\noidc_issuer = {ISSUER}\noidc_signing_key = {indented}\n"
           "[queue:calls]\noidc_audience = https://worker.example/hook\nsignature = none\n")
    c = load({}, ini, tmp_path)
    q = c.queue("calls")
    assert (q.oidc_audience, q.signature) == ("https://worker.example/hook", "none")
    assert (c.queue("other").oidc_audience, c.queue("other").signature) == ("", "auto")


@pytest.mark.parametrize("options,message", [
    (dict(oidc_issuer=ISSUER), "^oidc_signing_key: oidc_issuer needs the key"),
    (dict(oidc_signing_key="x"), "^oidc_issuer: oidc_issuer and oidc_signing_key go together"),
    (dict(oidc_issuer="ftp://x", oidc_signing_key="x"), "^oidc_issuer: must be an http"),
    (dict(oidc_issuer=ISSUER + "?a=1", oidc_signing_key="x"), "^oidc_issuer: must be an http"),
    (dict(oidc_issuer=ISSUER, oidc_signing_key="junk"), "^oidc_signing_key: must be one PEM"),
    (dict(oidc_previous_public_key=public_pem(rsa_key(1))),
     "^oidc_previous_public_key: needs oidc_signing_key"),
    (dict(oidc_issuer=ISSUER, oidc_signing_key=rsa_pem(), oidc_previous_public_key="x"),
     "^oidc_previous_public_key: must hold PEM public keys"),
    (dict(ed25519_signing_key="whsk_abc"), "^ed25519_signing_key: "),
])
def test_a_bad_identity_option_fails_the_start_naming_it(options, message):
    with pytest.raises(ConfigError, match=message) as e:
        load(env(**options))
    assert "MII" not in str(e.value) and "whsk_abc" not in str(e.value)


@pytest.mark.parametrize("section,message", [
    ("oidc_audience = https://w/h", "^queue:q.oidc_audience: needs oidc_signing_key"),
    ("oidc_audience = a b", "^queue:q.oidc_audience: must be 1-2083 printable"),
    ("signature = ed25519", "^queue:q.signature: ed25519 needs ed25519_signing_key"),
    ("signature = both", "^queue:q.signature: both needs signing_secret"),
    ("signature = hmac", "^queue:q.signature: hmac needs signing_secret"),
    ("signature = rsa", "^queue:q.signature: must be auto or hmac or ed25519 or both or none"),
])
def test_a_queue_that_asks_for_a_scheme_without_its_key_fails_the_start(tmp_path, section, message):
    with pytest.raises(ConfigError, match=message):
        load({}, f"[queue:q]\n{section}\n", tmp_path)


def test_the_serve_command_exits_2_naming_the_bad_key(tmp_path):
    import subprocess
    import sys

    run = subprocess.run([sys.executable, "-c", "import sys; from miyamoto.cli.main import main; "
                          "sys.exit(main(['serve']))"],
                         env={**os.environ, "MIYAMOTO_ED25519_SIGNING_KEY": "whsk_nope",
                              "MIYAMOTO_DATA_DIR": str(tmp_path)},
                         capture_output=True, text=True, timeout=60)
    assert run.returncode == 2
    assert "ed25519_signing_key" in run.stderr and "whsk_nope" not in run.stderr
