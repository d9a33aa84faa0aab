#!/usr/bin/env python3
"""Two CuPy processes whose kernels meet every round by spinning on each other's flags in shared
IPC device memory (the pattern of vLLM's custom all-reduce), kept running while the tool acts
(issue 27; the lane suspends and resumes them, no checkpoint).

Each rank allocates one buffer with cudaMalloc (not from CuPy's pool, so the pointer is the
allocation's base, which is what the peer's ipcOpenMemHandle returns), zeroes it, and the two
exchange `cupy.cuda.runtime.ipcGetMemHandle` handles over multiprocessing queues and open each
other's with `ipcOpenMemHandle`, as cupy_ipc.py does. Rank 0 is this process; rank 1 is started
with the spawn method. Buffer layout (uint32 words): [0, 1] flags (flag[j] of rank k's buffer is
written by rank j), [32, 32 + 2 * WORDS) two data slots, used by round parity.

Round r (1, 2, ...), one single-block kernel per rank:
  1. write own data slot r % 2: word i = r * 131 + rank * 7 + i;
  2. __threadfence_system(), then thread 0 writes r into the peer's buffer, flag[rank];
  3. thread 0 spins, with no timeout, until its own buffer's flag[peer] >= r (volatile loads);
  4. read the peer's slot r % 2 (volatile), write own + peer into an output array.
Two slots are enough: a rank can be at most one round ahead of the other (it cannot finish round
r + 1 before the other has written flag r + 1, which comes after the other finished round r).
The host copies the output and checks every word against 2 * r * 131 + 7 + 2 * i (mod 2**32).
On one GPU the two contexts are time-sliced, so a round costs a context switch or two: hundreds of
rounds a second.

The host side detects a stall: it polls the round's event, and a round not complete in
--stall-timeout (60) seconds is a failure (summary line, exit 1); the watchdog of busy_common also
catches a host call that never returns. Stopping: rank 0 sees READY_DIR/stop after round R, sets a
shared stop round R + 1 (rank 1 may already be spinning in it), runs R + 1 and ends; rank 1 ends
after the last round at most the stop round. Output and exit status as every busy workload.
"""

import argparse
import os
import queue
import sys
import time

# Multicast off (lane_common) before cupy is imported, here and in the spawned rank.
import lane_common  # noqa: F401 (multicast off at module level, in spawned children too)
from busy_common import Tally, add_common_args, emit, guarded, shim_mapped, stop_requested, write_ready

WORDS = 1024  # words per data slot
HEADER = 32  # words before the data slots (the two flags, padded)
THREADS = 256
BYTES = 2 << 20  # each rank's buffer: the header and two slots, in an allocation of a usual size

KERNEL = r"""
extern "C" __global__ void meet(unsigned int* own, unsigned int* peer, int rank, unsigned int round,
                                unsigned int* out, int words) {
    int slot = 32 + (int)(round & 1u) * words;
    unsigned int* mine = own + slot;
    volatile unsigned int* theirs = (volatile unsigned int*)(peer + slot);
    for (int i = threadIdx.x; i < words; i += blockDim.x) {
        mine[i] = round * 131u + (unsigned int)rank * 7u + (unsigned int)i;
    }
    __threadfence_system();  // the data is visible everywhere before the flag that announces it
    __syncthreads();
    if (threadIdx.x == 0) {
        volatile unsigned int* their_flag_of_me = (volatile unsigned int*)(peer + rank);
        volatile unsigned int* my_flag_of_them = (volatile unsigned int*)(own + (1 - rank));
        *their_flag_of_me = round;
        __threadfence_system();
        while (*my_flag_of_them < round) {
            // spin: no timeout here, as in vLLM's barrier; the host detects a stall
        }
        __threadfence_system();
    }
    __syncthreads();
    for (int i = threadIdx.x; i < words; i += blockDim.x) {
        out[i] = mine[i] + theirs[i];
    }
}
"""


