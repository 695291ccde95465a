"""The committed stubs under specdec/rpc/v1 must be what `make proto` generates from proto/ now."""
from specdec.rpc.codegen import STUB_DIR, generate


def test_committed_stubs_match_the_protos(tmp_path):
    fresh = {p.name: p.read_text() for p in generate(tmp_path)}
    committed = {p.name: p.read_text() for p in STUB_DIR.iterdir() if p.is_file() and p.suffix in (".py", ".pyi")}
    stale = sorted(name for name in fresh.keys() | committed.keys() if fresh.get(name) != committed.get(name))
    assert not stale, f"stubs out of date: {stale}; run `make proto`"
