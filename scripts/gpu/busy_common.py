"""What the busy workloads share (issue 27, GPU lane step `busy`).

A busy workload keeps issuing GPU work, with no barrier and no cooperation, while the tool suspends,
resumes, checkpoints and restores it. The protocol with the lane, the same for every busy_*.py:
  - once working (its first iteration checked), it writes READY_DIR/ready.json atomically
    ({"pids": [...], "workload": ...}; pids as the script sees them, namespace pids under
    `cuinterpose run --pid-namespace`);
  - it keeps working until READY_DIR/stop exists, looked for between iterations;
  - it checks its own results every iteration;
  - at the end it prints one JSON summary line ({"summary": true, "ok": ..., "iterations": ...,
    "failures": ..., "first_failure": ..., timings}) and exits 0 only if every check passed.
Every wait is bounded: --max-seconds for the whole run (no stop by then is a failure), and a
watchdog that ends the process (summary line, exit 1) when no iteration completes for
--stall-timeout seconds, also when the main thread is blocked inside a CUDA call.

Import it first, before torch/jax/cupy: it imports lane_common, which switches multicast off for
this process and every process it starts.
"""

import json
import os
import sys
import threading
import time

# Multicast off before anything imports a CUDA library (see lane_common).
from lane_common import emit, shim_mapped  # the import itself switches multicast off


def add_common_args(parser, stall_default=60.0, ready_required=True):
    """The arguments every busy workload takes. Workloads that the lane checkpoints to disk take a
    longer stall default (120 s): the time between the dump and the restore counts as one
    iteration's time in the restored process."""
    parser.add_argument("--ready-dir", required=ready_required,
                        help="ready.json is written here once working; the run ends when stop appears here")
    parser.add_argument("--max-seconds", type=float, default=900.0,
                        help="bound on the whole run: no stop file by then is a failure (default 900)")
    parser.add_argument("--stall-timeout", type=float, default=stall_default,
                        help="seconds without a completed iteration before the run is declared stalled "
                             "(summary line, exit 1; default %.0f)" % stall_default)
    parser.add_argument("--require-shim", action="store_true",
                        help="fail unless libcuinterpose.so is mapped into this process")


def write_ready(ready_dir, record):
    """READY_DIR/ready.json, written atomically (a reader never sees half of it)."""
    os.makedirs(ready_dir, exist_ok=True)
    path = os.path.join(ready_dir, "ready.json")
    with open(path + ".tmp", "w") as f:
        json.dump(record, f)
    os.replace(path + ".tmp", path)


def stop_requested(ready_dir):
    return os.path.exists(os.path.join(ready_dir, "stop"))


class Tally:
    """Iterations, failures, the first failure and iteration times of one process, and a watchdog.

    `tick()` after every iteration (checked or not); `fail(detail)` for each failed check. The
    watchdog thread ends the whole process with a summary line and exit status 1 when no tick came
    for `stall_timeout` seconds: the main thread may be stuck in a CUDA call (a launch held at a
    gate that never reopens, a kernel that never finishes), where no loop of its own can notice.
    """

    def __init__(self, workload, role, stall_timeout, extra=None):
        self.workload, self.role = workload, role
        self.stall_timeout = stall_timeout
        self.extra = extra if extra is not None else {}  # more summary fields, filled by the caller
        self.iterations = 0
        self.failures = 0
        self.first_failure = None
        self.started = time.monotonic()
        self.last_tick = self.started
        self.longest = 0.0  # the longest gap between two ticks: a suspend shows here
        self.longest_at = 0
        self.warmup = None
        self.done = False
        self.lock = threading.Lock()
        self.watchdog = None

    def start_watchdog(self):
        """Starts the watchdog (call it once the first, slow, iteration is behind)."""
        with self.lock:
            now = time.monotonic()
            # The first iteration (imports, compilation, warm-up) is reported apart, not as the
            # longest iteration, where a suspend's pause must show.
            self.warmup = now - self.started
            self.last_tick = now
            self.longest, self.longest_at = 0.0, 0
        self.watchdog = threading.Thread(target=self._watch, name="busy-watchdog", daemon=True)
        self.watchdog.start()

    def _watch(self):
        while True:
            time.sleep(1.0)
            with self.lock:
                if self.done:
                    return
                idle = time.monotonic() - self.last_tick
            if idle > self.stall_timeout:
                self.fail({"error": "stalled: no iteration completed in %.0f s" % idle,
                           "iteration": self.iterations})
                emit(self.summary(stalled=True))
                sys.stdout.flush()
                os._exit(1)  # the main thread may be blocked in the driver: no orderly exit

    def tick(self):
        now = time.monotonic()
        with self.lock:
            gap = now - self.last_tick
            if gap > self.longest:
                self.longest, self.longest_at = gap, self.iterations
            self.last_tick = now
            self.iterations += 1

    def fail(self, detail):
        with self.lock:
            self.failures += 1
            if self.first_failure is None:
                self.first_failure = dict(detail, iteration=detail.get("iteration", self.iterations))

    def check(self, ok, detail):
        """Counts a failed check; returns ok."""
        if not ok:
            self.fail(detail)
        return ok

    def summary(self, **more):
        """The summary record; ok only with iterations done and no failure."""
        with self.lock:
            elapsed = time.monotonic() - self.started
            record = dict(summary=True, workload=self.workload, role=self.role, pid=os.getpid(),
                          ok=self.failures == 0 and self.iterations > 0,
                          iterations=self.iterations, failures=self.failures,
                          first_failure=self.first_failure, seconds=round(elapsed, 3),
                          longest_iteration_ms=round(self.longest * 1000.0, 1),
                          longest_at_iteration=self.longest_at,
                          warmup_ms=None if self.warmup is None else round(self.warmup * 1000.0, 1),
                          shim=shim_mapped())
        record.update(self.extra)
        record.update(more)
        if record.get("failures"):
            record["ok"] = False
        return record

    def finish(self):
        """Stops the watchdog before the orderly end."""
        with self.lock:
            self.done = True


def run_until_stop(args, tally, iteration):
    """Calls `iteration()` (which does one checked round of GPU work and calls tally.tick()) until
    READY_DIR/stop exists or --max-seconds pass; returns an error string for the second case."""
    deadline = time.monotonic() + args.max_seconds
    while not stop_requested(args.ready_dir):
        if time.monotonic() > deadline:
            return "no stop file within --max-seconds %.0f" % args.max_seconds
        iteration()
    return None


def guarded(workload, main):
    """main() -> exit status; an exception that escapes it is still one summary line and exit 1."""
    try:
        return main()
    except SystemExit:
        raise
    except BaseException as e:  # an interrupt is a failed run too
        emit(dict(summary=True, ok=False, workload=workload, pid=os.getpid(), iterations=0, failures=1,
                  first_failure={"error": "%s: %s" % (type(e).__name__, e)}, longest_iteration_ms=0.0))
        return 1
