#!/usr/bin/env python3
"""Open question of issue 27 (the spin pair fails one round after a resume): does a context that the
driver checkpointed and restored natively still run kernels that must be preempted, when another
process's context shares the GPU by time slices? No cuinterpose is involved.

Each worker (CuPy, spawned) launches, in a loop, a kernel of 4 blocks that spins on clock64() for
--kernel-ms and then writes the round number; the host checks every round's words. Two workers busy
at once make the GPU switch between their contexts in the middle of kernels (compute preemption).
This process checkpoints and restores a worker natively (cuCheckpointProcessLock, Checkpoint,
Restore, Unlock, ctypes on libcuda.so.1) while it works, lets both work on for --after seconds and
stops them; each reports its rounds and its first error.

Cases, one JSON line each:
  alone   X alone busy, X checkpointed and restored;
  pair    X and Y busy, X checkpointed and restored;
  both    X and Y busy, both checkpointed and restored (each step on both before the next);
  slice   X runs long kernels (--long-ms), Y short ones; X checkpointed and restored. Y's round
          time before and after the restore says whether the GPU still switches away from X's
          context in the middle of a kernel (time slices): if not, Y waits for X's kernels.

Each worker reports its rounds, its first error, and its round times (median, longest) before and
after the restore ended.

Needs a GPU; no multicast API is used; the multicast switches are set for every process.
"""

import argparse
import ctypes
import queue
import sys
import threading
import time

import lane_common  # noqa: F401  (switches multicast off for this process and its children)
from lane_common import emit

KERNEL = r"""
extern "C" __global__ void busy(long long cycles, unsigned int* out, unsigned int value) {
    long long t0 = clock64();
    while (clock64() - t0 < cycles) {
    }
    if (threadIdx.x == 0) {
        out[blockIdx.x] = value;
    }
}
"""


class LockArgs(ctypes.Structure):
    _fields_ = [("timeout_ms", ctypes.c_uint), ("reserved0", ctypes.c_uint),
                ("reserved1", ctypes.c_uint64 * 7)]


