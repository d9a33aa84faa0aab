#!/usr/bin/env python3
"""An NCCL tensor-parallel-style torch.distributed group whose CUDA graph outlives a barrier.

How the lane uses it:
  cuinterpose run --pid-namespace -- python3 scripts/gpu/nccl_tp.py --mode barrier \\
      --barrier-dir D --world-size N --require-shim &
  # once D/ready.json exists, with R its root_pid: either
  cuinterpose suspend --pid R; cuinterpose resume --pid R
  # or
  cuinterpose checkpoint --pid R --dir C; cuinterpose restore --dir C [--device-map 0=1,1=0]
  touch D/go

Rank 0 is this process; it starts ranks 1..N-1 (spawn), so the group is one process tree rooted
here. Rank r uses cuda:r. Rendezvous: a FileStore at BARRIER_DIR/rendezvous (a temporary directory
in plain mode), so no TCP at the torch layer (NCCL's own bootstrap still opens its sockets).

Modes:
  plain    every phase straight through.
  barrier  after graph-before, rank 0 writes BARRIER_DIR/ready.json ({"root_pid", "pids",
           "world_size"}, atomically) and every rank idles (no GPU work, no collective) polling
           for BARRIER_DIR/go, up to --timeout s; then the after phases run.

Phases, one record per rank (ready and done: rank 0 only):
  start             process group up; shim mapped?, NCCL version, multicast switches
  allreduce-before  --iters all_reduce SUMs of a --size-mb float32 tensor filled with rank+1+it,
                    every element checked against the sum over ranks
  graph-before      (--graph) an all_reduce captured into a CUDAGraph after a side-stream warm-up,
                    replayed once and checked
  ready             (barrier mode) ready.json written; pids, NCCL version
  allreduce-after   the last tensor of allreduce-before still holds its sum; --iters more
  graph-after       the static tensor still holds its sum; refilled in place, the graph captured
                    before the barrier replayed and checked
  done              process groups destroyed, ranks joined: their exit codes
A rank whose phase raises stops there (its collectives no longer match); one whose go never comes
reports "go". Every record carries memory_allocated (torch's, bytes). Pids are as this script sees
them (namespace pids under `cuinterpose run --pid-namespace`).

Output: one JSON line per phase per rank on stdout, all printed by rank 0 (the others send theirs
through a multiprocessing Queue, so a rank whose collective fails still reports):
  {"phase": "...", "ok": true|false, "rank": R, "pid": N, ...}, last {"phase": "done", "ok": ...}
Exit status: 0 when every phase is ok, 1 otherwise, 2 on bad arguments or too few GPUs.

Every process started here runs with NCCL_NVLS_ENABLE=0, TORCH_SYMM_MEM_DISABLE_MULTICAST=1 and
NVSHMEM_DISABLE_NVLS=1 (set below, before torch is imported, and inherited by the other ranks).
"""

import argparse
import collections
import datetime
import json
import os
import queue
import shutil
import sys
import tempfile
import time

# Switches multicast off before torch is imported (see lane_common).
from lane_common import MULTICAST_OFF, emit, shim_mapped


def check(torch, tensor, expected):
    """(ok, detail) for every element of `tensor` equal to the float `expected`."""
    torch.cuda.synchronize()
    diff = tensor != expected
    bad = int(diff.sum().item())
    if bad == 0:
        return True, {}
    first = int(torch.nonzero(diff)[0].item())
    return False, {"mismatches": bad, "first": first, "expected": expected,
                   "actual": float(tensor[first].item())}


def nccl_version(torch):
    version = torch.cuda.nccl.version()  # a tuple in torch 2.x, an int in older ones
    return list(version) if isinstance(version, tuple) else version


def wait_for_go(path, timeout, parent):
    """None once `path` exists; else why not. Idle meanwhile: no GPU work, no collective."""
    deadline = time.monotonic() + timeout
    while not os.path.exists(path):
        if parent is not None and os.getppid() != parent:
            os._exit(3)  # rank 0 is gone: no orphan, and no teardown that would wait for it
        if time.monotonic() > deadline:
            return "%s did not appear in %.0f s" % (path, timeout)
        time.sleep(0.2)
    return None


