#!/usr/bin/env python3
"""A CuPy producer/consumer pair sharing one device buffer through legacy CUDA IPC.

The pattern of vLLM's custom all-reduce: the producer allocates a buffer from CuPy's memory pool
(cudaMalloc underneath), sends `cupy.cuda.runtime.ipcGetMemHandle(ptr)` to a consumer started with
the spawn method, which maps it with `cupy.cuda.runtime.ipcOpenMemHandle` (flag
cudaIpcMemLazyEnablePeerAccess, CuPy's default) and wraps it in an array without owning it. The
consumer checks the producer's bytes, later the producer's new bytes, and writes bytes of its own
that the producer checks; at the end it closes the mapping with ipcCloseMemHandle.

Modes, output and exit status as scripts/gpu/torch_share.py:
  plain    share, update, reverse, done, without pausing.
  barrier  after "share" the producer writes BARRIER_DIR/ready.json ({"producer_pid",
           "consumer_pid"}, atomically) and both stay idle until BARRIER_DIR/go exists; meanwhile
           `cuinterpose suspend/resume --pid <producer_pid>` (or checkpoint/restore) may run.

Every process started here runs with NCCL_NVLS_ENABLE=0, TORCH_SYMM_MEM_DISABLE_MULTICAST=1 and
NVSHMEM_DISABLE_NVLS=1 (lane_common, imported before cupy, inherited by the consumer).
"""

import argparse
import json
import multiprocessing as mp
import os
import queue
import sys
import time

# Switches multicast off before cupy is imported (see lane_common).
from lane_common import MULTICAST_OFF, emit, shim_mapped


def pattern(cp, n, gen):
    """The expected contents for generation `gen`: a position-dependent int32 pattern."""
    i = cp.arange(n, dtype=cp.int64)
    return ((i * 2654435761 + gen * 40503) % 2147483629).astype(cp.int32)


def check(cp, array, gen):
    """(ok, detail) for `array` holding generation `gen`."""
    expected = pattern(cp, array.size, gen)
    cp.cuda.runtime.deviceSynchronize()
    diff = array != expected
    bad = int(diff.sum())
    if bad == 0:
        return True, {"checked": int(array.size)}
    first = int(cp.flatnonzero(diff)[0])
    return False, {
        "mismatches": bad,
        "first": first,
        "expected": int(expected[first]),
        "actual": int(array[first]),
    }


def consumer(inbox, outbox, device):
    """Opens the handle, then answers ("check", gen) and ("write", gen) until ("stop",)."""
    import cupy as cp

    pid = os.getpid()

    def report(phase, ok, **detail):
        outbox.put(dict(phase=phase, ok=ok, role="consumer", pid=pid, **detail))

    try:
        cp.cuda.Device(device).use()
        kind, handle, offset, n = inbox.get(timeout=300)
        if kind != "handle":
            report("share", False, error="expected a handle, got %r" % (kind,))
            return
        base = cp.cuda.runtime.ipcOpenMemHandle(handle)
        again = cp.cuda.runtime.ipcOpenMemHandle(handle)
        same = again == base
        cp.cuda.runtime.ipcCloseMemHandle(again)
        memory = cp.cuda.UnownedMemory(base + offset, n * 4, owner=None, device_id=device)
        array = cp.ndarray((n,), dtype=cp.int32, memptr=cp.cuda.MemoryPointer(memory, 0))
        report("start", same, shim=shim_mapped(), opened_twice_same_address=same,
               env={k: os.environ.get(k) for k in MULTICAST_OFF})
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
                ok, detail = check(cp, array, gen)
                report(phase, ok, generation=gen, **detail)
            elif op == "write":
                array[...] = pattern(cp, n, gen)
                cp.cuda.runtime.deviceSynchronize()
                report(phase, True, generation=gen, wrote=n)
        del array, memory
        cp.cuda.runtime.ipcCloseMemHandle(base)
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
    parser.add_argument("--size-mb", type=float, default=256, help="buffer size in MiB")
    parser.add_argument("--offset-kb", type=int, default=64,
                        help="the shared array starts this far into its allocation (an interior "
                             "pointer: the handle names the allocation, the offset travels apart)")
    parser.add_argument("--device", type=int, default=0)
    parser.add_argument("--timeout", type=float, default=600.0)
    parser.add_argument("--require-shim", action="store_true",
                        help="fail unless libcuinterpose.so is mapped in both processes")
    args = parser.parse_args()
    if args.mode == "barrier" and not args.barrier_dir:
        parser.error("--mode barrier needs --barrier-dir")
    n = int(args.size_mb * (1 << 20)) // 4
    if n < 1:
        parser.error("--size-mb must hold at least one int32")

    import cupy as cp

    pid = os.getpid()
    all_ok = True

    def producer_report(phase, ok, **detail):
        nonlocal all_ok
        all_ok = all_ok and ok
        emit(dict(phase=phase, ok=ok, role="producer", pid=pid, **detail))

    def consumer_report(expected_phase):
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

    cp.cuda.Device(args.device).use()
    offset = args.offset_kb * 1024
    whole = cp.cuda.alloc(offset + n * 4)
    array = cp.ndarray((n,), dtype=cp.int32, memptr=whole + offset)
    array[...] = pattern(cp, n, 1)
    cp.cuda.runtime.deviceSynchronize()
    # The handle of the interior pointer: the driver (and the shim) name the whole allocation.
    handle = cp.cuda.runtime.ipcGetMemHandle(array.data.ptr)
    base = whole.ptr
    shim = shim_mapped()
    producer_report("start", not args.require_shim or shim, shim=shim, cupy=cp.__version__,
                    bytes=n * 4, offset=offset, mode=args.mode)

    ctx = mp.get_context("spawn")
    inbox, outbox = ctx.Queue(), ctx.Queue()
    proc = ctx.Process(target=consumer, args=(inbox, outbox, args.device))
    proc.start()
    # The consumer's open returns the allocation's base: the array's offset travels apart.
    inbox.put(("handle", handle, array.data.ptr - base, n))
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
            ok, detail = check(cp, array, 1)
            producer_report("resume-producer", ok, generation=1, **detail)
            inbox.put(("resume-consumer", "check", 1))
            consumer_report("resume-consumer")

    array[...] = pattern(cp, n, 2)
    cp.cuda.runtime.deviceSynchronize()
    inbox.put(("update", "check", 2))
    consumer_report("update")
    inbox.put(("reverse-write", "write", 3))
    consumer_report("reverse-write")
    ok, detail = check(cp, array, 3)
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
