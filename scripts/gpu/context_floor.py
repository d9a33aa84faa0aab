#!/usr/bin/env python3
"""What the native checkpoint of a nearly empty process costs, and what of the context it moves.

After the shims release every allocation they own, the driver's checkpoint and restore still take
280-500 ms per process on the H200 (docs/measurements.md): the floor of every suspend. A context
holds about 500 MiB of device memory of its own, and the driver moves device memory at 2-6 GB/s, so
the question is how much of that memory is the per-thread local memory (stack) the context reserves
for kernels, which the driver sizes again at the next launch that needs it (cuCtxSetLimit:
"the driver will automatically increase the per-thread stack size for each kernel launch as
needed"), and whether shrinking it before the lock shortens the native pair.

Each case runs in a new application process (this process only calls cuInit and the checkpoint API
on the child's pid, as the tool does):
  context    the primary context and one 2 MiB cuMemAlloc, memset once (a kernel of the driver's)
  stack-min  the same, then CU_LIMIT_STACK_SIZE set to its smallest before the lock, and set back
             to its value after the unlock (timed)
Every cycle checks the allocation's bytes after the restore. One JSON line per cycle: the free
device memory the child saw (cuMemGetInfo) before and after the limit change, the four native
steps' times, the time to set the limit back, and whether the bytes survived.

Needs a GPU; no multicast API is used; the multicast switches are set for every process.
"""

import argparse
import ctypes
import json
import os
import socket
import subprocess
import sys
import time

import lane_common  # noqa: F401  (switches multicast off for this process and its children)

STACK_SIZE = 0  # CU_LIMIT_STACK_SIZE


class LockArgs(ctypes.Structure):  # CUcheckpointLockArgs
    _fields_ = [("timeout_ms", ctypes.c_uint), ("reserved0", ctypes.c_uint),
                ("reserved1", ctypes.c_uint64 * 7)]


def load():
    lib = ctypes.CDLL("libcuda.so.1")

    def call(name, *args):
        result = getattr(lib, name)(*args)
        if result != 0:
            raise RuntimeError(f"{name} failed: CUresult {result}")
    call("cuInit", 0)
    return lib, call


def child(sock):
    lib, call = load()
    dev = ctypes.c_int()
    call("cuDeviceGet", ctypes.byref(dev), 0)
    ctx = ctypes.c_void_p()
    call("cuDevicePrimaryCtxRetain", ctypes.byref(ctx), dev)
    call("cuCtxSetCurrent", ctx)
    size = 2 << 20
    ptr = ctypes.c_uint64()
    call("cuMemAlloc_v2", ctypes.byref(ptr), ctypes.c_size_t(size))
    call("cuMemsetD8_v2", ptr, ctypes.c_ubyte(0x5A), ctypes.c_size_t(size))
    call("cuCtxSynchronize")

    def free_mib():
        free, total = ctypes.c_size_t(), ctypes.c_size_t()
        call("cuMemGetInfo_v2", ctypes.byref(free), ctypes.byref(total))
        return free.value >> 20

    stack = ctypes.c_size_t()
    call("cuCtxGetLimit", ctypes.byref(stack), STACK_SIZE)
    original = stack.value
    io = sock.makefile("rw")
    io.write(json.dumps({"pid": os.getpid(), "stack": original, "free_mib": free_mib()}) + "\n")
    io.flush()
    for line in io:
        order = json.loads(line)
        reply = {}
        if order["do"] == "shrink":
            start = time.monotonic()
            call("cuCtxSetLimit", STACK_SIZE, ctypes.c_size_t(order["to"]))
            call("cuCtxGetLimit", ctypes.byref(stack), STACK_SIZE)
            reply = {"shrink_ms": (time.monotonic() - start) * 1e3, "stack": stack.value,
                     "free_mib": free_mib()}
        elif order["do"] == "grow":
            start = time.monotonic()
            call("cuCtxSetLimit", STACK_SIZE, ctypes.c_size_t(original))
            reply = {"grow_ms": (time.monotonic() - start) * 1e3, "free_mib": free_mib()}
        elif order["do"] == "check":
            host = (ctypes.c_ubyte * size)()
            call("cuMemsetD8_v2", ptr, ctypes.c_ubyte(0x5A), ctypes.c_size_t(16))
            call("cuMemcpyDtoH_v2", host, ptr, ctypes.c_size_t(size))
            reply = {"intact": all(b == 0x5A for b in bytes(host)), "free_mib": free_mib()}
        elif order["do"] == "exit":
            return
        io.write(json.dumps(reply) + "\n")
        io.flush()


def run_case(name, cycles, shrink_to):
    lib, call = load()
    parent, theirs = socket.socketpair()
    proc = subprocess.Popen([sys.executable, __file__, "--child", str(theirs.fileno())],
                            pass_fds=[theirs.fileno()])
    theirs.close()
    io = parent.makefile("rw")

    def ask(order):
        io.write(json.dumps(order) + "\n")
        io.flush()
        return json.loads(io.readline())
    hello = json.loads(io.readline())
    pid = hello["pid"]
    try:
        for cycle in range(1, cycles + 1):
            record = {"case": name, "cycle": cycle, "stack": hello["stack"],
                      "free_mib_before": ask({"do": "check"})["free_mib"]}
            if shrink_to is not None:
                shrunk = ask({"do": "shrink", "to": shrink_to})
                record.update(shrink_ms=shrunk["shrink_ms"], stack_shrunk=shrunk["stack"],
                              free_mib_shrunk=shrunk["free_mib"])
            lock, zero = LockArgs(10000, 0), (ctypes.c_uint64 * 8)()
            for step, fn, arg in (("lock", "cuCheckpointProcessLock", ctypes.byref(lock)),
                                  ("checkpoint", "cuCheckpointProcessCheckpoint", ctypes.byref(zero)),
                                  ("restore", "cuCheckpointProcessRestore", ctypes.byref(zero)),
                                  ("unlock", "cuCheckpointProcessUnlock", ctypes.byref(zero))):
                start = time.monotonic()
                call(fn, ctypes.c_int(pid), arg)
                record[f"{step}_ms"] = (time.monotonic() - start) * 1e3
            if shrink_to is not None:
                grown = ask({"do": "grow"})
                record.update(grow_ms=grown["grow_ms"], free_mib_grown=grown["free_mib"])
            checked = ask({"do": "check"})
            record.update(intact=checked["intact"], free_mib_after=checked["free_mib"])
            print(json.dumps(record, sort_keys=True), flush=True)
            if not checked["intact"]:
                raise RuntimeError(f"{name}: bytes lost in cycle {cycle}")
        io.write(json.dumps({"do": "exit"}) + "\n")
        io.flush()
    finally:
        if proc.wait(timeout=30) != 0:
            raise RuntimeError(f"{name}: child exited {proc.returncode}")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--child", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--cycles", type=int, default=3)
    args = parser.parse_args()
    if args.child is not None:
        child(socket.socket(fileno=args.child))
        return
    run_case("context", args.cycles, None)
    run_case("stack-min", args.cycles, 0)


if __name__ == "__main__":
    main()