def rank_steps(rank, args, init_method):
    """This rank's records, phase by phase; None marks the barrier (barrier mode).

    Rank 0 and the spawned ranks run the same steps, so their collectives match one for one;
    a step that raises ends them (the next collective would no longer match)."""
    import torch
    import torch.distributed as dist

    pid, world, parent = os.getpid(), args.world_size, os.getppid()
    n = int(args.size_mb * (1 << 20)) // 4
    device = torch.device("cuda", rank)
    ranks_sum = world * (world + 1) // 2  # the sum of rank + 1 over ranks; exact in float32
    kept = {}  # tensors and the graph that must outlive the barrier

    def rec(phase, ok, **detail):
        try:
            detail["memory_allocated"] = torch.cuda.memory_allocated(device)
        except Exception:  # a broken context must not hide the phase's own result
            pass
        return dict(phase=phase, ok=ok, rank=rank, pid=pid, **detail)

    def allreduce_loop(tensor, first_it):
        """--iters all-reduces of `tensor`; (ok, detail) of the first bad one, else of all."""
        for it in range(first_it, first_it + args.iters):
            tensor.fill_(float(rank + 1 + it))
            dist.all_reduce(tensor, op=dist.ReduceOp.SUM)
            ok, detail = check(torch, tensor, float(ranks_sum + world * it))
            if not ok:
                return False, dict(iteration=it, **detail)
        return True, {"iterations": args.iters, "checked": n}

    def start():
        torch.cuda.set_device(device)
        kwargs = dict(backend="nccl", init_method=init_method, rank=rank, world_size=world,
                      timeout=datetime.timedelta(seconds=args.timeout))
        try:  # device_id (torch >= 2.3) binds the communicator to this GPU and creates it now
            dist.init_process_group(device_id=device, **kwargs)
        except TypeError:
            dist.init_process_group(**kwargs)
        shim = shim_mapped()
        return shim or not args.require_shim, dict(
            shim=shim, device=str(device), nccl=nccl_version(torch), torch=torch.__version__,
            env={k: os.environ.get(k) for k in MULTICAST_OFF})

    def allreduce_before():
        kept["tensor"] = torch.empty(n, dtype=torch.float32, device=device)
        return allreduce_loop(kept["tensor"], 0)  # its last sum is checked after the barrier

    def graph_before():
        static = kept["static"] = torch.empty(n, dtype=torch.float32, device=device)
        static.fill_(float(rank + 1))
        # Warm up on a side stream: NCCL's and torch's lazy setup must not be captured.
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(3):
                dist.all_reduce(static)
        torch.cuda.current_stream().wait_stream(side)
        torch.cuda.synchronize()
        graph = kept["graph"] = torch.cuda.CUDAGraph()
        # thread_local: the NCCL watchdog thread may query events while this thread captures.
        try:
            capture = torch.cuda.graph(graph, capture_error_mode="thread_local")
        except TypeError:  # torch 2.0 has no capture_error_mode
            capture = torch.cuda.graph(graph)
        with capture:
            dist.all_reduce(static)
        static.fill_(float(rank + 1))
        graph.replay()
        return check(torch, static, float(ranks_sum))

    def allreduce_after():
        last = float(ranks_sum + world * (args.iters - 1))
        kept_ok, kept_detail = check(torch, kept["tensor"], last)  # device memory survived
        ok, detail = allreduce_loop(torch.empty(n, dtype=torch.float32, device=device), args.iters)
        detail.update({"kept_" + k: v for k, v in kept_detail.items()})
        return kept_ok and ok, dict(detail, kept_ok=kept_ok)

    def graph_after():
        static_ok, _ = check(torch, kept["static"], float(ranks_sum))
        kept["static"].fill_(float(10 + rank + 1))  # in place: the graph reads this very memory
        kept["graph"].replay()  # the graph captured before the barrier
        ok, detail = check(torch, kept["static"], float(10 * world + ranks_sum))
        return static_ok and ok, dict(detail, static_ok=static_ok)

    steps = [("start", start), ("allreduce-before", allreduce_before)]
    steps += [("graph-before", graph_before)] if args.graph else []
    steps += [("barrier", None)] if args.mode == "barrier" else []
    steps += [("allreduce-after", allreduce_after)]
    steps += [("graph-after", graph_after)] if args.graph else []
    try:
        for phase, step in steps:
            if step is None:
                yield None  # rank 0 writes ready.json once every rank has got here
                error = wait_for_go(os.path.join(args.barrier_dir, "go"), args.timeout,
                                    parent if rank > 0 else None)
                if error:
                    yield rec("go", False, error=error)
                    return
                continue
            t0 = time.monotonic()
            try:
                ok, detail = step()
            except Exception as e:
                yield rec(phase, False, error="%s: %s" % (type(e).__name__, e))
                return
            yield rec(phase, ok, seconds=round(time.monotonic() - t0, 3), **detail)
    finally:
        kept.clear()  # the graph goes before the process group it uses


def teardown():
    """Destroys this rank's process group (its graph is gone by now); whether that went well."""
    import torch
    import torch.distributed as dist

    try:
        torch.cuda.synchronize()
        if dist.is_initialized():
            dist.destroy_process_group()
        return True
    except Exception:
        return False


