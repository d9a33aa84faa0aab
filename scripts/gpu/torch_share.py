#!/usr/bin/env python3
"""A PyTorch producer/consumer pair sharing one CUDA tensor through torch.multiprocessing (spawn).

The producer (this process) fills a CUDA tensor, sends it to a consumer process started with the
spawn method; the consumer checks the producer's bytes, later the producer's new bytes, and writes
bytes of its own that the producer checks. With PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
(--allocator expandable, the default) the tensor travels as a POSIX-fd VMM export; with
--allocator default it travels as legacy CUDA IPC.

Modes:
  plain    share, update, reverse, done, without pausing (run it as is, or under
           `cuinterpose run -- python3 torch_share.py`).
  barrier  after "share" the producer writes BARRIER_DIR/ready.json ({"producer_pid",
           "consumer_pid"}, written atomically) and both processes stay idle (no GPU work) until
           BARRIER_DIR/go exists; meanwhile `cuinterpose inspect/suspend/resume --pid
           <producer_pid>` may run. Then both check that the first bytes survived, and the
           update/reverse phases show that writes still travel both ways.

Pids are as this script sees them (namespace pids under `cuinterpose run --pid-namespace`).

Output: one JSON line per phase on stdout, all printed by the producer:
  {"phase": "...", "ok": true|false, "role": "producer"|"consumer", "pid": N, ...}
Exit status: 0 when every phase is ok, 1 otherwise, 2 on bad arguments.

Every process started here runs with NCCL_NVLS_ENABLE=0, TORCH_SYMM_MEM_DISABLE_MULTICAST=1 and
NVSHMEM_DISABLE_NVLS=1 (set below, before torch is imported, and inherited by the consumer).
"""

import argparse
import json
import os
import queue
import sys
import time

# Switches multicast off before torch is imported (see lane_common).
from lane_common import MULTICAST_OFF, emit, shim_mapped


def pattern(torch, n, gen, device):
    """The expected contents for generation `gen`: a cheap position-dependent int32 pattern."""
    i = torch.arange(n, dtype=torch.int64, device=device)
    return ((i * 2654435761 + gen * 40503) % 2147483629).to(torch.int32)


def check(torch, tensor, gen):
    """(ok, detail) for `tensor` holding generation `gen`."""
    expected = pattern(torch, tensor.numel(), gen, tensor.device)
    torch.cuda.synchronize()
    diff = tensor != expected
    bad = int(diff.sum().item())
    if bad == 0:
        return True, {"checked": tensor.numel()}
    first = int(torch.nonzero(diff)[0].item())
    return False, {
        "mismatches": bad,
        "first": first,
        "expected": int(expected[first].item()),
        "actual": int(tensor[first].item()),
    }


def consumer(inbox, outbox, device):
    """Receives the tensor, then answers ("check", gen) and ("write", gen) until ("stop",)."""
    import torch

    pid = os.getpid()

    def report(phase, ok, **detail):
        outbox.put(dict(phase=phase, ok=ok, role="consumer", pid=pid, **detail))

    try:
        torch.cuda.set_device(device)
        kind, tensor = inbox.get(timeout=300)
        if kind != "tensor":
            report("share", False, error="expected a tensor, got %r" % (kind,))
            return
        report("start", True, shim=shim_mapped(), env={k: os.environ.get(k) for k in MULTICAST_OFF})
        parent = os.getppid()
        while True:
            try:
                message = inbox.get(timeout=1.0)
            except queue.Empty:
                if os.getppid() != parent:
                    return  # the producer is gone: no orphan
                continue
            if message[0] == "stop":
                break
            phase, op, gen = message
            if op == "check":
                ok, detail = check(torch, tensor, gen)
                report(phase, ok, generation=gen, **detail)
            elif op == "write":
                tensor.copy_(pattern(torch, tensor.numel(), gen, tensor.device))
                torch.cuda.synchronize()
                report(phase, True, generation=gen, wrote=tensor.numel())
        del tensor
        torch.cuda.synchronize()
    except Exception as e:  # report anything, so the producer does not wait for nothing
        report("consumer", False, error="%s: %s" % (type(e).__name__, e))


