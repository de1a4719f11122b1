"""medusa/env.py is the one list of MEDUSA_* variables: every one declared there is in env.ALL."""

from __future__ import annotations

from medusa import env


def test_every_declared_variable_is_listed_once():
    declared = {v.name for v in vars(env).values() if isinstance(v, env.EnvVar)}
    listed = [v.name for v in env.ALL]
    assert sorted(listed) == sorted(declared)
    assert all(name.startswith("MEDUSA_") for name in listed)