def rank_loop(cp, rank, own, peer, stop_round, should_stop, alive, stall_timeout, tally, on_first_round):
    """Runs rounds until the stop round, which rank 0 sets once `should_stop()` (None for rank 1)
    says so; returns an error string for a stalled round or a gone peer (`alive()` false), else None."""
    import numpy as np

    kernel = cp.RawKernel(KERNEL, "meet")
    out = cp.zeros(WORDS, dtype=cp.uint32)
    cp.cuda.runtime.deviceSynchronize()  # the zeroing, on the null stream, before any round's kernel
    stream = cp.cuda.Stream(non_blocking=True)  # does not wait for the null stream
    expected_base = (np.arange(WORDS, dtype=np.uint64) * 2 + 7) & 0xFFFFFFFF
    r = 1
    while True:
        last = stop_round.value
        if last and r > last:
            return None
        with stream:
            kernel((1,), (THREADS,), (np.uint64(own), np.uint64(peer), np.int32(rank), np.uint32(r), out,
                                     np.int32(WORDS)))
            event = stream.record()
        deadline = time.monotonic() + stall_timeout
        while not event.done:
            if time.monotonic() > deadline:
                return "round %d did not complete in %.0f s (stalled: the peer never met it); %s" % (
                    r, stall_timeout, flags_seen(cp, own, peer))
            if not alive():
                return "round %d: the peer process is gone (stalled: it will never meet it)" % r
            time.sleep(0.0001)
        got = out.get()  # the round is complete: a plain synchronous copy
        want = ((expected_base + 2 * 131 * r) & 0xFFFFFFFF).astype(np.uint32)
        if not np.array_equal(got, want):
            bad = int(np.flatnonzero(got != want)[0])
            tally.fail({"error": "reduction differs", "round": r, "word": bad,
                        "got": int(got[bad]), "expected": int(want[bad])})
        tally.tick()
        if r == 1:
            on_first_round()
            tally.start_watchdog()
        if should_stop is not None and not stop_round.value and should_stop():
            stop_round.value = r + 1  # rank 1 may already spin in round r + 1: meet it there, then end
        r += 1


def flags_seen(cp, own, peer):
    """The two flag words of each buffer as this rank's mappings show them, copied on a stream of
    their own while the round's kernel still spins: which side's writes never arrived."""
    import numpy as np

    try:
        side = cp.cuda.Stream(non_blocking=True)
        seen = {}
        for name, base in (("own", own), ("peer", peer)):
            host = np.zeros(2, dtype=np.uint32)
            cp.cuda.runtime.memcpyAsync(host.ctypes.data, base, 8, cp.cuda.runtime.memcpyDeviceToHost, side.ptr)
            side.synchronize()
            seen[name] = [int(v) for v in host]
        return "flags seen: own %s, peer %s" % (seen["own"], seen["peer"])
    except Exception as e:  # a diagnostic only: the stall is the failure
        return "flags not readable: %s" % e


def open_peer(cp, handle):
    return cp.cuda.runtime.ipcOpenMemHandle(handle)


