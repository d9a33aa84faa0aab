#!/usr/bin/env python3
"""For contrast: what the driver's own checkpoint does to a running group of CUDA processes, without
cuinterpose (issue: tensor-parallel NCCL). Every process is locked, checkpointed, restored and
unlocked with the cuCheckpointProcess* API, all processes at each step before the next step; each
call runs on its own thread and is given --limit seconds, since on r580 such a call can hang when the
process shares memory with another (docs/measurements.md).

Usage: native_contrast.py --pids PID[,PID...] [--limit S]

Output: one JSON line per call, {"step", "pid", "result" (CUresult), "seconds"}, or "hung": true
when it had not returned within the limit; then {"step": "summary", "outcome": ...}: "ok" when every
call succeeded, else the first failed or hung call. A hung call cannot be cancelled: the script then
prints the summary and exits at once (exit status 3). Exit status 0 when every call succeeded, 1
otherwise, 2 on bad arguments.

No multicast API is used; the multicast switches are set for this process like every other.
"""

import argparse
import ctypes
import os
import sys
import threading
import time

from lane_common import emit  # also switches multicast off


class LockArgs(ctypes.Structure):
    _fields_ = [("timeoutMs", ctypes.c_uint), ("reserved0", ctypes.c_uint),
                ("reserved1", ctypes.c_uint64 * 7)]


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pids", required=True, help="comma-separated host PIDs")
    parser.add_argument("--limit", type=float, default=60.0, help="seconds per call")
    args = parser.parse_args()
    try:
        pids = [int(p) for p in args.pids.split(",") if p]
    except ValueError:
        parser.error("--pids takes comma-separated integers")
    if not pids or args.limit <= 0:
        parser.error("--pids needs at least one PID and --limit must be positive")

    lib = ctypes.CDLL("libcuda.so.1")
    names = ("cuInit", "cuCheckpointProcessLock", "cuCheckpointProcessCheckpoint",
             "cuCheckpointProcessRestore", "cuCheckpointProcessUnlock")
    for name in names:
        getattr(lib, name).restype = ctypes.c_int
    result = lib.cuInit(0)
    if result != 0:
        emit({"step": "summary", "outcome": "cuInit failed: %d" % result})
        return 1

    lock_args = LockArgs(int(args.limit * 1000))
    zero = (ctypes.c_uint64 * 8)()
    steps = [("lock", lambda pid: lib.cuCheckpointProcessLock(pid, ctypes.byref(lock_args))),
             ("checkpoint", lambda pid: lib.cuCheckpointProcessCheckpoint(pid, ctypes.byref(zero))),
             ("restore", lambda pid: lib.cuCheckpointProcessRestore(pid, ctypes.byref(zero))),
             ("unlock", lambda pid: lib.cuCheckpointProcessUnlock(pid, ctypes.byref(zero)))]
    first_failure = None
    for step, call in steps:
        results, threads, started = {}, {}, time.monotonic()
        for pid in pids:
            def body(pid=pid):
                results[pid] = call(pid)
            threads[pid] = threading.Thread(target=body, daemon=True)
            threads[pid].start()
        hung = False
        for pid, thread in threads.items():
            thread.join(max(0.0, started + args.limit - time.monotonic()))
            record = {"step": step, "pid": pid, "seconds": round(time.monotonic() - started, 3)}
            if thread.is_alive():
                record["hung"], hung = True, True
                first_failure = first_failure or "%s of pid %d hung (> %.0f s)" % (step, pid, args.limit)
            else:
                record["result"] = results[pid]
                if results[pid] != 0:
                    first_failure = first_failure or "%s of pid %d: CUresult %d" % (step, pid, results[pid])
            emit(record)
        if hung:
            emit({"step": "summary", "outcome": first_failure})
            os._exit(3)  # a thread is stuck inside the driver
        if step == "lock" and first_failure:
            break  # nothing was locked to go on with
    emit({"step": "summary", "outcome": first_failure or "ok"})
    return 0 if first_failure is None else 1


if __name__ == "__main__":
    sys.exit(main())
