#!/usr/bin/env python3
"""A one-rank NCCL group that keeps all-reducing and computing while the tool acts (issue 27).

torch.distributed with backend nccl, world size 1, rendezvous through a FileStore in READY_DIR
(file://, no TCP at the torch layer; NCCL's own bootstrap still opens its sockets), the
communicator made at once (device_id). Iteration i: a --size-mb float32 tensor filled with
(i % 1000) + 1, all_reduce SUM (one rank: the sum is the value itself, but the collective's kernel
and NCCL's buffers are real), a matmul of small-integer float32 matrices (exact in any order of
summation), then both checked exactly on the device, one bool each read back.

Protocol with the lane: busy_common (ready.json once the first iteration is checked, stop file,
--max-seconds, watchdog); one summary line; exit 0 only if every check passed.
"""

import argparse
import datetime
import os
import sys

# Multicast off (lane_common) before torch is imported.
import lane_common  # noqa: F401 (multicast off at module level, in spawned children too)
from busy_common import Tally, add_common_args, emit, guarded, run_until_stop, shim_mapped, write_ready


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size-mb", type=float, default=256, help="all-reduced tensor size in MiB")
    parser.add_argument("--matmul", type=int, default=2048)
    parser.add_argument("--nccl-timeout", type=float, default=300.0, help="the process group's timeout, s")
    add_common_args(parser, stall_default=120.0)
    args = parser.parse_args()
    n = int(args.size_mb * (1 << 20)) // 4
    if n < 1:
        parser.error("--size-mb must hold at least one float32")
    pid = os.getpid()
    tally = Tally("nccl", "rank0", args.stall_timeout, extra={"bytes": n * 4})
    if args.require_shim and not shim_mapped():
        tally.fail({"error": "libcuinterpose.so not mapped"})

    import torch
    import torch.distributed as dist

    os.makedirs(args.ready_dir, exist_ok=True)
    store = os.path.join(os.path.abspath(args.ready_dir), "rendezvous")
    if os.path.exists(store):  # a FileStore needs a missing or empty file
        os.remove(store)
    torch.backends.cuda.matmul.allow_tf32 = False
    device = torch.device("cuda", 0)
    torch.cuda.set_device(device)
    kwargs = dict(backend="nccl", init_method="file://" + store, rank=0, world_size=1,
                  timeout=datetime.timedelta(seconds=args.nccl_timeout))
    try:  # device_id (torch >= 2.3) binds the communicator to this GPU and creates it now
        dist.init_process_group(device_id=device, **kwargs)
    except TypeError:
        dist.init_process_group(**kwargs)
    version = torch.cuda.nccl.version()
    version = list(version) if isinstance(version, tuple) else version

    g = torch.Generator(device="cpu").manual_seed(27)
    a = torch.randint(-4, 5, (args.matmul, args.matmul), generator=g).to(device=device, dtype=torch.float32)
    b = torch.randint(-4, 5, (args.matmul, args.matmul), generator=g).to(device=device, dtype=torch.float32)
    product = (a.double() @ b.double()).float()  # exact: every entry is an integer below 2**24
    out = torch.empty_like(a)
    tensor = torch.empty(n, dtype=torch.float32, device=device)
    count = 0

    def iteration():
        nonlocal count
        value = float(count % 1000 + 1)
        tensor.fill_(value)
        dist.all_reduce(tensor, op=dist.ReduceOp.SUM)
        torch.matmul(a, b, out=out)
        if not bool(torch.all(tensor == value).item()):  # one rank: the sum is the value itself
            bad = tensor != value
            first = int(torch.nonzero(bad)[0].item())
            tally.fail({"error": "all_reduce result differs", "expected": value, "mismatches": int(bad.sum().item()),
                        "first": first, "actual": float(tensor[first].item())})
        if not torch.equal(out, product):
            tally.fail({"error": "matmul differs from the exact product"})
        count += 1
        tally.tick()

    error = None
    try:
        iteration()
        tally.start_watchdog()
        write_ready(args.ready_dir, {"pids": [pid], "pid": pid, "workload": "nccl"})
        emit(dict(phase="ready", ok=True, pid=pid, shim=shim_mapped(), nccl=version))
        error = run_until_stop(args, tally, iteration)
    except Exception as e:
        error = "%s: %s" % (type(e).__name__, e)
    if error:
        tally.fail({"error": error})
    try:
        torch.cuda.synchronize()
        dist.destroy_process_group()
    except Exception as e:
        tally.fail({"error": "teardown: %s: %s" % (type(e).__name__, e)})
    tally.finish()
    record = tally.summary(nccl=version, torch=torch.__version__)
    emit(record)
    return 0 if record["ok"] else 1


if __name__ == "__main__":
    sys.exit(guarded("nccl", main))
