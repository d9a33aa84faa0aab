#!/usr/bin/env python3
"""Open question of issue 12 (docs/design.md, "Pinned carriers"): where should a pinned carrier live?

In the application (today's pinned carriers): the copies run at link speed, but the driver re-pins
the carrier at every native restore and its checkpoint takes longer with it. In a helper process that
is never checkpointed: the application holds no pinned memory; the helper imports each allocation
through its POSIX file descriptor, copies it into (or out of) memory it pinned once, and releases the
import before the native lock. This script measures both against the native checkpoint of the same
memory, in one run, without the shim: ctypes on libcuda.so.1, the memory made with cuMemCreate as the
shim makes it.

This process is the tool and the helper (it is never checkpointed); each case runs in a new
application process that it drives over a socket pair (file descriptors with SCM_RIGHTS):
  native   the application holds the allocations; lock, checkpoint, restore, unlock
  in-app   the application pins a carrier once (cuMemHostAlloc), then each cycle: copy out, release,
           lock, checkpoint, restore, unlock, recreate at the same addresses, copy in
  pageable the same with a carrier of ordinary (pageable, touched) memory: the driver stages the
           copies; what a large host carrier that is not pinned costs the native pair
  helper   this process pins the carrier once, then each cycle: the application exports each
           allocation, this process imports, maps, copies out and releases it, the application
           releases; lock, checkpoint, restore, unlock; the application recreates and exports
           again, this process copies in and releases
Every cycle checks sampled words of every allocation against their fill pattern. The GPU memory in
use (nvidia-smi) is read before this process makes its context, with it alone, and while each case's
application is checkpointed: a helper keeps a context resident while the group is suspended (its
pinned memory belongs to it). One JSON line per step, then one per case with the cycle totals, the
ratio to native and the memory in use while suspended.

Needs a GPU; no multicast API is used; the multicast switches are set for every process.
"""

import argparse
import ctypes
import json
import mmap
import os
import socket
import subprocess
import sys
import time

import lane_common  # noqa: F401  (switches multicast off for this process and its children)

POSIX_FD = 1  # CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR
PINNED = 1  # CU_MEM_ALLOCATION_TYPE_PINNED
LOCATION_DEVICE = 1  # CU_MEM_LOCATION_TYPE_DEVICE
READ_WRITE = 3  # CU_MEM_ACCESS_FLAGS_PROT_READWRITE
SAMPLE_WORDS = 1024  # words checked at each of a few offsets of every allocation


class Prop(ctypes.Structure):  # CUmemAllocationProp
    _fields_ = [("type", ctypes.c_int), ("handle_types", ctypes.c_int),
                ("location_type", ctypes.c_int), ("location_id", ctypes.c_int),
                ("win32_metadata", ctypes.c_void_p), ("compression", ctypes.c_ubyte),
                ("rdma", ctypes.c_ubyte), ("usage", ctypes.c_ushort),
                ("reserved", ctypes.c_ubyte * 4)]


class Access(ctypes.Structure):  # CUmemAccessDesc
    _fields_ = [("location_type", ctypes.c_int), ("location_id", ctypes.c_int),
                ("flags", ctypes.c_int)]


class LockArgs(ctypes.Structure):  # CUcheckpointLockArgs
    _fields_ = [("timeout_ms", ctypes.c_uint), ("reserved0", ctypes.c_uint),
                ("reserved1", ctypes.c_uint64 * 7)]


