#!/usr/bin/env python3
"""Open question of docs/design.md: between native restore and unlock, can a thread of the restored
process make driver calls? If it can, the shims could rebuild shared memory before the application
is unlocked, closing the window of the application contract.

One target process (ctypes on libcuda.so.1) holds a cuMemAlloc buffer and waits. This process locks,
checkpoints and restores it (no unlock), then asks the target to call cuMemGetInfo and cuMemAlloc on a
new thread; the target reports whether each call returned within --wait seconds and with what result.
Then this process unlocks it and the target reports again. One JSON line per observation.

Needs a GPU; no multicast API is used; the multicast switches are set for every process.
"""

import argparse
import ctypes
import json
import os
import subprocess
import sys
import tempfile
import threading
import time

import lane_common  # noqa: F401  (switches multicast off for this process and its children)


def cuda():
    lib = ctypes.CDLL("libcuda.so.1")
    for name in ("cuInit", "cuDeviceGet", "cuDevicePrimaryCtxRetain", "cuCtxSetCurrent",
                 "cuMemAlloc_v2", "cuMemGetInfo_v2", "cuCheckpointProcessLock",
                 "cuCheckpointProcessCheckpoint", "cuCheckpointProcessRestore",
                 "cuCheckpointProcessUnlock", "cuCheckpointProcessGetState"):
        getattr(lib, name).restype = ctypes.c_int
    return lib


def check(result, what):
    if result != 0:
        raise RuntimeError(f"{what} failed: CUresult {result}")


def timed_call(lib, ctx, wait):
    """cuMemGetInfo then cuMemAlloc(2 MiB) on a fresh thread; None when it did not return."""
    out = {}

    def body():
        lib.cuCtxSetCurrent(ctx)
        free, total = ctypes.c_size_t(), ctypes.c_size_t()
        out["mem_get_info"] = lib.cuMemGetInfo_v2(ctypes.byref(free), ctypes.byref(total))
        ptr = ctypes.c_uint64()
        out["mem_alloc"] = lib.cuMemAlloc_v2(ctypes.byref(ptr), ctypes.c_size_t(2 << 20))

    start = time.monotonic()
    thread = threading.Thread(target=body, daemon=True)
    thread.start()
    thread.join(wait)
    return {"returned": not thread.is_alive(), "seconds": round(time.monotonic() - start, 3), **out}


def target(directory, wait):
    lib = cuda()
    check(lib.cuInit(0), "cuInit")
    dev, ctx = ctypes.c_int(), ctypes.c_void_p()
    check(lib.cuDeviceGet(ctypes.byref(dev), 0), "cuDeviceGet")
    check(lib.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev), "cuDevicePrimaryCtxRetain")
    check(lib.cuCtxSetCurrent(ctx), "cuCtxSetCurrent")
    ptr = ctypes.c_uint64()
    check(lib.cuMemAlloc_v2(ctypes.byref(ptr), ctypes.c_size_t(64 << 20)), "cuMemAlloc")
    open(os.path.join(directory, "ready"), "w").close()
    for step in ("restored", "unlocked"):
        while not os.path.exists(os.path.join(directory, step)):
            time.sleep(0.05)
        print(json.dumps({"phase": step, **timed_call(lib, ctx, wait)}), flush=True)
        open(os.path.join(directory, step + ".done"), "w").close()
    os._exit(0)  # a thread may still be blocked inside the driver


def wait_for(path, seconds):
    deadline = time.monotonic() + seconds
    while not os.path.exists(path):
        if time.monotonic() > deadline:
            raise TimeoutError(path)
        time.sleep(0.05)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--target", metavar="DIR")
    parser.add_argument("--wait", type=float, default=10.0)
    args = parser.parse_args()
    if args.target:
        return target(args.target, args.wait)
    directory = tempfile.mkdtemp(prefix="rbu-")
    child = subprocess.Popen([sys.executable, __file__, "--target", directory, "--wait", str(args.wait)])
    lib = cuda()
    check(lib.cuInit(0), "cuInit")
    wait_for(os.path.join(directory, "ready"), 120)

    class LockArgs(ctypes.Structure):
        _fields_ = [("timeoutMs", ctypes.c_uint), ("reserved0", ctypes.c_uint),
                    ("reserved1", ctypes.c_uint64 * 7)]

    zero = (ctypes.c_uint64 * 8)()
    check(lib.cuCheckpointProcessLock(child.pid, ctypes.byref(LockArgs(10000))), "lock")
    check(lib.cuCheckpointProcessCheckpoint(child.pid, ctypes.byref(zero)), "checkpoint")
    check(lib.cuCheckpointProcessRestore(child.pid, ctypes.byref(zero)), "restore")
    state = ctypes.c_int()
    lib.cuCheckpointProcessGetState(child.pid, ctypes.byref(state))
    print(json.dumps({"phase": "state-after-restore", "state": state.value}), flush=True)
    open(os.path.join(directory, "restored"), "w").close()
    wait_for(os.path.join(directory, "restored.done"), args.wait + 30)
    check(lib.cuCheckpointProcessUnlock(child.pid, ctypes.byref(zero)), "unlock")
    open(os.path.join(directory, "unlocked"), "w").close()
    wait_for(os.path.join(directory, "unlocked.done"), args.wait + 30)
    return child.wait(timeout=30)


if __name__ == "__main__":
    sys.exit(main())
