"""The token of the Ray cluster `--cluster ray` starts on this machine (see private_token)."""

from __future__ import annotations

import os
import secrets

from medusa.serve.gateway.private_dir import PrivateDir

AUTH_MODE = "RAY_AUTH_MODE"


def _tokens_by_default() -> bool:
    """Whether this Ray turns token authentication on for a cluster ray.init() starts."""
    try:
        from ray._private.authentication import authentication_token_setup as setup
    except ImportError:
        return False
    return hasattr(setup, "enable_token_auth_by_default")


def private_token() -> PrivateDir | None:
    """Before a one-node cluster is started here: it listens on every interface, and whoever
    joins it runs code as this user, so it must ask for a token (Ray's token authentication),
    one nobody else can read (Ray's own default, ~/.ray/auth_token, is made mode 644). The
    token's private directory (None: the user gave a token); ValueError without token auth."""
    import ray

    mode = os.environ.get(AUTH_MODE, "")
    if mode.lower() != "token" and not (mode == "" and _tokens_by_default()):
        raise ValueError(
            f"--cluster ray starts a Ray cluster that listens on every interface; without "
            f"token authentication ({AUTH_MODE}={mode or 'unset'}, ray {ray.__version__}) "
            "anyone who reaches it runs code as this user: use a ray that asks for a token "
            f"by default (2.60), or set {AUTH_MODE}=token, or start the cluster yourself on "
            "a private network and give --cluster ray://HOST:PORT"
        )
    if os.environ.get("RAY_AUTH_TOKEN") or os.environ.get("RAY_AUTH_TOKEN_PATH"):
        return None  # the user's own token
    where = PrivateDir()
    path = where.path / "ray-auth-token"
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    with os.fdopen(os.open(path, flags, 0o600), "w") as f:
        f.write(secrets.token_hex(32))
    # NOTE: Ray reads it from the environment, in this process and those it starts.
    os.environ["RAY_AUTH_TOKEN_PATH"] = str(path)
    return where