class Driver:
    def __init__(self):
        self.lib = ctypes.CDLL("libcuda.so.1")
        self.lib.cuMemImportFromShareableHandle.argtypes = [
            ctypes.POINTER(ctypes.c_uint64), ctypes.c_void_p, ctypes.c_int]
        self.call("cuInit", 0)
        dev = ctypes.c_int()
        self.call("cuDeviceGet", ctypes.byref(dev), 0)
        self.ctx = ctypes.c_void_p()
        self.call("cuDevicePrimaryCtxRetain", ctypes.byref(self.ctx), dev)
        self.call("cuCtxSetCurrent", self.ctx)
        self.prop = Prop(PINNED, POSIX_FD, LOCATION_DEVICE, 0, None, 0, 0, 0)
        self.access = Access(LOCATION_DEVICE, 0, READ_WRITE)

    def call(self, name, *args):
        result = getattr(self.lib, name)(*args)
        if result != 0:
            raise RuntimeError(f"{name} failed: CUresult {result}")

    def create(self, size):
        handle = ctypes.c_uint64()
        self.call("cuMemCreate", ctypes.byref(handle), ctypes.c_size_t(size), ctypes.byref(self.prop),
                  ctypes.c_ulonglong(0))
        return handle.value

    def reserve(self, size):
        va = ctypes.c_uint64()
        self.call("cuMemAddressReserve", ctypes.byref(va), ctypes.c_size_t(size), ctypes.c_size_t(0),
                  ctypes.c_uint64(0), ctypes.c_ulonglong(0))
        return va.value

    def map(self, va, size, handle):
        self.call("cuMemMap", ctypes.c_uint64(va), ctypes.c_size_t(size), ctypes.c_size_t(0),
                  ctypes.c_uint64(handle), ctypes.c_ulonglong(0))
        self.call("cuMemSetAccess", ctypes.c_uint64(va), ctypes.c_size_t(size),
                  ctypes.byref(self.access), ctypes.c_size_t(1))

    def unmap_release(self, va, size, handle):
        self.call("cuMemUnmap", ctypes.c_uint64(va), ctypes.c_size_t(size))
        self.call("cuMemRelease", ctypes.c_uint64(handle))

    def export(self, handle):
        fd = ctypes.c_int()
        self.call("cuMemExportToShareableHandle", ctypes.byref(fd), ctypes.c_uint64(handle), POSIX_FD,
                  ctypes.c_ulonglong(0))
        return fd.value

    def import_fd(self, fd):
        handle = ctypes.c_uint64()
        self.call("cuMemImportFromShareableHandle", ctypes.byref(handle), ctypes.c_void_p(fd), POSIX_FD)
        return handle.value

    def host_alloc(self, size):
        ptr = ctypes.c_void_p()
        self.call("cuMemHostAlloc", ctypes.byref(ptr), ctypes.c_size_t(size), ctypes.c_uint(0))
        return ptr.value

    def dtoh(self, host, va, size):
        self.call("cuMemcpyDtoH_v2", ctypes.c_void_p(host), ctypes.c_uint64(va), ctypes.c_size_t(size))

    def htod(self, va, host, size):
        self.call("cuMemcpyHtoD_v2", ctypes.c_uint64(va), ctypes.c_void_p(host), ctypes.c_size_t(size))


def gpu_used_mib():
    """Memory in use on GPU 0 by every process (nvidia-smi), in MiB."""
    out = subprocess.run(["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits",
                          "-i", "0"], capture_output=True, text=True, check=True).stdout
    return int(out.strip().splitlines()[0])


def pattern(index, offset):
    return (0x9E3779B1 * (index + 1) + offset) & 0xFFFFFFFF


def send(sock, message, fds=()):
    data = json.dumps(message).encode() + b"\n"
    if fds:
        socket.send_fds(sock, [data], list(fds))
    else:
        sock.sendall(data)


class Reader:
    def __init__(self, sock):
        self.sock, self.buffer, self.fds = sock, b"", []

    def receive(self):
        while b"\n" not in self.buffer:
            data, fds, _, _ = socket.recv_fds(self.sock, 1 << 16, 256)
            if not data:
                raise EOFError("peer closed")
            self.buffer += data
            self.fds += fds
        line, self.buffer = self.buffer.split(b"\n", 1)
        return json.loads(line)


