"""A single PyTorch process holding device memory across a suspend (issue 11, GPU lane step `hold`).

It allocates --size-gb of device memory in --chunks int32 tensors of random values through PyTorch's
caching allocator (the default one takes them with cudaMalloc, that is cuMemAlloc; with
PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True it takes private cuMemCreate allocations), computes
an exact checksum of each on the device and a small matmul, then follows the barrier protocol of
lane_common.hold_rounds: after each round the checksums and the matmul must be unchanged, and a
fresh allocation and kernel must work. One JSON line per phase on stdout.
"""

import argparse
import os
import sys

from lane_common import emit, hold_rounds, shim_mapped


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--barrier-dir", required=True)
    parser.add_argument("--size-gb", type=float, default=8.0)
    parser.add_argument("--chunks", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--require-shim", action="store_true")
    parser.add_argument("--timeout", type=float, default=600.0)
    args = parser.parse_args()
    pid = os.getpid()

    def report(phase, ok, **detail):
        emit(dict(phase=phase, ok=ok, role="torch", pid=pid, **detail))

    if args.require_shim and not shim_mapped():
        report("start", False, error="libcuinterpose.so not mapped")
        return 1

    import torch

    device = torch.device("cuda", 0)
    elements = int(args.size_gb * (1 << 30)) // 4 // args.chunks
    generator = torch.Generator(device=device).manual_seed(11)
    tensors = [
        torch.randint(-(1 << 31), (1 << 31) - 1, (elements,), dtype=torch.int32, device=device, generator=generator)
        for _ in range(args.chunks)
    ]
    weights = torch.randn((1024, 1024), dtype=torch.float32, device=device, generator=generator)

    def checksums():
        # int64 sums of int32 values and of their products with a constant are exact: a
        # fingerprint of the bytes that does not depend on the order of the reduction.
        return [(int(t.sum(dtype=torch.int64)), int((t.to(torch.int64) * 2654435761).sum())) for t in tensors]

    def compute():
        return float((weights @ weights.T).sum())

    expected = checksums()
    product = compute()
    torch.cuda.synchronize()
    held = sum(t.numel() * t.element_size() for t in tensors) + weights.numel() * 4
    report("hold", True, bytes=held, allocator=os.environ.get("PYTORCH_CUDA_ALLOC_CONF", "default"),
           reserved=torch.cuda.memory_reserved(device))

    def recheck():
        got = checksums()
        again = compute()
        # New work after the resume: a fresh allocation and a kernel writing it.
        fresh = torch.full((1 << 20,), 7, dtype=torch.int32, device=device)
        fresh_ok = int(fresh.sum()) == 7 << 20
        del fresh
        return got == expected and again == product and fresh_ok, dict(product=again, fresh=fresh_ok)

    return hold_rounds(args.barrier_dir, args.rounds, args.timeout, pid, held, recheck, report)


if __name__ == "__main__":
    sys.exit(main())