def wait_for_file(path, timeout):
    deadline = time.monotonic() + timeout
    while not os.path.exists(path):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.2)
    return True


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mode", choices=["plain", "barrier"], default="plain")
    parser.add_argument("--barrier-dir", help="directory for ready.json and go (barrier mode)")
    parser.add_argument("--size-mb", type=float, default=256, help="tensor size in MiB")
    parser.add_argument("--allocator", choices=["expandable", "default"], default="expandable")
    parser.add_argument("--device", type=int, default=0)
    parser.add_argument("--timeout", type=float, default=600.0,
                        help="seconds to wait for the consumer, and for the go file")
    parser.add_argument("--require-shim", action="store_true",
                        help="fail unless libcuinterpose.so is mapped in both processes")
    args = parser.parse_args()
    if args.mode == "barrier" and not args.barrier_dir:
        parser.error("--mode barrier needs --barrier-dir")
    n = int(args.size_mb * (1 << 20)) // 4
    if n < 1:
        parser.error("--size-mb must hold at least one int32")

    if args.allocator == "expandable":
        os.environ["PYTORCH_CUDA_ALLOC_CONF"] = "expandable_segments:True"
    else:
        os.environ.pop("PYTORCH_CUDA_ALLOC_CONF", None)

    import torch
    import torch.multiprocessing as mp

    pid = os.getpid()
    all_ok = True

    def producer_report(phase, ok, **detail):
        nonlocal all_ok
        all_ok = all_ok and ok
        emit(dict(phase=phase, ok=ok, role="producer", pid=pid, **detail))

    def consumer_report(expected_phase):
        """The consumer's next report; a dead or silent consumer is a failed phase."""
        nonlocal all_ok
        deadline = time.monotonic() + args.timeout
        record = None
        while record is None:
            try:
                record = outbox.get(timeout=1.0)
            except queue.Empty:
                if not proc.is_alive():
                    try:
                        record = outbox.get_nowait()
                    except queue.Empty:
                        record = dict(phase=expected_phase, ok=False, role="consumer",
                                      error="consumer exited (%s)" % proc.exitcode)
                elif time.monotonic() > deadline:
                    record = dict(phase=expected_phase, ok=False, role="consumer",
                                  error="no answer in %.0f s" % args.timeout)
        all_ok = all_ok and record.get("ok", False)
        emit(record)
        return record

    torch.cuda.set_device(args.device)
    tensor = torch.empty(n, dtype=torch.int32, device="cuda:%d" % args.device)
    tensor.copy_(pattern(torch, n, 1, tensor.device))
    torch.cuda.synchronize()
    shim = shim_mapped()
    producer_report("start", not args.require_shim or shim, shim=shim, torch=torch.__version__,
                    allocator=args.allocator, bytes=n * 4, mode=args.mode,
                    alloc_conf=os.environ.get("PYTORCH_CUDA_ALLOC_CONF"))

    ctx = mp.get_context("spawn")
    inbox, outbox = ctx.Queue(), ctx.Queue()
    proc = ctx.Process(target=consumer, args=(inbox, outbox, args.device))
    proc.start()
    inbox.put(("tensor", tensor))
    started = consumer_report("start")
    if args.require_shim and not started.get("shim"):
        all_ok = False
        emit(dict(phase="start", ok=False, role="consumer", error="libcuinterpose.so not mapped"))

    inbox.put(("share", "check", 1))
    consumer_report("share")

    if args.mode == "barrier":
        os.makedirs(args.barrier_dir, exist_ok=True)
        ready = os.path.join(args.barrier_dir, "ready.json")
        with open(ready + ".tmp", "w") as f:
            json.dump({"producer_pid": pid, "consumer_pid": proc.pid}, f)
        os.replace(ready + ".tmp", ready)
        producer_report("ready", True, consumer_pid=proc.pid, barrier=args.barrier_dir)
        go = os.path.join(args.barrier_dir, "go")
        if not wait_for_file(go, args.timeout):
            producer_report("go", False, error="%s did not appear in %.0f s" % (go, args.timeout))
        else:
            ok, detail = check(torch, tensor, 1)
            producer_report("resume-producer", ok, generation=1, **detail)
            inbox.put(("resume-consumer", "check", 1))
            consumer_report("resume-consumer")

    # The producer's new writes reach the consumer...
    tensor.copy_(pattern(torch, n, 2, tensor.device))
    torch.cuda.synchronize()
    inbox.put(("update", "check", 2))
    consumer_report("update")
    # ...and the consumer's reach the producer.
    inbox.put(("reverse-write", "write", 3))
    consumer_report("reverse-write")
    ok, detail = check(torch, tensor, 3)
    producer_report("reverse", ok, generation=3, **detail)

    inbox.put(("stop",))
    proc.join(timeout=args.timeout)
    if proc.is_alive():
        proc.kill()
        proc.join()
    producer_report("done", all_ok and proc.exitcode == 0, consumer_exit=proc.exitcode)
    return 0 if all_ok and proc.exitcode == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
