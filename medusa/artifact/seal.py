"""The artifact's seal: one digest over the manifest (which holds every file's sha256), and an
optional ed25519 signature of that digest. It lies beside the manifest in seal.json."""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from medusa.artifact.errors import ArtifactError
from medusa.artifact.schema import HEX64, Const, Obj, Str

SIGNED_PREFIX = b"medusa artifact digest v1\n"
SEAL_SCHEMA = Obj(
    {
        "digest": Str(HEX64),
        "signature?": Obj(
            {
                "algorithm": Const(("ed25519",)),
                "public_key": Str(HEX64),
                "value": Str(max_len=128),
            }
        ),
    }
)


def canonical(manifest: dict[str, Any]) -> bytes:
    return json.dumps(
        manifest, sort_keys=True, separators=(",", ":"), ensure_ascii=True, allow_nan=False
    ).encode()


def manifest_digest(manifest: dict[str, Any]) -> str:
    """sha256 of the canonical manifest: it lists every file's sha256, so it covers them all."""
    return hashlib.sha256(canonical(manifest)).hexdigest()


def key_id(public_key: bytes) -> str:
    """A short name for a public key, as `medusa inspect` and errors print it."""
    return "ed25519:" + hashlib.sha256(public_key).hexdigest()[:16]


@dataclass(frozen=True)
class Seal:
    digest: str
    public_key: bytes | None = None  # the key that signed it; None: unsigned
    signature: bytes | None = None

    @classmethod
    def make(cls, manifest: dict[str, Any], key_file: str | Path | None = None) -> Seal:
        digest = manifest_digest(manifest)
        if key_file is None:
            return cls(digest)
        from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

        key = load_private_key(key_file)
        pub = key.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)
        return cls(digest, pub, key.sign(SIGNED_PREFIX + digest.encode()))

    def to_json(self) -> str:
        out: dict[str, Any] = {"digest": self.digest}
        if self.public_key is not None and self.signature is not None:
            out["signature"] = {
                "algorithm": "ed25519",
                "public_key": self.public_key.hex(),
                "value": self.signature.hex(),
            }
        return json.dumps(out, indent=2) + "\n"

    @classmethod
    def parse(cls, text: bytes, where: str) -> Seal:
        try:
            obj = json.loads(text)
            SEAL_SCHEMA.check(obj, "")
            sig = obj.get("signature")
            if sig is None:
                return cls(obj["digest"])
            return cls(obj["digest"], bytes.fromhex(sig["public_key"]), bytes.fromhex(sig["value"]))
        except (ValueError, RecursionError) as e:
            raise ArtifactError(
                f"{where}: not a seal this medusa wrote ({e}); materialize again"
            ) from None

    def check(self, manifest: dict[str, Any], trust: str | Path | None, where: str) -> None:
        """The digest matches the manifest; with `trust` (a public key file), the artifact is
        signed by that key."""
        if manifest_digest(manifest) != self.digest:
            raise ArtifactError(
                f"{where}: the manifest's digest is not the one sealed in it (the manifest was "
                "changed after it was written); materialize again"
            )
        if trust is None:
            return
        want = load_public_key(trust)
        if self.public_key is None or self.signature is None:
            raise ArtifactError(
                f"{where}: not signed, and --trust {trust} requires a signature by "
                f"{key_id(want)} (sign it: medusa materialize --sign KEY)"
            )
        if self.public_key != want:
            raise ArtifactError(
                f"{where}: signed by {key_id(self.public_key)}, not by the trusted "
                f"{key_id(want)} ({trust})"
            )
        from cryptography.exceptions import InvalidSignature
        from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

        try:
            Ed25519PublicKey.from_public_bytes(want).verify(
                self.signature, SIGNED_PREFIX + self.digest.encode()
            )
        except (InvalidSignature, ValueError):
            raise ArtifactError(
                f"{where}: the signature by {key_id(want)} does not match the artifact (changed "
                "after it was signed, or forged); do not use it"
            ) from None


def load_private_key(path: str | Path) -> Any:
    """An ed25519 private key from a PEM file (PKCS#8, as `medusa keygen` or `openssl genpkey
    -algorithm ed25519` write) or a file of its 32 raw bytes."""
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
    from cryptography.hazmat.primitives.serialization import load_pem_private_key

    data = _read_key(path)
    try:
        key = (
            load_pem_private_key(data, password=None)
            if data.lstrip().startswith(b"-----BEGIN")
            else Ed25519PrivateKey.from_private_bytes(data)
        )
    except (ValueError, TypeError) as e:
        raise ArtifactError(f"{path}: not an unencrypted ed25519 private key ({e})") from None
    if not isinstance(key, Ed25519PrivateKey):
        raise ArtifactError(f"{path}: a {type(key).__name__}, not an ed25519 private key")
    return key


def load_public_key(path: str | Path) -> bytes:
    """The 32 raw bytes of an ed25519 public key from a PEM file or a file of those bytes."""
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey
    from cryptography.hazmat.primitives.serialization import (
        Encoding,
        PublicFormat,
        load_pem_public_key,
    )

    data = _read_key(path)
    if not data.lstrip().startswith(b"-----BEGIN"):
        if len(data) != 32:
            raise ArtifactError(f"{path}: not a PEM public key nor 32 raw ed25519 key bytes")
        return data
    try:
        key = load_pem_public_key(data)
    except ValueError as e:
        raise ArtifactError(f"{path}: not a public key ({e})") from None
    if not isinstance(key, Ed25519PublicKey):
        raise ArtifactError(f"{path}: a {type(key).__name__}, not an ed25519 public key")
    return key.public_bytes(Encoding.Raw, PublicFormat.Raw)


def generate_key(out: Path) -> Path:
    """Writes a new private key to `out` (PEM, readable by its owner only) and its public key to
    `out`.pub; returns the public key's path."""
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
    from cryptography.hazmat.primitives.serialization import (
        Encoding,
        NoEncryption,
        PrivateFormat,
        PublicFormat,
    )

    key = Ed25519PrivateKey.generate()
    pem = key.private_bytes(Encoding.PEM, PrivateFormat.PKCS8, NoEncryption())
    pub = Path(f"{out}.pub")
    write_new(out, pem, 0o600)
    try:
        write_new(
            pub, key.public_key().public_bytes(Encoding.PEM, PublicFormat.SubjectPublicKeyInfo)
        )
    except OSError:
        os.unlink(out)  # no private key without its public half
        raise
    return pub


def write_new(path: str | Path, data: bytes, mode: int = 0o644) -> None:
    """Creates `path` with `data`; never overwrites a file or writes through a link planted there
    (FileExistsError)."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    with os.fdopen(os.open(path, flags, mode), "wb") as f:
        f.write(data)


def _read_key(path: str | Path) -> bytes:
    try:
        with open(path, "rb") as f:
            return f.read(1 << 16)
    except OSError as e:
        raise ArtifactError(f"{path}: cannot read the key ({e.strerror})") from None
