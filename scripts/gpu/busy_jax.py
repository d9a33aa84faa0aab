#!/usr/bin/env python3
"""A JAX loop that keeps computing over a few GiB while the tool acts (issue 27).

State: --chunks uint32 arrays, --size-gb in all (XLA makes them with private cuMemCreate). Each
iteration is one jit'd step, its inputs donated so the update is in place: every word x becomes
x * A + C (mod 2**32, an invertible map, so nothing collapses to a constant), and the step returns
each chunk's uint32 sum and a matmul of small-integer float32 matrices (exact in any order of
summation). The host knows what the sums must be without reading the arrays: the sum S of a chunk
of n words becomes A * S + n * C (mod 2**32), tracked with Python integers from the sums measured
once at the start. Every iteration compares the device's sums and the matmul's with the expected
ones exactly; a difference is a failed check.

Protocol with the lane: busy_common (ready.json once the first step is checked, stop file,
--max-seconds, watchdog); one summary line; exit 0 only if every check passed.
XLA_PYTHON_CLIENT_PREALLOCATE=false makes the process hold what it allocates, not 75 % of the GPU.
"""

import argparse
import os
import sys

# Multicast off (lane_common) before jax is imported.
import lane_common  # noqa: F401 (multicast off at module level, in spawned children too)
from busy_common import Tally, add_common_args, emit, guarded, run_until_stop, shim_mapped, write_ready

os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")

A, C, MASK = 1664525, 1013904223, (1 << 32) - 1  # Numerical Recipes' LCG constants


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size-gb", type=float, default=4.0, help="state size in GiB (default 4)")
    parser.add_argument("--chunks", type=int, default=4)
    parser.add_argument("--matmul", type=int, default=2048)
    add_common_args(parser, stall_default=120.0)
    args = parser.parse_args()
    words = int(args.size_gb * (1 << 30)) // 4 // args.chunks
    if words < 1 or args.chunks < 1:
        parser.error("--size-gb and --chunks must give at least one word per chunk")
    pid = os.getpid()
    tally = Tally("jax", "jax", args.stall_timeout, extra={"bytes": words * 4 * args.chunks})
    if args.require_shim and not shim_mapped():
        tally.fail({"error": "libcuinterpose.so not mapped"})

    import jax
    import jax.numpy as jnp
    import numpy as np

    key = jax.random.PRNGKey(27)
    state = [jax.random.bits(jax.random.fold_in(key, i), (words,), dtype=jnp.uint32) for i in range(args.chunks)]
    rng = np.random.default_rng(27)
    wa = jnp.asarray(rng.integers(-4, 5, (args.matmul, args.matmul)).astype(np.float32))
    wb = jnp.asarray(rng.integers(-4, 5, (args.matmul, args.matmul)).astype(np.float32))
    # The exact product, computed on the host in float64 (every entry is an integer below 2**24).
    product = jnp.asarray((np.asarray(wa, dtype=np.float64) @ np.asarray(wb, dtype=np.float64)).astype(np.float32))

    @jax.jit
    def sums(xs):
        return jnp.stack([jnp.sum(x, dtype=jnp.uint32) for x in xs])

    def body(xs, a, b, want):
        new = [x * jnp.uint32(A) + jnp.uint32(C) for x in xs]
        mm = jnp.matmul(a, b, precision=jax.lax.Precision.HIGHEST)
        return new, jnp.stack([jnp.sum(x, dtype=jnp.uint32) for x in new]), jnp.array_equal(mm, want)

    step = jax.jit(body, donate_argnums=(0,))
    expected = [int(v) for v in np.asarray(sums(state))]

    def iteration():
        nonlocal state, expected
        state, got, mm_ok = step(state, wa, wb, product)
        got = [int(v) for v in np.asarray(got)]  # waits for the step
        expected = [(A * s + words * C) & MASK for s in expected]
        tally.check(got == expected, {"error": "state sums differ", "sums": got, "expected": expected})
        tally.check(bool(mm_ok), {"error": "matmul differs from the exact product"})
        tally.tick()

    error = None
    try:
        iteration()  # compiles the step
        tally.start_watchdog()
        write_ready(args.ready_dir, {"pids": [pid], "pid": pid, "workload": "jax"})
        emit(dict(phase="ready", ok=True, pid=pid, shim=shim_mapped(), device=str(jax.devices()[0]),
                  bytes=words * 4 * args.chunks))
        error = run_until_stop(args, tally, iteration)
    except Exception as e:
        error = "%s: %s" % (type(e).__name__, e)
    if error:
        tally.fail({"error": error})
    tally.finish()
    record = tally.summary(jax=jax.__version__)
    emit(record)
    return 0 if record["ok"] else 1


if __name__ == "__main__":
    sys.exit(guarded("jax", main))
