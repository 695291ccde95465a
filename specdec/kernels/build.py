"""Build (once, cached) and load the row-invariant multi-row matmul extension, rowgemm.cpp.

torch.utils.cpp_extension compiles it with ninja into the specdec cache directory (a folder named
by the sources' hash) the first time it is asked for (a few minutes) and reloads it from there
afterwards; `make model` builds it ahead of time. Where it cannot build (no compiler, no ninja, a non-x86 CPU) the answer says why, and the
callers keep torch's F.linear with that reason logged once.
"""
from __future__ import annotations

import functools
import logging
import platform
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger(__name__)

SOURCES = [Path(__file__).with_name(name) for name in ("rowgemm.cpp", "rowgemm_amx.cpp", "attention.cpp", "attention_avx2.cpp", "norm.cpp", "layer.cpp", "rows.cpp", "argmax.cpp", "top_probs.cpp", "peak.cpp", "module.cpp")]
HEADERS = [Path(__file__).with_name(name) for name in ("attention_amx.h", "attention_amx_pv.h", "attention_probs.h", "attention_simd.h", "attention_units.h", "attention_weigh_pairs.h", "avx2_bf16.h", "act_rows.h", "layer_rows.h", "norm_rows.h", "parts.h", "rowgemm_bf16.h", "rowgemm_common.h", "rowgemm_f32.h", "team_barrier.h")]  # part of the digest, not compiled alone
NAME = "specdec_rowgemm"
ISA_NAMES = ("scalar", "avx2", "avx512", "avx512_bf16", "amx_bf16")  # rowgemm.cpp's Isa enum, by value
ROWS_AVX512 = 2  # layer_rows.h's Isa (rows_isa()): the AVX-512 path of the row kernels (argmax, top_probs)
# Builds of other source versions kept beside this one (checkouts and A/B worktrees share the cache, each
# loading its own); older ones, by last use, are removed when a new build is made (~4.4 MB each).
KEEP_OTHER_BUILDS = 5
USED_MARK = "last_used"  # touched at every load: the cache's order of last use


@dataclass(frozen=True)
class Kernel:
    """The loaded extension (None when it could not build) and why not."""

    module: object | None
    reason: str = ""

    @property
    def isa(self) -> str:
        return ISA_NAMES[self.module.cpu_isa()] if self.module is not None else "none"

    @property
    def runs_bf16(self) -> bool:
        """bfloat16 weights run on the kernels: natively with AVX512-BF16, widened to float32 on AVX2."""
        return self.module is not None and self.module.cpu_isa() >= ISA_NAMES.index("avx2")

    @property
    def rows_avx512(self):
        """The module where its row kernels (argmax_rows, top_probs) run in AVX-512, else None: callers then
        keep torch's ops, which are faster than the kernels' scalar paths."""
        return self.module if self.module is not None and self.module.rows_isa() == ROWS_AVX512 else None

    @property
    def native_bf16(self) -> bool:
        """The CPU multiplies bfloat16 itself (VDPBF16PS, or AMX tiles)."""
        return self.module is not None and self.module.cpu_isa() >= ISA_NAMES.index("avx512_bf16")


# -fopenmp: at::parallel_for is a header template that splits work with `#pragma omp parallel`; compiled
# without it, every kernel ran on one thread whatever torch.set_num_threads said.
CFLAGS = ("-O3", "-std=c++17", "-fopenmp")
LDFLAGS = ("-fopenmp",)


@functools.lru_cache(maxsize=1)
def load_kernel() -> Kernel:
    """The extension, built on first use into <specdec cache>/kernels; never raises."""
    if platform.machine().lower() not in ("x86_64", "amd64"):
        return Kernel(None, f"rowgemm is x86-only; this CPU is {platform.machine()}")
    try:
        import torch  # noqa: F401  (the extension links against it)
        from torch.utils.cpp_extension import load

        from specdec.models.embedded import cache_dir

        build_dir = cache_dir() / "kernels" / _sources_digest()
        build_dir.mkdir(parents=True, exist_ok=True)
        module = _built(build_dir)
        if module is None:
            module = load(name=NAME, sources=[str(s) for s in SOURCES], build_directory=str(build_dir),
                          extra_cflags=list(CFLAGS), extra_ldflags=list(LDFLAGS), verbose=False)
            prune_builds(build_dir.parent, build_dir, KEEP_OTHER_BUILDS)
        (build_dir / USED_MARK).touch()
    except Exception as exc:  # noqa: BLE001 (any build failure means: keep torch's kernels)
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        return Kernel(None, f"the rowgemm extension did not build ({first[:200]})")
    return Kernel(module)


def _sources_digest() -> str:
    """A name for this set of sources: two checkouts (or versions) of specdec sharing one cache directory
    each build and load their own extension instead of rebuilding over each other's."""
    import hashlib

    digest = hashlib.sha256(" ".join(CFLAGS + LDFLAGS).encode())
    for src in SOURCES + HEADERS:
        digest.update(src.name.encode() + b"\0" + src.read_bytes())
    return digest.hexdigest()[:16]


def prune_builds(root: Path, current: Path, keep: int) -> list[Path]:
    """Remove the builds under root but `current` and the `keep` last used; returns what was removed.

    A process that still has a removed build loaded keeps running (the library stays mapped); a checkout
    whose build went rebuilds it on its next start."""
    import shutil

    def last_used(build: Path) -> float:
        for name in (USED_MARK, f"{NAME}.so"):
            if (build / name).exists():
                return (build / name).stat().st_mtime
        return build.stat().st_mtime

    others = [d for d in root.iterdir() if d.is_dir() and d != current and len(d.name) == 16
              and all(c in "0123456789abcdef" for c in d.name)]  # only _sources_digest's folders
    stale = sorted(others, key=last_used, reverse=True)[keep:]
    for build in stale:
        shutil.rmtree(build, ignore_errors=True)
    if stale:
        log.info("removed %d old kernel builds from %s", len(stale), root)
    return stale


def _built(build_dir: Path):
    """The extension already built from these sources, imported without torch's build lock, or None.

    torch's loader takes a lock file in the build directory even when nothing needs building; a
    worker killed while holding it (a supervised restart, SIGKILL) would leave every later start
    waiting on that file forever. A build newer than every source needs no lock to be read."""
    import importlib.util

    library = build_dir / f"{NAME}.so"
    if not library.is_file() or any(src.stat().st_mtime > library.stat().st_mtime for src in SOURCES + HEADERS):
        return None
    spec = importlib.util.spec_from_file_location(NAME, library)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


if __name__ == "__main__":  # `python -m specdec.kernels.build`: build ahead of time (make model)
    kernel = load_kernel()
    print(f"rowgemm: {kernel.isa}" if kernel.module is not None else f"rowgemm unavailable: {kernel.reason}")
