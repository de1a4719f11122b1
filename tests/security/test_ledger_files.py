"""Issue 30, finding 3: the page ledger's files. The gateway made /dev/shm/.medusa-ledger-<pid>-
<slice>.<pid> with open(tmp, "wb"), then renamed it over /dev/shm/medusa-ledger-<pid>-<slice>,
mode 0644: a link planted there for a coming pid made the gateway (root) overwrite any file.
Now its ledgers are in a directory of its own (mkdtemp: a random name, mode 0700), written under
fresh names (O_CREAT|O_EXCL|O_NOFOLLOW, 0600): planted links are never followed, and another
user can neither read, join nor plant anything there. A worker joins only a private ledger of
its own user."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from medusa.prism.ledger import LedgerError, PageLedger
from tests.security._shm import (
    as_another_user,
    release,
    start_gateway,
    stop_gateway,
    tiny_model,
    wait_gateway,
)

SHM = Path("/dev/shm")


def elastic_config(tmp_path: Path) -> Path:
    model = tiny_model(tmp_path / "tiny.gguf")
    (tmp_path / "slices.yaml").write_text("slices:\n  - {name: s0, memory_gb: 1}\n")
    engine = "{max_model_len: 128, max_num_seqs: 4, max_num_batched_tokens: 128}"
    (tmp_path / "models.yaml").write_text(
        f"models:\n  tiny: {{model: {model}, slo_ttft: 2, engine: {engine}}}\n"
        "slices: slices.yaml\nsharing: elastic\n"
    )
    return tmp_path / "models.yaml"


def ledger_of(pid: int) -> Path:
    """The ledger of slice s0 that gateway `pid` made."""
    [found] = SHM.glob(f"medusa-shm-{pid}-*/ledger-s0-*")
    return found


@pytest.mark.e2e
def test_links_planted_for_the_gateways_ledger_are_not_followed(tmp_path: Path) -> None:
    victim = tmp_path / "victim"
    victim.write_bytes(b"root's file\n")
    proc, base = start_gateway(elastic_config(tmp_path), pid_file=tmp_path / "pid")
    pid = proc.pid  # NOTE: known before the gateway runs: `sh` execs it on our word
    planted = [SHM / f".medusa-ledger-{pid}-s0.{pid}", SHM / f"medusa-ledger-{pid}-s0"]
    for link in planted:
        link.symlink_to(victim)
    try:
        release(proc)
        wait_gateway(proc, base)
        assert victim.read_bytes() == b"root's file\n"
        ledger = ledger_of(pid)
        st, home = ledger.stat(), ledger.parent.stat()
        assert (st.st_mode & 0o777, home.st_mode & 0o777) == (0o600, 0o700)
        assert st.st_uid == home.st_uid == os.geteuid()
        assert PageLedger(ledger).free() == 512  # 1 GiB in 2 MiB pages, none held yet
        # the attacker, another user, cannot list, read, join or plant anything there
        got = as_another_user(f"""
import json, os
out = {{}}
for what, call in [("list", lambda: os.listdir({str(ledger.parent)!r})),
                   ("read", lambda: open({str(ledger)!r}, "rb").read()),
                   ("join", lambda: os.open({str(ledger)!r}, os.O_RDWR)),
                   ("plant", lambda: os.symlink("/etc/passwd", {str(ledger.parent / "x")!r}))]:
    try:
        call()
        out[what] = "done"
    except OSError as e:
        out[what] = e.strerror
print(json.dumps(out))
""")
        assert json.loads(got.stdout) == dict.fromkeys(
            ["list", "read", "join", "plant"], "Permission denied"
        ), got.stderr
    finally:
        out = stop_gateway(proc)
        for link in planted:
            link.unlink(missing_ok=True)
    assert not list(SHM.glob(f"medusa-shm-{pid}-*")), out[-2000:]  # removed at shutdown


def test_a_ledger_is_made_without_following_links_and_joined_only_if_private(tmp_path):
    victim = tmp_path / "victim"
    victim.write_bytes(b"keep\n")
    (tmp_path / "ledger").symlink_to(victim)  # planted where the ledger goes
    ledger = PageLedger.create(tmp_path / "ledger", 8, 4096)  # the link is replaced, not followed
    assert victim.read_bytes() == b"keep\n" and not (tmp_path / "ledger").is_symlink()
    assert (tmp_path / "ledger").stat().st_mode & 0o777 == 0o600
    ledger.close()
    os.chmod(tmp_path / "ledger", 0o644)  # a ledger others could read, or one planted for us
    with pytest.raises(LedgerError, match="not a private page ledger of this user"):
        PageLedger(tmp_path / "ledger")
    os.symlink(tmp_path / "ledger", tmp_path / "alias")
    with pytest.raises(LedgerError, match="cannot open the page ledger"):
        PageLedger(tmp_path / "alias")
