"""One digest over the manifest (which lists every file's sha256) is checked at every load, and
with a trusted key the artifact must carry a valid ed25519 signature by that key."""

from __future__ import annotations

import json
import shutil
import subprocess

import pytest

from medusa.artifact import ArtifactError, load_artifact, sign_artifact
from medusa.artifact.seal import Seal
from tests.artifact.conftest import edit_manifest, manifest_of, medusa

# Starts processes (see pyproject.toml's e2e marker): not in the fast subset.
pytestmark = pytest.mark.e2e


def test_a_changed_kv_block_count_fails_verify(art):
    edit_manifest(art, lambda m: m["kv"].update(num_blocks=m["kv"]["num_blocks"] + 1), reseal=False)
    res = medusa("verify", str(art))
    assert res.returncode == 1
    assert "the manifest's digest is not the one sealed in it" in res.stderr


def test_verify_and_inspect_print_the_digest_and_signer(art, key):
    digest = json.loads((art / "seal.json").read_text())["digest"]
    res = medusa("verify", str(art), "--trust", f"{key}.pub")
    assert res.returncode == 0, res.stderr
    assert f"digest sha256:{digest}" in res.stdout and "(trusted)" in res.stdout
    res = medusa("inspect", str(art))
    assert f"digest    sha256:{digest}" in res.stdout
    assert "signed    by ed25519:" in res.stdout


def test_trust_refuses_an_unsigned_artifact(art, key):
    (art / "seal.json").write_text(Seal.make(manifest_of(art)).to_json())
    assert load_artifact(art).signer is None  # without --trust, unsigned is fine
    res = medusa("verify", str(art), "--trust", f"{key}.pub")
    assert res.returncode == 1
    assert "not signed, and --trust" in res.stderr


def test_trust_refuses_another_key(art, tmp_path):
    other = tmp_path / "other"
    assert medusa("keygen", str(other)).returncode == 0
    with pytest.raises(ArtifactError, match="not by the trusted"):
        load_artifact(art, trust=f"{other}.pub")
    sign_artifact(art, other)  # re-signing with the other key makes it that key's
    assert load_artifact(art, trust=f"{other}.pub").signer is not None


def test_a_resealed_manifest_keeps_no_valid_signature(art, key):
    """Whoever can write the directory can fix the digest, but not the signature."""
    seal = json.loads((art / "seal.json").read_text())
    edit_manifest(art, lambda m: m["kv"].update(num_blocks=1))
    resealed = json.loads((art / "seal.json").read_text())
    resealed["signature"] = seal["signature"]
    (art / "seal.json").write_text(json.dumps(resealed))
    load_artifact(art)  # consistent digest, signature unchecked
    with pytest.raises(ArtifactError, match="does not match the artifact"):
        load_artifact(art, trust=f"{key}.pub")


def test_a_missing_seal_is_refused(art):
    (art / "seal.json").unlink()
    with pytest.raises(ArtifactError, match=r"seal\.json: missing"):
        load_artifact(art)


@pytest.mark.skipif(shutil.which("openssl") is None, reason="no openssl")
def test_openssl_keys_work_too(art, tmp_path):
    key, pub = tmp_path / "k.pem", tmp_path / "k.pub.pem"
    subprocess.run(["openssl", "genpkey", "-algorithm", "ed25519", "-out", key], check=True)
    subprocess.run(["openssl", "pkey", "-in", key, "-pubout", "-out", pub], check=True)
    sign_artifact(art, key)
    assert load_artifact(art, trust=pub).signer is not None


def test_keygen_refuses_to_overwrite_a_key(key):
    res = medusa("keygen", str(key))
    assert res.returncode == 1 and "exists" in res.stderr


def test_signing_never_writes_through_a_link_planted_in_the_artifact(art, key, tmp_path):
    victim = tmp_path / "victim"
    victim.write_text("precious")
    for name in (".seal.json.tmp", "seal.json.tmp"):
        (art / name).symlink_to(victim)
    signed = sign_artifact(art, key)
    assert signed.signer is not None and victim.read_text() == "precious"
    assert load_artifact(art, trust=f"{key}.pub").signer == signed.signer


def test_keygen_never_overwrites_and_leaves_no_half_pair(tmp_path):
    victim = tmp_path / "victim"
    victim.write_text("precious")
    (tmp_path / "k.pub").symlink_to(victim)
    res = medusa("keygen", str(tmp_path / "k"))
    assert res.returncode == 1 and f"{tmp_path / 'k.pub'} exists" in res.stderr
    assert victim.read_text() == "precious" and not (tmp_path / "k").exists()
