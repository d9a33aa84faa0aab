"""What every GPU-lane script shares. Importing it switches multicast off for this process and every
process it starts: it must be imported before anything imports torch, at module level, so that
spawned children (which re-import their main module, and with it this one) switch it off too."""

import json
import os

# Multicast must never be used on the GPU machine (docs/design.md, "Rules on the GPU machine").
MULTICAST_OFF = {
    "NCCL_NVLS_ENABLE": "0",
    "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
    "NVSHMEM_DISABLE_NVLS": "1",
}
os.environ.update(MULTICAST_OFF)


def shim_mapped():
    """Whether libcuinterpose.so is mapped into this process."""
    try:
        with open("/proc/self/maps") as maps:
            return "libcuinterpose" in maps.read()
    except OSError:
        return False


def emit(record):
    """One JSON line on stdout, keys sorted, flushed at once."""
    print(json.dumps(record, sort_keys=True), flush=True)


def wait_for_file(path, timeout):
    """Whether `path` appeared within `timeout` seconds."""
    import time

    deadline = time.monotonic() + timeout
    while not os.path.exists(path):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)
    return True


def hold_rounds(barrier_dir, rounds, timeout, pid, held, recheck, report):
    """The barrier protocol of the hold scripts: writes BARRIER_DIR/ready.json ({"pid", "bytes"}),
    then for each round N waits for BARRIER_DIR/go-N (the lane suspends and resumes the process in
    between), calls `recheck()` -> (ok, detail dict) and writes BARRIER_DIR/checked-N ("ok"/"FAIL").
    Returns the exit status: 0 when every round was ok."""
    os.makedirs(barrier_dir, exist_ok=True)
    ready = os.path.join(barrier_dir, "ready.json")
    with open(ready + ".tmp", "w") as f:
        json.dump({"pid": pid, "bytes": held}, f)
    os.replace(ready + ".tmp", ready)
    all_ok = True
    for n in range(1, rounds + 1):
        go = os.path.join(barrier_dir, "go-%d" % n)
        if not wait_for_file(go, timeout):
            report("round-%d" % n, False, error="%s did not appear in %.0f s" % (go, timeout))
            return 1
        ok, detail = recheck()
        all_ok = all_ok and ok
        report("round-%d" % n, ok, **detail)
        with open(os.path.join(barrier_dir, "checked-%d" % n), "w") as f:
            f.write("ok\n" if ok else "FAIL\n")
    report("done", all_ok)
    return 0 if all_ok else 1