def application(fd, count, size):
    """The application: holds `count` allocations of `size` bytes and does what it is told."""
    cu = Driver()
    sock = socket.socket(fileno=fd)
    reader = Reader(sock)
    vas = [cu.reserve(size) for _ in range(count)]
    handles = [cu.create(size) for _ in range(count)]
    for i, (va, handle) in enumerate(zip(vas, handles)):
        cu.map(va, size, handle)
        # Each 4 KiB page holds the same words: pattern(i, 0..1023); checked at sampled pages.
        words = (ctypes.c_uint32 * SAMPLE_WORDS)(*[pattern(i, w) for w in range(SAMPLE_WORDS)])
        cu.call("cuMemcpyHtoD_v2", ctypes.c_uint64(va), words, ctypes.c_size_t(4096))
        for step in range(1, 64):
            if (4096 << step) > size:
                break
            done = 4096 << (step - 1)
            cu.call("cuMemcpyDtoD_v2", ctypes.c_uint64(va + done), ctypes.c_uint64(va),
                    ctypes.c_size_t(min(done, size - done)))
    cu.call("cuCtxSynchronize")
    carrier, keep = None, None
    send(sock, {"ready": os.getpid()})
    while True:
        order = reader.receive()
        what = order["do"]
        start = time.monotonic()
        reply = {}
        if what == "pin":
            carrier = cu.host_alloc(size * count)
            ctypes.memset(carrier, 0, size * count)
        elif what == "pageable":
            keep = mmap.mmap(-1, size * count)  # anonymous, private to this process
            carrier = ctypes.addressof(ctypes.c_char.from_buffer(keep))
            ctypes.memset(carrier, 0, size * count)
        elif what == "save":
            for i, va in enumerate(vas):
                cu.dtoh(carrier + i * size, va, size)
        elif what == "load":
            for i, va in enumerate(vas):
                cu.htod(va, carrier + i * size, size)
        elif what == "release":
            for va, handle in zip(vas, handles):
                cu.unmap_release(va, size, handle)
        elif what == "recreate":
            handles = [cu.create(size) for _ in range(count)]
            for va, handle in zip(vas, handles):
                cu.map(va, size, handle)
        elif what == "export":
            fds = [cu.export(h) for h in handles]
            send(sock, {"fds": len(fds), "millis": (time.monotonic() - start) * 1e3}, fds)
            for f in fds:
                os.close(f)
            continue
        elif what == "check":
            bad = 0
            for i, va in enumerate(vas):
                for page in (0, size // 2 // 4096, size // 4096 - 1):
                    words = (ctypes.c_uint32 * SAMPLE_WORDS)()
                    cu.dtoh(ctypes.addressof(words), va + page * 4096, 4096)
                    bad += sum(1 for w in range(SAMPLE_WORDS) if words[w] != pattern(i, w))
            reply["bad_words"] = bad
        elif what == "exit":
            os._exit(0)
        cu.call("cuCtxSynchronize")
        reply["millis"] = (time.monotonic() - start) * 1e3
        send(sock, reply)


class Case:
    """One application process, driven from here."""

    def __init__(self, name, count, size):
        self.name = name
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        self.child = subprocess.Popen(
            [sys.executable, __file__, "--application", str(theirs.fileno()), "--count", str(count),
             "--size", str(size)], pass_fds=[theirs.fileno()])
        theirs.close()
        self.sock, self.reader = ours, Reader(ours)
        self.pid = self.reader.receive()["ready"]

    def order(self, what):
        send(self.sock, {"do": what})
        return self.reader.receive()

    def step(self, cycle, what, millis, **extra):
        print(json.dumps({"case": self.name, "cycle": cycle, "step": what, "millis": round(millis, 1),
                          **extra}), flush=True)
        return millis

    def app(self, cycle, what):
        reply = self.order(what)
        if reply.get("bad_words"):
            raise RuntimeError(f"{self.name} cycle {cycle}: {reply['bad_words']} words differ")
        return self.step(cycle, what, reply["millis"])

    def close(self):
        send(self.sock, {"do": "exit"})
        self.child.wait(timeout=60)


def native_pair(cu, case, cycle):
    """Lock + checkpoint, restore + unlock of the application: (suspend ms, resume ms)."""
    zero = (ctypes.c_uint64 * 8)()
    start = time.monotonic()
    cu.call("cuCheckpointProcessLock", case.pid, ctypes.byref(LockArgs(30000)))
    cu.call("cuCheckpointProcessCheckpoint", case.pid, ctypes.byref(zero))
    down = case.step(cycle, "native lock+checkpoint", (time.monotonic() - start) * 1e3)
    case.suspended_mib = gpu_used_mib()
    start = time.monotonic()
    cu.call("cuCheckpointProcessRestore", case.pid, ctypes.byref(zero))
    cu.call("cuCheckpointProcessUnlock", case.pid, ctypes.byref(zero))
    up = case.step(cycle, "native restore+unlock", (time.monotonic() - start) * 1e3)
    return down, up


def helper_copy(cu, case, cycle, carrier, count, size, out):
    """The helper's side of one direction: import each exported allocation, map it, copy, release."""
    reply = case.order("export")
    fds, case.reader.fds = case.reader.fds[:count], case.reader.fds[count:]
    export_ms = case.step(cycle, "export", reply["millis"])
    start = time.monotonic()
    va = cu.reserve(size * count)
    handles = [cu.import_fd(fd) for fd in fds]
    for fd in fds:
        os.close(fd)
    for i, handle in enumerate(handles):
        cu.map(va + i * size, size, handle)
    mapped = time.monotonic()
    for i in range(count):
        if out:
            cu.dtoh(carrier + i * size, va + i * size, size)
        else:
            cu.htod(va + i * size, carrier + i * size, size)
    cu.call("cuCtxSynchronize")
    copied = time.monotonic()
    for i, handle in enumerate(handles):
        cu.unmap_release(va + i * size, size, handle)
    cu.call("cuMemAddressFree", ctypes.c_uint64(va), ctypes.c_size_t(size * count))
    done = time.monotonic()
    gb_s = size * count / (copied - mapped) / 1e9
    case.step(cycle, "helper import+map", (mapped - start) * 1e3)
    case.step(cycle, "helper copy " + ("out" if out else "in"), (copied - mapped) * 1e3,
              gb_per_s=round(gb_s, 1))
    case.step(cycle, "helper unmap+release", (done - copied) * 1e3)
    return export_ms + (done - start) * 1e3


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--application", type=int, metavar="FD")
    parser.add_argument("--count", type=int, default=8, help="allocations")
    parser.add_argument("--size", type=int, default=1 << 30, help="bytes per allocation")
    parser.add_argument("--cycles", type=int, default=2)
    args = parser.parse_args()
    if args.application is not None:
        return application(args.application, args.count, args.size)
    total = args.count * args.size
    before_mib = gpu_used_mib()
    cu = Driver()
    context_mib = gpu_used_mib() - before_mib
    print(json.dumps({"gpu_used_mib_before": before_mib, "context_mib": context_mib}), flush=True)
    results, suspended = {}, {}

    case = Case("native", args.count, args.size)
    cycles = []
    for cycle in range(1, args.cycles + 1):
        down, up = native_pair(cu, case, cycle)
        case.app(cycle, "check")
        cycles.append((down, up))
    case.close()
    results["native"], suspended["native"] = cycles, case.suspended_mib

    for name, carrier in (("in-app", "pin"), ("pageable", "pageable")):
        case = Case(name, args.count, args.size)
        case.app(0, carrier)
        cycles = []
        for cycle in range(1, args.cycles + 1):
            down = case.app(cycle, "save") + case.app(cycle, "release")
            native_down, native_up = native_pair(cu, case, cycle)
            up = case.app(cycle, "recreate") + case.app(cycle, "load")
            case.app(cycle, "check")
            cycles.append((down + native_down, native_up + up))
        case.close()
        results[name], suspended[name] = cycles, case.suspended_mib

    start = time.monotonic()
    carrier = cu.host_alloc(total)
    ctypes.memset(carrier, 0, total)
    case = Case("helper", args.count, args.size)
    case.step(0, "helper pin", (time.monotonic() - start) * 1e3)
    cycles = []
    for cycle in range(1, args.cycles + 1):
        down = helper_copy(cu, case, cycle, carrier, args.count, args.size, True)
        down += case.app(cycle, "release")
        native_down, native_up = native_pair(cu, case, cycle)
        up = case.app(cycle, "recreate")
        up += helper_copy(cu, case, cycle, carrier, args.count, args.size, False)
        case.app(cycle, "check")
        cycles.append((down + native_down, native_up + up))
    case.close()
    results["helper"], suspended["helper"] = cycles, case.suspended_mib

    native = sum(results["native"][-1])
    for name, cycles in results.items():
        down, up = cycles[-1]
        print(json.dumps({"case": name, "summary": True, "bytes": total, "last_cycle": args.cycles,
                          "suspend_ms": round(down, 1), "resume_ms": round(up, 1),
                          "x_native": round(native / (down + up), 2),
                          # Less what was in use before this process started; its own context
                          # (context_mib) is counted: it is the helper's in the helper case.
                          "suspended_used_mib": suspended[name] - before_mib,
                          "context_mib": context_mib}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
