# Attention of 30 layers (float32, SmolLM2 shape, 1,024 cached), per forward: K/V warm in cache vs evicted
# by an 18 MB stream between layers (as the weights' stream evicts them in a forward).
import sys, time, torch
from specdec.kernels.build import load_kernel
torch.set_num_threads(2)
m = load_kernel().module
L, H, KV, d = 1024, 9, 3, 64
dtype = torch.float32 if len(sys.argv) < 2 else getattr(torch, sys.argv[1])
ks = [torch.randn(1, KV, L + 16, d, dtype=dtype) for _ in range(30)]
vs = [torch.randn(1, KV, L + 16, d, dtype=dtype) for _ in range(30)]
evict = torch.randn(18 * 2**20 // 4)
for rows in (1, 8, 16):
    q = torch.randn(1, H, rows, d, dtype=dtype)
    for cold in (False, True):
        best = 1e9
        for rep in range(5):
            tot = 0.0
            for l in range(30):
                if cold: evict.sum()
                k, v = ks[l][:, :, :L + rows], vs[l][:, :, :L + rows]
                t = time.perf_counter(); m.attend(q, k, v, None, d ** -0.5); tot += time.perf_counter() - t
            best = min(best, tot)
        print(f"rows {rows:2d} {'cold' if cold else 'warm'} {best*1e3:.2f} ms / 30 layers", flush=True)
