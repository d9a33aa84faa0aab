#!/usr/bin/env python3
"""A PyTorch producer/consumer pair that keeps working while the tool acts (issue 27).

The producer (this process) shares one CUDA int32 tensor with a consumer started through
torch.multiprocessing (spawn). --allocator default: PyTorch's caching allocator on cudaMalloc, the
tensor travels as legacy CUDA IPC; --allocator expandable: PYTORCH_CUDA_ALLOC_CONF=
expandable_segments:True, it travels as a VMM (cuMemCreate) export.

Round r (1, 2, ...): the producer fills the shared tensor with base + r (base[i] = i % 1021), runs
matmuls, waits for its stream, and hands the round over on a queue; the consumer sums the tensor
(int64) and checks the sum against sum(base) + n * r, computed on the host, and answers on another
queue. While either side waits for the other it keeps running matmuls of its own, so both keep the
GPU busy all the time. The matmuls multiply small-integer float32 matrices, whose products are exact
in any order of summation: each result is compared with torch.equal against the one computed at
the start.

Protocol with the lane: busy_common (ready.json with both pids once round 1 is checked, stop file,
--max-seconds, watchdog). The producer sends "stop" to the consumer after its last round and prints
one summary line with both sides' counts. Exit 0 only if every check on both sides passed.
"""

import argparse
import os
import queue
import sys
import time

# Multicast off (lane_common) before torch is imported, here and in the spawned consumer.
import lane_common  # noqa: F401 (multicast off at module level, in spawned children too)
from busy_common import Tally, add_common_args, emit, guarded, shim_mapped, stop_requested, write_ready

MODULUS = 1021  # base[i] = i % MODULUS


