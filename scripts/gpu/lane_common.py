"""What every GPU-lane script shares. Importing it switches multicast off for this process and every
process it starts: it must be imported before anything imports torch, at module level, so that
spawned children (which re-import their main module, and with it this one) switch it off too."""

import json
import os

# Multicast must never be used on the GPU machine (DESIGN.md, "Rules on the GPU machine").
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