def rank_main(rank, args, init_method, outbox):
    """A spawned rank: its records go to rank 0; (rank, None) says it has no more."""
    ok = True
    try:
        for record in rank_steps(rank, args, init_method):
            if record is not None:
                ok = ok and record["ok"]
                outbox.put((rank, record))
    except Exception as e:  # report anything, so rank 0 does not wait for nothing
        ok = False
        outbox.put((rank, dict(phase="rank", ok=False, rank=rank, pid=os.getpid(),
                               error="%s: %s" % (type(e).__name__, e))))
    outbox.put((rank, None))
    ok = teardown() and ok
    sys.exit(0 if ok else 1)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mode", choices=["plain", "barrier"], default="plain")
    parser.add_argument("--barrier-dir", help="holds ready.json, go and the rendezvous file")
    parser.add_argument("--world-size", type=int, default=2, help="ranks, one per GPU")
    parser.add_argument("--size-mb", type=float, default=64, help="tensor size in MiB")
    parser.add_argument("--iters", type=int, default=5, help="all-reduces per phase")
    parser.add_argument("--graph", action=argparse.BooleanOptionalAction, default=True,
                        help="capture an all_reduce into a CUDA graph before the barrier")
    parser.add_argument("--timeout", type=float, default=300.0,
                        help="seconds for the go file, for a rank's answer, for joins, for NCCL")
    parser.add_argument("--require-shim", action="store_true",
                        help="fail unless libcuinterpose.so is mapped in every rank")
    args = parser.parse_args()
    if args.mode == "barrier" and not args.barrier_dir:
        parser.error("--mode barrier needs --barrier-dir")
    if args.world_size < 1 or args.iters < 1 or int(args.size_mb * (1 << 20)) // 4 < 1:
        parser.error("--world-size and --iters must be >= 1, --size-mb must hold a float32")

    import torch
    import torch.multiprocessing as mp

    pid, world = os.getpid(), args.world_size
    if world > torch.cuda.device_count():
        emit(dict(phase="start", ok=False, rank=0, pid=pid, error="--world-size %d > %d GPUs"
                  % (world, torch.cuda.device_count())))
        return 2
    rdv_dir = args.barrier_dir if args.mode == "barrier" else tempfile.mkdtemp(prefix="nccl_tp.")
    os.makedirs(rdv_dir, exist_ok=True)
    for stale in ("rendezvous", "ready.json", "go"):  # a FileStore needs a missing or empty file
        if os.path.exists(os.path.join(rdv_dir, stale)):
            os.remove(os.path.join(rdv_dir, stale))
    init_method = "file://" + os.path.join(os.path.abspath(rdv_dir), "rendezvous")

    all_ok = True

    def report(record):
        nonlocal all_ok
        all_ok = all_ok and record.get("ok", False)
        emit(record)

    ctx = mp.get_context("spawn")
    outbox = ctx.Queue()
    procs = {r: ctx.Process(target=rank_main, args=(r, args, init_method, outbox), daemon=True)
             for r in range(1, world)}
    for proc in procs.values():
        proc.start()
    buffers = {r: collections.deque() for r in procs}
    finished = set()  # ranks that will send no more: said so, exited, or fell silent

    def pull(timeout):
        """Moves one thing a rank sent into buffers; False when nothing came in `timeout` s."""
        try:
            src, record = outbox.get(timeout=timeout)
        except queue.Empty:
            return False
        finished.add(src) if record is None else buffers[src].append(record)
        return True

    def collect(r, phase):
        """Rank r's next record, or None once it has no more; a dead or silent rank fails."""
        deadline = time.monotonic() + args.timeout + 60  # longer than NCCL's own timeout
        while not buffers[r] and r not in finished:
            if pull(1.0) or (procs[r].is_alive() and time.monotonic() < deadline):
                continue
            while pull(0.1):  # what a dead rank sent before dying is in the pipe by now
                pass
            if not buffers[r] and r not in finished:
                finished.add(r)
                error = ("no answer in %.0f s" % (args.timeout + 60) if procs[r].is_alive()
                         else "rank exited (%s)" % procs[r].exitcode)
                buffers[r].append(dict(phase=phase, ok=False, rank=r, pid=procs[r].pid,
                                       error=error))
        return buffers[r].popleft() if buffers[r] else None

    try:
        for record in rank_steps(0, args, init_method):
            if record is None:  # the barrier: every rank has reported its last phase before it
                ready = os.path.join(args.barrier_dir, "ready.json")
                pids = [pid] + [procs[r].pid for r in sorted(procs)]
                with open(ready + ".tmp", "w") as f:
                    json.dump({"root_pid": pid, "pids": pids, "world_size": world}, f)
                os.replace(ready + ".tmp", ready)
                report(dict(phase="ready", ok=all_ok, rank=0, pid=pid, pids=pids,
                            barrier=args.barrier_dir, nccl=nccl_version(torch)))
                continue
            report(record)
            for r in sorted(procs):
                other = collect(r, record["phase"])
                if other is not None:
                    report(other)
    except Exception as e:
        report(dict(phase="rank", ok=False, rank=0, pid=pid,
                    error="%s: %s" % (type(e).__name__, e)))
    for r in sorted(procs):  # whatever the others still have to say
        while True:
            other = collect(r, "rank")
            if other is None:
                break
            report(other)

    torn_down = teardown()  # before the joins: a rank's teardown may wait for its peers
    exits = {}
    deadline = time.monotonic() + args.timeout
    for r, proc in sorted(procs.items()):
        proc.join(timeout=max(1.0, deadline - time.monotonic()))
        if proc.is_alive():
            proc.kill()
            proc.join()
        exits[str(r)] = proc.exitcode
    if args.mode == "plain":
        shutil.rmtree(rdv_dir, ignore_errors=True)
    ok = all_ok and torn_down and all(code == 0 for code in exits.values())
    emit(dict(phase="done", ok=ok, rank=0, pid=pid, teardown=torn_down, exit_codes=exits))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
