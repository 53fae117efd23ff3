"""API key format and verification (pure)."""

from __future__ import annotations

import ast

from shared.accounts import apikeys
from tests.conftest import ROOT


def test_generated_key_parses_and_verifies() -> None:
    """A new key splits into its id and secret, and the secret matches the stored hash."""
    key = apikeys.generate()
    parsed = apikeys.parse(key.plaintext)

    assert parsed is not None
    assert parsed[0] == key.key_id
    assert apikeys.verify(parsed[1], key.secret_hash)


def test_plaintext_is_not_derivable_from_what_is_stored() -> None:
    """Only the id and the SHA-256 of the secret are stored; the secret is not in them."""
    key = apikeys.generate()
    parsed = apikeys.parse(key.plaintext)
    assert parsed is not None
    secret = parsed[1]  # the secret may itself contain "_": never split the key by hand

    assert secret.encode() not in key.secret_hash
    assert len(key.secret_hash) == 32


def test_wrong_secret_fails() -> None:
    """Changing one character of the secret fails verification."""
    key = apikeys.generate()
    _key_id, secret = apikeys.parse(key.plaintext)  # type: ignore[misc]
    wrong = ("A" if secret[0] != "A" else "B") + secret[1:]

    assert not apikeys.verify(wrong, key.secret_hash)


def test_malformed_keys_do_not_parse() -> None:
    """Keys without the prefix, id or secret shape are refused before any lookup."""
    for bad in ["", "sd_live_", "ghp_abc", "sd_live_abc_def", "sd_live_" + "a" * 12 + "_x"]:
        assert apikeys.parse(bad) is None


def test_digests_are_never_compared_with_equals() -> None:
    """No `==`/`!=` next to a hash or digest in the auth code: compare_digest only."""
    for path in [
        "shared/accounts/apikeys.py",
        "shared/accounts/accounts.py",
        "services/api/auth.py",
    ]:
        tree = ast.parse((ROOT / path).read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.Compare) and any(
                isinstance(op, ast.Eq | ast.NotEq) for op in node.ops
            ):
                names = ast.dump(node).lower()
                assert "hash" not in names and "digest" not in names and "secret" not in names, (
                    f"{path}:{node.lineno} compares a secret with =="
                )
