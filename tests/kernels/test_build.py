"""The kernel cache keeps the builds last used, not one ~4.4 MB folder per source version ever built."""
from __future__ import annotations

import os

from specdec.kernels.build import NAME, USED_MARK, prune_builds


def _build(root, name: str, used_at: float, marked: bool = True):
    folder = root / name
    folder.mkdir()
    (folder / f"{NAME}.so").write_bytes(b"\0")
    os.utime(folder / f"{NAME}.so", (used_at, used_at))
    if marked:
        (folder / USED_MARK).touch()
        os.utime(folder / USED_MARK, (used_at, used_at))
    return folder


def test_prune_keeps_the_current_build_and_the_last_used_others(tmp_path):
    current = _build(tmp_path, "f" * 16, used_at=100.0)  # the oldest of all, but the one just built
    recent = [_build(tmp_path, f"{i:016x}", used_at=1000.0 + i) for i in range(3)]
    old = [_build(tmp_path, f"{i + 10:016x}", used_at=500.0 + i, marked=False) for i in range(2)]
    unrelated = tmp_path / "not-a-build"
    unrelated.mkdir()
    removed = prune_builds(tmp_path, current, keep=3)
    assert sorted(removed) == sorted(old)
    assert all(not d.exists() for d in old)
    assert current.exists() and unrelated.exists() and all(d.exists() for d in recent)


def test_prune_orders_by_last_use_not_by_build_time(tmp_path):
    current = _build(tmp_path, "a" * 16, used_at=2000.0)
    built_early_used_late = _build(tmp_path, "b" * 16, used_at=10.0)
    os.utime(built_early_used_late / USED_MARK, (3000.0, 3000.0))
    built_late_unused = _build(tmp_path, "c" * 16, used_at=1500.0)
    assert prune_builds(tmp_path, current, keep=1) == [built_late_unused]
    assert built_early_used_late.exists()
