"""A JAX process holding device memory across a suspend (issue 11, GPU lane step `keep`).

It allocates --size-gb of device memory in --chunks arrays of random uint32 (XLA's allocator takes
them with private cuMemCreate allocations, measured), computes a checksum of each on the device and
a small matmul, writes BARRIER_DIR/ready.json ({"pid", "bytes"}), then waits for BARRIER_DIR/go-N for each round N given by
--rounds (the lane suspends and resumes the process in between), and after each recomputes the
checksums and the matmul, which must be unchanged. One JSON line per phase on stdout.

XLA_PYTHON_CLIENT_PREALLOCATE=false makes the process hold what it allocates, not 75 % of the GPU.
"""

import argparse
import os
import sys

from lane_common import emit, hold_rounds, shim_mapped

os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")


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
        emit(dict(phase=phase, ok=ok, role="jax", pid=pid, **detail))

    if args.require_shim and not shim_mapped():
        report("start", False, error="libcuinterpose.so not mapped")
        return 1

    import jax
    import jax.numpy as jnp

    words = int(args.size_gb * (1 << 30)) // 4 // args.chunks
    key = jax.random.PRNGKey(11)
    arrays = []
    for i in range(args.chunks):
        arrays.append(jax.random.bits(jax.random.fold_in(key, i), (words,), dtype=jnp.uint32))
    weights = jax.random.normal(key, (1024, 1024), dtype=jnp.float32)

    @jax.jit
    def checksums(xs):
        # uint32 sums wrap the same way every time: an exact fingerprint of the bytes.
        return jnp.stack([jnp.sum(x, dtype=jnp.uint32) ^ jnp.sum(x * jnp.uint32(2654435761), dtype=jnp.uint32)
                          for x in xs])

    @jax.jit
    def compute(w):
        return jnp.sum(w @ w.T)

    expected = [int(v) for v in checksums(arrays)]
    product = float(compute(weights))
    held = sum(a.nbytes for a in arrays) + weights.nbytes
    report("hold", True, bytes=held, checksums=expected, product=product, device=str(jax.devices()[0]))

    def recheck():
        got = [int(v) for v in checksums(arrays)]
        again = float(compute(weights))
        return got == expected and again == product, dict(checksums=got, product=again)

    return hold_rounds(args.barrier_dir, args.rounds, args.timeout, pid, held, recheck, report)


if __name__ == "__main__":
    sys.exit(main())