def rank1(inbox, outbox, stop_round, stall_timeout):
    """The spawned rank: exchanges handles, then rounds; sends its summary at the end."""
    import cupy as cp

    # The watchdog waits longer than a round's own poll, whose failure says more.
    tally = Tally("spin", "rank1", stall_timeout + 30)
    error = None
    try:
        cp.cuda.Device(0).use()
        own = cp.cuda.runtime.malloc(BYTES)
        cp.cuda.runtime.memset(own, 0, BYTES)
        cp.cuda.runtime.deviceSynchronize()
        kind, handle = inbox.get(timeout=300)
        if kind != "handle":
            raise RuntimeError("expected rank 0's handle, got %r" % (kind,))
        peer = open_peer(cp, handle)
        outbox.put(("handle", cp.cuda.runtime.ipcGetMemHandle(own), os.getpid(), shim_mapped()))
        parent = os.getppid()
        error = rank_loop(cp, 1, own, peer, stop_round, None, lambda: os.getppid() == parent,
                          stall_timeout, tally, lambda: None)
        tally.finish()
        if error is None:  # a stalled kernel may still use both buffers: leave them to the exit
            cp.cuda.runtime.deviceSynchronize()
            cp.cuda.runtime.ipcCloseMemHandle(peer)
            cp.cuda.runtime.free(own)
    except Exception as e:
        error = "%s: %s" % (type(e).__name__, e)
    if error:
        tally.fail({"error": error})
    tally.finish()
    outbox.put(("summary", tally.summary()))
    if error and "stalled" in error:
        # The kernel still spins: leave without cleaning up (the context goes with the process),
        # once the queue's feeder thread has written the summary into the pipe.
        outbox.close()
        outbox.join_thread()
        sys.stdout.flush()
        os._exit(1)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_common_args(parser)
    args = parser.parse_args()

    import multiprocessing as mp

    import cupy as cp

    pid = os.getpid()
    tally = Tally("spin", "rank0", args.stall_timeout + 30)  # longer than a round's own poll
    if args.require_shim and not shim_mapped():
        tally.fail({"error": "libcuinterpose.so not mapped in rank 0"})
    ctx = mp.get_context("spawn")
    inbox, outbox = ctx.Queue(), ctx.Queue()
    stop_round = ctx.Value("q", 0, lock=False)  # shared memory: seen by rank 1 at once, no feeder thread
    proc = ctx.Process(target=rank1, args=(inbox, outbox, stop_round, args.stall_timeout))
    error = None
    rank1_summary = None
    started = time.monotonic()
    ready_at = []  # when round 1 was done: the rate counts from there to the loop's end
    loop_end = [None]
    try:
        cp.cuda.Device(0).use()
        own = cp.cuda.runtime.malloc(BYTES)
        cp.cuda.runtime.memset(own, 0, BYTES)
        cp.cuda.runtime.deviceSynchronize()
        proc.start()
        inbox.put(("handle", cp.cuda.runtime.ipcGetMemHandle(own)))
        try:
            answer = outbox.get(timeout=300)
        except queue.Empty:
            answer = None
        if not answer or answer[0] != "handle":
            raise RuntimeError("rank 1 sent no handle: %r (exit %s)" % (answer, proc.exitcode))
        _, handle, rank1_pid, rank1_shim = answer
        if args.require_shim and not rank1_shim:
            tally.fail({"error": "libcuinterpose.so not mapped in rank 1"})
        peer = open_peer(cp, handle)

        def ready():
            ready_at.append(time.monotonic())
            write_ready(args.ready_dir, {"pids": [pid, rank1_pid], "rank0_pid": pid, "rank1_pid": rank1_pid,
                                         "workload": "spin"})
            emit(dict(phase="ready", ok=True, pid=pid, rank1_pid=rank1_pid, shim=shim_mapped(),
                      cupy=cp.__version__))

        timed_out = []

        def should_stop():
            if time.monotonic() - started > args.max_seconds:
                timed_out.append(True)
                return True
            return stop_requested(args.ready_dir)

        error = rank_loop(cp, 0, own, peer, stop_round, should_stop, proc.is_alive, args.stall_timeout,
                          tally, ready)
        loop_end[0] = time.monotonic()
        tally.finish()  # the waits below are bounded by their own deadlines
        if error is None and timed_out:
            error = "no stop file within --max-seconds %.0f" % args.max_seconds
        if error is None:
            cp.cuda.runtime.deviceSynchronize()
            cp.cuda.runtime.ipcCloseMemHandle(peer)
            cp.cuda.runtime.free(own)
    except Exception as e:
        error = "%s: %s" % (type(e).__name__, e)
    if error:
        tally.fail({"error": error})
        stop_round.value = stop_round.value or 1  # rank 1 stops at its next round boundary
    deadline = time.monotonic() + args.stall_timeout + 30
    while rank1_summary is None and proc.is_alive() and time.monotonic() < deadline:
        try:
            message = outbox.get(timeout=1.0)
        except queue.Empty:
            continue
        if message[0] == "summary":
            rank1_summary = message[1]
    try:
        message = outbox.get(timeout=1.0) if rank1_summary is None else None
        if message and message[0] == "summary":
            rank1_summary = message[1]
    except queue.Empty:
        pass
    proc.join(timeout=10)
    if proc.is_alive():
        proc.kill()
        proc.join(timeout=10)
    if rank1_summary is None:
        tally.fail({"error": "no summary from rank 1 (exit %s)" % proc.exitcode})
    elif not rank1_summary.get("ok"):
        tally.fail({"error": "rank 1 failed", "rank1_first_failure": rank1_summary.get("first_failure")})
    tally.finish()
    end = loop_end[0] or time.monotonic()
    rate = (tally.iterations - 1) / max(end - ready_at[0], 1e-9) if ready_at else 0.0
    record = tally.summary(rounds=tally.iterations, rounds_per_s=round(rate, 1),
                           rank1=rank1_summary, rank1_exit=proc.exitcode)
    record["ok"] = record["ok"] and proc.exitcode == 0
    emit(record)
    if error and "stalled" in error:
        sys.stdout.flush()
        os._exit(1)  # the kernel still spins: no orderly teardown
    return 0 if record["ok"] else 1


if __name__ == "__main__":
    sys.exit(guarded("spin", main))