def expected_sum(n, r):
    """sum(i % MODULUS for i < n) + n * r, exactly, on the host."""
    full, rest = divmod(n, MODULUS)
    return full * (MODULUS * (MODULUS - 1) // 2) + rest * (rest - 1) // 2 + n * r


class Matmuls:
    """A few exact matmuls: small-integer float32 matrices, so any summation order gives the same."""

    def __init__(self, torch, device, size, seed):
        g = torch.Generator(device="cpu").manual_seed(seed)
        self.torch = torch
        self.a = torch.randint(-4, 5, (size, size), generator=g).to(device=device, dtype=torch.float32)
        self.b = torch.randint(-4, 5, (size, size), generator=g).to(device=device, dtype=torch.float32)
        self.out = torch.empty_like(self.a)
        self.expected = (self.a.double() @ self.b.double()).float()  # exact: |sum| < 2**24

    def run(self, count):
        """`count` matmuls into one buffer; (ok, detail) of the last, compared exactly."""
        for _ in range(count):
            self.torch.matmul(self.a, self.b, out=self.out)
        if self.torch.equal(self.out, self.expected):
            return True, {}
        bad = int((self.out != self.expected).sum().item())
        return False, {"error": "matmul result differs", "mismatches": bad}


def consumer(inbox, outbox, device, size, stall_timeout):
    """Answers ("round", r) with (r, ok, detail) after summing; ("stop",) with its tally."""
    import torch

    tally = Tally("pair", "consumer", stall_timeout)
    try:
        torch.cuda.set_device(device)
        kind, tensor = inbox.get(timeout=300)
        if kind != "tensor":
            raise RuntimeError("expected the tensor, got %r" % (kind,))
        mm = Matmuls(torch, tensor.device, size, seed=2)
        outbox.put(("started", os.getpid(), shim_mapped()))
        tally.start_watchdog()
        parent = os.getppid()
        while True:
            try:
                message = inbox.get_nowait()
            except queue.Empty:
                if os.getppid() != parent:
                    return  # the producer is gone: no orphan
                ok, detail = mm.run(2)  # busy while waiting for the next round
                tally.check(ok, dict(detail, side="consumer-matmul"))
                tally.tick()
                continue
            if message[0] == "stop":
                break
            r = message[1]
            got = int(tensor.sum(dtype=torch.int64).item())
            want = expected_sum(tensor.numel(), r)
            ok = got == want
            detail = {} if ok else {"error": "sum differs", "round": r, "sum": got, "expected": want}
            tally.check(ok, detail)
            outbox.put(("round", r, ok, detail))
            tally.tick()
        del tensor
        torch.cuda.synchronize()
    except Exception as e:  # reported, so the producer does not wait for nothing
        tally.fail({"error": "%s: %s" % (type(e).__name__, e)})
    tally.finish()
    outbox.put(("summary", tally.summary()))


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--allocator", choices=["default", "expandable"], default="default")
    parser.add_argument("--size-mb", type=float, default=256, help="shared tensor size in MiB")
    parser.add_argument("--matmul", type=int, default=2048, help="matmul matrices are this square")
    add_common_args(parser, stall_default=120.0)
    args = parser.parse_args()
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
    # The watchdog waits longer than a round's own deadline, whose failure says more.
    tally = Tally("pair-" + args.allocator, "producer", args.stall_timeout + 30,
                  extra={"allocator": args.allocator, "bytes": n * 4})
    if args.require_shim and not shim_mapped():
        tally.fail({"error": "libcuinterpose.so not mapped in the producer"})
    torch.backends.cuda.matmul.allow_tf32 = False
    device = torch.device("cuda", 0)
    torch.cuda.set_device(device)
    base = (torch.arange(n, dtype=torch.int64, device=device) % MODULUS).to(torch.int32)
    shared = torch.empty(n, dtype=torch.int32, device=device)
    mm = Matmuls(torch, device, args.matmul, seed=1)
    torch.cuda.synchronize()

    ctx = mp.get_context("spawn")
    inbox, outbox = ctx.Queue(), ctx.Queue()
    proc = ctx.Process(target=consumer, args=(inbox, outbox, 0, args.matmul, args.stall_timeout))
    proc.start()
    inbox.put(("tensor", shared))
    consumer_summary = None

    def answer(deadline):
        """The consumer's next message; None when it is dead or silent until `deadline`."""
        while time.monotonic() < deadline:
            try:
                return outbox.get(timeout=0.0 if proc.is_alive() else 0.5)
            except queue.Empty:
                if not proc.is_alive():
                    return None
                ok, detail = mm.run(1)  # busy while the consumer works
                tally.check(ok, dict(detail, side="producer-matmul"))
        return None

    def round_trip(r):
        """One round: fill, matmuls, hand over, wait (busy) for the consumer's answer."""
        nonlocal consumer_summary
        torch.add(base, r, out=shared)
        ok, detail = mm.run(2)
        tally.check(ok, dict(detail, side="producer-matmul", round=r))
        torch.cuda.synchronize()  # the round's bytes are in memory before the consumer reads them
        inbox.put(("round", r))
        message = answer(time.monotonic() + args.stall_timeout)
        if message is None:
            raise RuntimeError("consumer gave no answer for round %d (exit %s)" % (r, proc.exitcode))
        if message[0] == "summary":  # the consumer ended early: its own failure says why
            consumer_summary = message[1]
            raise RuntimeError("consumer ended at round %d: %s" % (r, message[1].get("first_failure")))
        _, got_round, ok, detail = message
        tally.check(ok and got_round == r, dict(detail, side="consumer", round=r, answered=got_round))
        tally.tick()

    error = None
    try:
        started = answer(time.monotonic() + 300)
        if not started or started[0] != "started":
            raise RuntimeError("consumer did not start: %r" % (started,))
        consumer_pid, consumer_shim = started[1], started[2]
        if args.require_shim and not consumer_shim:
            tally.fail({"error": "libcuinterpose.so not mapped in the consumer"})
        round_trip(1)
        tally.start_watchdog()
        write_ready(args.ready_dir, {"pids": [pid, consumer_pid], "producer_pid": pid,
                                     "consumer_pid": consumer_pid, "workload": tally.workload})
        emit(dict(phase="ready", ok=True, pid=pid, consumer_pid=consumer_pid, shim=shim_mapped(),
                  allocator=args.allocator, alloc_conf=os.environ.get("PYTORCH_CUDA_ALLOC_CONF")))
        deadline = time.monotonic() + args.max_seconds
        r = 2
        while not stop_requested(args.ready_dir):
            if time.monotonic() > deadline:
                raise RuntimeError("no stop file within --max-seconds %.0f" % args.max_seconds)
            round_trip(r)
            r += 1
    except Exception as e:
        error = "%s: %s" % (type(e).__name__, e)
        tally.fail({"error": error})
    if proc.is_alive():
        inbox.put(("stop",))
    deadline = time.monotonic() + 120
    while consumer_summary is None and time.monotonic() < deadline:
        try:
            message = outbox.get(timeout=1.0)
        except queue.Empty:
            if not proc.is_alive():
                break
            continue
        if message[0] == "summary":
            consumer_summary = message[1]
    proc.join(timeout=max(1.0, deadline - time.monotonic()))
    if proc.is_alive():
        proc.kill()
        proc.join(timeout=10)
    if consumer_summary is None:
        tally.fail({"error": "no summary from the consumer (exit %s)" % proc.exitcode})
    elif not consumer_summary.get("ok"):
        tally.fail({"error": "consumer failed", "consumer_first_failure": consumer_summary.get("first_failure")})
    tally.finish()
    record = tally.summary(rounds=tally.iterations, consumer=consumer_summary, consumer_exit=proc.exitcode,
                           torch=torch.__version__)
    record["ok"] = record["ok"] and proc.exitcode == 0
    emit(record)
    return 0 if record["ok"] else 1


if __name__ == "__main__":
    sys.exit(guarded("pair", main))