def worker(name, kernel_ms, control, results):
    """Spins kernels until told to stop; `control` holds 'go' and ('stop', restored_at) messages
    (restored_at: time.monotonic() when the restore ended, or None)."""
    import numpy as np

    import cupy as cp

    import os

    summary = {"worker": name, "pid": os.getpid(), "rounds": 0, "error": None}
    try:
        cp.cuda.Device(0).use()
        kernel = cp.RawKernel(KERNEL, "busy")
        out = cp.zeros(4, dtype=cp.uint32)
        stream = cp.cuda.Stream(non_blocking=True)
        rate = cp.cuda.runtime.deviceGetAttribute(cp.cuda.runtime.cudaDevAttrClockRate, 0)  # kHz
        cycles = int(rate * kernel_ms)
        results.put(("ready", name, os.getpid()))
        while control.get() != "go":
            pass
        start = time.monotonic()
        rounds = []  # (began, seconds)
        restored_at = None
        n = 0
        while True:
            try:
                message = control.get_nowait()
                if message[0] == "stop":
                    restored_at = message[1]
                    break
            except queue.Empty:
                pass
            n += 1
            began = time.monotonic()
            kernel((4,), (32,), (np.int64(cycles), out, np.uint32(n)), stream=stream)
            stream.synchronize()
            got = out.get()
            rounds.append((began, time.monotonic() - began))
            if not (got == n).all():
                summary["error"] = "round %d: words %s" % (n, got.tolist())
                break
            summary["rounds"] = n
        summary["seconds"] = round(time.monotonic() - start, 2)
        for part, keep in (("before", lambda t: restored_at is None or t < restored_at),
                           ("after", lambda t: restored_at is not None and t >= restored_at)):
            times = sorted(d for t, d in rounds if keep(t))
            if times:
                summary[part] = {"rounds": len(times), "median_ms": round(times[len(times) // 2] * 1000, 2),
                                 "longest_ms": round(times[-1] * 1000, 1)}
    except Exception as e:  # the finding: which round, which error
        summary["error"] = "round %d: %s: %s" % (summary["rounds"] + 1, type(e).__name__, e)
    results.put(("summary", name, summary))


def native(lib, pids, timeout_s):
    """Lock, checkpoint, restore, unlock `pids`, each step on all before the next: per step the
    results and seconds, or 'hung'."""
    zero = (ctypes.c_uint64 * 8)()
    lock = LockArgs(int(timeout_s * 1000))
    steps = (("lock", lib.cuCheckpointProcessLock, ctypes.byref(lock)),
             ("checkpoint", lib.cuCheckpointProcessCheckpoint, ctypes.byref(zero)),
             ("restore", lib.cuCheckpointProcessRestore, ctypes.byref(zero)),
             ("unlock", lib.cuCheckpointProcessUnlock, ctypes.byref(zero)))
    record = {}
    for step, fn, arg in steps:
        got = {}
        started = time.monotonic()
        threads = [threading.Thread(target=lambda p=p: got.__setitem__(p, fn(p, arg)), daemon=True)
                   for p in pids]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout_s + 5)
        if len(got) < len(pids):
            record[step] = "hung"
            return record, False
        record[step] = {"results": [got[p] for p in pids], "ms": round((time.monotonic() - started) * 1000, 1)}
        if any(got[p] != 0 for p in pids):
            return record, False
    return record, True


def run_case(ctx, lib, case, args):
    names = ["X"] if case == "alone" else ["X", "Y"]
    results = ctx.Queue()
    controls = {n: ctx.Queue() for n in names}
    kernel_ms = {"X": args.long_ms if case == "slice" else args.kernel_ms, "Y": args.kernel_ms}
    procs = {n: ctx.Process(target=worker, args=(n, kernel_ms[n], controls[n], results)) for n in names}
    for p in procs.values():
        p.start()
    pids = {}
    deadline = time.monotonic() + 120
    while len(pids) < len(names) and time.monotonic() < deadline:
        try:
            kind, name, pid = results.get(timeout=1)
        except queue.Empty:
            continue
        if kind == "ready":
            pids[name] = pid
    record = {"case": case, "kernel_ms": kernel_ms}
    restored_at = None
    if len(pids) < len(names):
        record["error"] = "workers not ready"
    else:
        for n in names:
            controls[n].put("go")
        time.sleep(args.before)
        targets = [pids[n] for n in names] if case == "both" else [pids["X"]]
        record["native"], record["native_ok"] = native(lib, targets, args.lock_timeout)
        restored_at = time.monotonic()
        time.sleep(args.after)
    for n in names:
        controls[n].put(("stop", restored_at))
    summaries = {}
    deadline = time.monotonic() + 60
    while len(summaries) < len(names) and time.monotonic() < deadline:
        try:
            kind, name, summary = results.get(timeout=1)
        except queue.Empty:
            continue
        if kind == "summary":
            summaries[name] = summary
    for n, p in procs.items():
        p.join(10)
        if p.is_alive():
            p.kill()
            summaries.setdefault(n, {"worker": n, "error": "did not stop (killed)"})
    record["workers"] = [summaries.get(n, {"worker": n, "error": "no summary"}) for n in names]
    record["ok"] = bool(record.get("native_ok")) and all(s.get("error") is None for s in record["workers"])
    emit(record)
    return record["ok"]


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cases", default="alone,pair,both,slice")
    parser.add_argument("--kernel-ms", type=float, default=5.0, help="each kernel's spin, milliseconds")
    parser.add_argument("--long-ms", type=float, default=200.0, help="X's kernels in the slice case, milliseconds")
    parser.add_argument("--before", type=float, default=2.0, help="seconds of work before the checkpoint")
    parser.add_argument("--after", type=float, default=3.0, help="seconds of work after the restore")
    parser.add_argument("--lock-timeout", type=float, default=30.0, help="seconds")
    args = parser.parse_args()

    import multiprocessing as mp

    lib = ctypes.CDLL("libcuda.so.1")
    for name in ("cuInit", "cuCheckpointProcessLock", "cuCheckpointProcessCheckpoint",
                 "cuCheckpointProcessRestore", "cuCheckpointProcessUnlock"):
        getattr(lib, name).restype = ctypes.c_int
    if lib.cuInit(0) != 0:
        emit({"case": "init", "ok": False, "error": "cuInit failed"})
        return 1
    ctx = mp.get_context("spawn")
    ok = True
    for case in args.cases.split(","):
        ok = run_case(ctx, lib, case, args) and ok
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
