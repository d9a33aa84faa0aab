#!/usr/bin/env bash
# The GPU lane: every GPU scenario on a real GPU in one call, a summary table last.
#
# Runs on the GPU machine from the repository root, with dist/ (scripts/build-dist.sh: the release
# layout; the tool finds its shim, the fake driver and CRIU in it by itself) carried along:
#   scripts/gpu-lane.sh [STEP...]        (default: every step; steps: doctor abi procaddr scenarios
#                                          shim-scenarios demo torch bench disk torch-disk ipc nccl keep hold busy launch placement floor unlock hang;
#                                          bench-all adds two carriers; placement: where a pinned carrier lives, without
#                                          the shim; floor: the native pair of a nearly empty process with and without
#                                          its context's stack; attrs: the pointer-attributes scenario alone, without the shim;
#                                          busy: workloads suspended/resumed and checkpointed/restored while they work;
#                                          launch: bench --launch, the launch-bound overhead of the gate;
#                                          preempt: kernels preempted between two contexts after a native
#                                          checkpoint/restore of one, without the shim)
# Each scenario of cuinterpose-scenarios runs on the fake driver and on the real one; the table shows
# both and whether they agree (where they may not, crates/fake-cuda/README.md says why).
#
# Safety (docs/design.md, "Rules on the GPU machine"): multicast is never used here; the switches
# below are exported to every process, and nothing here changes clocks, power, compute or
# persistence mode, MIG, or resets a GPU.
set -uo pipefail
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PYTHONUNBUFFERED=1
cd "$(dirname "$0")/.."
repo=$PWD
bin=$repo/dist/bin
shim=$repo/dist/lib/libcuinterpose.so
out=${OUT:-/tmp/gpu-lane-out}
logs=$(mktemp -d /tmp/gpu-lane-logs.XXXXXX)
mkdir -p "$out"
summary=$out/summary.tsv  # written row by row: a lane cut short still returns what it had
: >"$summary"
steps=("$@")
[ ${#steps[@]} -gt 0 ] || steps=(doctor abi procaddr scenarios shim-scenarios demo torch bench disk torch-disk ipc nccl keep hold busy preempt launch placement floor unlock hang)

row() { printf '%s\t%s\t%s\t%s\n' "$1" "$2" "$3" "$4" >>"$summary"; }  # scenario fake real verdict
log() { printf '[lane %s] %s\n' "$(date +%T)" "$*"; }
wants() { local s; for s in "${steps[@]}"; do [ "$s" = "$1" ] && return 0; done; return 1; }
# LANE_BUSY=jax,spin runs only those busy workloads (tags up to the first dash; default all).
busy_wanted() { [ -z "${LANE_BUSY:-}" ] || [[ ",$LANE_BUSY," == *",${1%%-*},"* ]]; }

[ -x "$bin/cuinterpose" ] || { echo "dist/bin/cuinterpose missing: run scripts/build-dist.sh here first" >&2; exit 2; }
nvidia-smi --query-gpu=name,driver_version,memory.used,memory.total --format=csv,noheader | tee "$logs/gpu.txt"
driver_dir=$(dirname "$(ldconfig -p | awk '/libcuda\.so\.1 /{print $NF; exit}')")

if wants doctor; then
    log "doctor: what this machine has for cuinterpose"
    "$bin/cuinterpose" doctor | tee "$logs/doctor.txt"
    doctor_status=${PIPESTATUS[0]}
    "$bin/cuinterpose" doctor --json >"$logs/doctor.json" 2>&1
    row doctor "-" "$(grep -c '^ok' "$logs/doctor.txt") ok, $(grep -c '^warn' "$logs/doctor.txt") warn, $(grep -c '^fail' "$logs/doctor.txt") fail" \
        "$([ "$doctor_status" -eq 0 ] && echo ok || echo "FAIL (exit $doctor_status)")"
fi

if wants abi; then
    log "abi: cuda-abi layouts against this machine's cuda.h"
    cuda_inc=/usr/local/cuda/include
    if gcc -I"$cuda_inc" -o "$logs/abi-layout" scripts/abi-layout.c 2>"$logs/abi-build.txt"; then
        "$logs/abi-layout" >"$logs/abi-c.txt"
        "$bin/cuinterpose" abi-layout >"$logs/abi-rust.txt"
        if diff "$logs/abi-c.txt" "$logs/abi-rust.txt" >"$logs/abi-diff.txt"; then
            row abi-layout "-" "$(wc -l <"$logs/abi-c.txt") lines" match
        else
            row abi-layout "-" "$(grep -c '^[<>]' "$logs/abi-diff.txt") differences" MISMATCH
            cat "$logs/abi-diff.txt"
        fi
    else
        row abi-layout "-" "cuda.h build failed" ERROR
        cat "$logs/abi-build.txt"
    fi
fi

if wants procaddr; then
    log "procaddr: the driver resolver's pointers are named by dladdr (the shim's resolver rule)"
    if gcc -I crates/shim/tests/c -o "$logs/procaddr" crates/shim/tests/c/procaddr.c "$driver_dir/libcuda.so.1" -ldl 2>"$logs/procaddr-build.txt"; then
        "$logs/procaddr" >"$logs/procaddr-plain.txt" 2>&1
        LD_PRELOAD=$shim "$logs/procaddr" >"$logs/procaddr-shim.txt" 2>&1
        # Tracked names must come back as the shim's wrappers; every other answer must be the
        # driver's own, identical to the run without the shim (resolver lines aside).
        read -r wrapped untracked_same < <(python3 - "$logs/procaddr-plain.txt" "$logs/procaddr-shim.txt" <<'PY'
import sys
def load(p):
    return {l.split()[0]: l.strip() for l in open(p) if l.strip() and not l.startswith("resolver.")}
plain, shim = load(sys.argv[1]), load(sys.argv[2])
wrapped = sum("provider=libcuinterpose" in l for l in shim.values())
# Keys only the shim run has (the real libcuda may not export cuGetProcAddress_v2_ptsz) are fine;
# the pre-11.0 ABI of a tracked function is reported not found by design (no wrapper has it).
differ = [k for k, l in shim.items()
          if "provider=libcuinterpose" not in l and k in plain and plain[k] != l and not k.endswith(".old_abi")]
print(wrapped, "yes" if not differ else "no:" + ",".join(differ))
PY
)
        verdict=$([ "$wrapped" -gt 0 ] && [ "$untracked_same" = yes ] && echo ok || echo FAIL)
        row procaddr "-" "wrapped=$wrapped untracked-identical=$untracked_same" "$verdict"
    else
        row procaddr "-" "build failed" ERROR
        cat "$logs/procaddr-build.txt"
    fi
fi

# Runs the scenario list on both drivers and adds one row per outcome.
scenario_rows() {
    local tag=$1; shift
    timeout 300 "$bin/cuinterpose-scenarios" --json --driver fake "$@" >"$logs/$tag-fake.jsonl" 2>"$logs/$tag-fake.err"
    timeout 300 "$bin/cuinterpose-scenarios" --json --driver system "$@" >"$logs/$tag-real.jsonl" 2>"$logs/$tag-real.err"
    python3 - "$logs/$tag-fake.jsonl" "$logs/$tag-real.jsonl" "$tag" >>"$summary" <<'PY'
import json, sys
def load(path):
    rows = {}
    for line in open(path):
        line = line.strip()
        if line.startswith("{"):
            r = json.loads(line)
            rows[r["label"]] = r
    return rows
fake, real, tag = load(sys.argv[1]), load(sys.argv[2]), sys.argv[3]
for label in list(dict.fromkeys(list(real) + list(fake))):
    f = fake.get(label, {}).get("outcome", "-")
    r = real.get(label, {}).get("outcome", "-")
    verdict = "agree" if f == r else "DIFFER"
    name = label if tag == "scen" else f"shim:{label}"
    print(f"{name}\t{f}\t{r}\t{verdict}")
PY
}

if wants scenarios; then
    log "scenarios on fake and real drivers, no shim"
    scenario_rows scen --skip-hangs
elif wants attrs; then
    # The driver's own answers for cuMemAlloc memory, which the shim's must equal (shim-scenarios).
    log "pointer-attributes on fake and real drivers, no shim"
    scenario_rows scen pointer-attributes
fi
if wants shim-scenarios; then
    log "scenarios on fake and real drivers, under the shim"
    scenario_rows shim --skip-hangs --shim
fi

if wants demo; then
    log "cuinterpose demo on the GPU"
    if timeout 300 "$bin/cuinterpose" demo --json >"$logs/demo.json" 2>"$logs/demo.err"; then
        row "demo" "-" "$(python3 -c "import json;r=json.load(open('$logs/demo.json'));print('suspend %.0f ms, resume %.0f ms, used %d->%d MiB' % (r['suspend']['total_millis'], r['resume']['total_millis'], r['group_memory_before']>>20, r['group_memory_suspended']>>20))")" ok
        timeout 300 "$bin/cuinterpose" demo --processes 4 --size $((256 << 20)) >"$logs/demo4.txt" 2>&1 \
            && row "demo --processes 4" "-" "$(tail -1 "$logs/demo4.txt")" ok \
            || row "demo --processes 4" "-" "$(tail -1 "$logs/demo4.txt")" FAIL
    else
        row "demo" "-" "$(tail -3 "$logs/demo.err" | tr '\n\t' '  ')" FAIL
    fi
fi

if wants torch; then
    log "PyTorch tensor shared through torch.multiprocessing, expandable segments"
    export PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
    timeout 300 python3 scripts/gpu/torch_share.py --mode plain >"$logs/torch-plain.jsonl" 2>"$logs/torch-plain.err" \
        && row "torch-share plain" "-" ok ok || row "torch-share plain" "-" "$(tail -1 "$logs/torch-plain.err")" FAIL
    timeout 300 "$bin/cuinterpose" run -- python3 scripts/gpu/torch_share.py --mode plain --require-shim \
        >"$logs/torch-shim.jsonl" 2>"$logs/torch-shim.err" \
        && row "torch-share under shim" "-" ok ok || row "torch-share under shim" "-" "$(tail -1 "$logs/torch-shim.err")" FAIL
    barrier=$(mktemp -d /tmp/torch-barrier.XXXXXX)
    "$bin/cuinterpose" run -- python3 scripts/gpu/torch_share.py --mode barrier --barrier-dir "$barrier" --require-shim \
        --size-mb 1024 >"$logs/torch-barrier.jsonl" 2>"$logs/torch-barrier.err" &
    torch_pid=$!
    for _ in $(seq 120); do [ -f "$barrier/ready.json" ] && break; sleep 1; done
    if [ -f "$barrier/ready.json" ]; then
        producer=$(python3 -c "import json;print(json.load(open('$barrier/ready.json'))['producer_pid'])")
        "$bin/cuinterpose" inspect --pid "$producer" >"$logs/torch-inspect.txt" 2>&1
        "$bin/cuinterpose" inspect --pid "$producer" --json >"$logs/torch-inspect.json" 2>&1
        shared=$(python3 -c "import json;r=json.load(open('$logs/torch-inspect.json'));print(sum(1 for a in r['shared'] if a['importers']))" 2>/dev/null || echo 0)
        row "torch inspect" "-" "shared allocations with importers: $shared" "$([ "${shared:-0}" -gt 0 ] && echo ok || echo FAIL)"
        used_before=$(nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits)
        if "$bin/cuinterpose" suspend --pid "$producer" >"$logs/torch-suspend.txt" 2>&1; then
            used_suspended=$(nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits)
            row "torch suspend" "-" "GPU used ${used_before}->${used_suspended} MiB; $(tail -1 "$logs/torch-suspend.txt")" ok
            "$bin/cuinterpose" resume --pid "$producer" >"$logs/torch-resume.txt" 2>&1 \
                && row "torch resume" "-" "$(tail -1 "$logs/torch-resume.txt")" ok \
                || row "torch resume" "-" "$(tail -2 "$logs/torch-resume.txt" | tr '\n\t' '  ')" FAIL
        else
            row "torch suspend" "-" "$(tail -3 "$logs/torch-suspend.txt" | tr '\n\t' '  ')" FAIL
        fi
        touch "$barrier/go"
        if timeout 120 tail --pid=$torch_pid -f /dev/null; wait $torch_pid; then
            row "torch after resume" "-" "consumer sees new writes" ok
        else
            row "torch after resume" "-" "$(grep '"ok": false' "$logs/torch-barrier.jsonl" | head -1)" FAIL
        fi
    else
        row "torch barrier" "-" "never ready: $(tail -1 "$logs/torch-barrier.err")" FAIL
        kill $torch_pid 2>/dev/null
    fi
    unset PYTORCH_CUDA_ALLOC_CONF
fi

if wants bench || wants bench-all; then
    log "benchmarks"
    # The default (`--carrier auto`, prepared ahead with `cuinterpose prepare`), with the overhead
    # figures; the bench itself runs each carrier on a fresh group after it for comparison.
    # bench-all adds the process's own carrier forced pinned, registered, and staged with 8 MiB
    # buffers (18 and 27 GB/s on 2026-12-03).
    variants=("auto")
    wants bench-all && variants+=("pinned CUINTERPOSE_CARRIER=pinned" "registered CUINTERPOSE_CARRIER=registered" "staged-8M CUINTERPOSE_CARRIER=staged CUINTERPOSE_STAGING_CHUNK=8M")
    for variant in "${variants[@]}"; do
        read -r carrier settings <<<"$variant"
        extra=(--no-whole)  # the whole-process case runs in the step keep
        case $carrier in
            auto) ;;
            helper) extra+=(--no-overhead --carrier helper) ;;
            *) extra+=(--no-overhead --carrier process) ;;
        esac
        # The GPU memory the carrier helper holds (its context and DMA buffers), sampled while the
        # bench runs: the helper is the tool's binary (`cuinterpose carrier-helper`), the only
        # process of that name with a context.
        ( while :; do nvidia-smi --query-compute-apps=pid,process_name,used_memory --format=csv,noheader,nounits; sleep 0.5; done ) \
            >"$logs/bench-$carrier.gpu-apps" 2>/dev/null &
        sampler=$!
        # shellcheck disable=SC2086 # settings are VAR=value words
        env $settings timeout 300 "$bin/cuinterpose" bench "${extra[@]}" \
            --json-out "$logs/bench-$carrier.json" >"$logs/bench-$carrier.txt" 2>"$logs/bench-$carrier.err"
        bench_status=$?
        kill "$sampler" 2>/dev/null; wait "$sampler" 2>/dev/null
        helper_mib=$(awk -F', *' '$2 ~ /\/cuinterpose$/ && $3 + 0 > max { max = $3 + 0 } END { print max + 0 }' "$logs/bench-$carrier.gpu-apps")
        if [ "$bench_status" -eq 0 ]; then
            cat "$logs/bench-$carrier.txt"
            [ "$helper_mib" -gt 0 ] && row "carrier helper's GPU memory ($carrier)" "-" "$helper_mib MiB at most (nvidia-smi, sampled every 0.5 s)" measured
            row "bench ($carrier carrier)" "-" "$(python3 - "$logs/bench-$carrier.json" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
cycles = r["capture"]["cycles"]
n = r["capture"]["native"]
parts = []
for cy in ([cycles[0]] if len(cycles) > 1 else []) + [cycles[-1]]:
    parts.append("cycle %d: save %.1f GB/s (pin %.0f ms), load %.1f GB/s, suspend %.0f ms, resume %.0f ms, %.2fx native" % (
        cy["cycle"], cy["save"]["copy_gb_per_s"], cy["save"]["carrier_millis"], cy["load"]["copy_gb_per_s"],
        cy["suspend"]["total_millis"], cy["resume"]["total_millis"], cy["speedup_vs_native"]))
line = "; ".join(parts) + "; native %.0f+%.0f ms" % (n["checkpoint_millis"], n["restore_millis"])
ch = cycles[0]["suspend"].get("carrier")
if ch:
    line += "; carrier %s (%s), pinned host %d MiB, helper GPU %d MiB" % (ch["carrier"], ch["reason"], ch["pinned_host_bytes"] >> 20, ch["helper_gpu_bytes"] >> 20)
p = r["capture"].get("prepared")
if p:
    line += "; prepared %d MiB ahead in %.0f ms" % (sum(x["pinned_bytes"] for x in p["processes"]) >> 20, p["total_millis"])
for run in r["capture"].get("comparison", []):
    if run.get("refused"):
        line += "; [%s refused: %s]" % (run["carrier"], run["refused"])
    else:
        line += "; [%s: %s]" % (run["carrier"], ", ".join("cycle %d save %.1f load %.1f GB/s %.2fx native" % (
            cy["cycle"], cy["save"]["copy_gb_per_s"], cy["load"]["copy_gb_per_s"], cy["speedup_vs_native"]) for cy in run["cycles"]))
o = r.get("overhead")
if o:
    line += "; overhead untracked %.3f tracked %.3f" % (o["untracked_ratio"], o["tracked_ratio"])
    loop, cycle = o["untracked"][-1], o["tracked"][0]
    if "ratio_p10" in loop:
        line += " (p10-p90 %.3f-%.3f / %.3f-%.3f, %d pairs x %d rounds)" % (
            loop["ratio_p10"], loop["ratio_p90"], cycle["ratio_p10"], cycle["ratio_p90"],
            o["repetitions"], o["rounds"])
print(line)
PY
)" measured
        else
            row "bench ($carrier carrier)" "-" "$(tail -2 "$logs/bench-$carrier.err" | tr '\n\t' '  ')" FAIL
        fi
    done
fi

if wants disk; then
    log "checkpoint to disk with CRIU and restore"
    if timeout 400 "$bin/cuinterpose" demo --to-disk --json >"$logs/demo-disk.json" 2>"$logs/demo-disk.err"; then
        row "demo --to-disk" "-" "$(python3 -c "import json;r=json.load(open('$logs/demo-disk.json'));print(' '.join('%s=%.0fms'%(p['name'],p['millis'])+('(%dMiB@%.2fGB/s)'%(p['bytes']>>20,p['bytes']/p['millis']/1e6) if p['bytes'] else '') for p in r['checkpoint']['phases']+r['restore']['phases'] if p['millis']>=1), 'images=%dMiB'%(r['checkpoint']['image_bytes']>>20))")" ok
    else
        row "demo --to-disk" "-" "$(tail -3 "$logs/demo-disk.err" | tr '\n\t' '  ')" FAIL
    fi
    # The bench group (8 GiB over two processes) to a directory on the machine's disk, next to the
    # directory's own sequential rates measured with the data files' I/Os.
    # Then the same into tmpfs (/dev/shm): a warm checkpoint, the restore the page cache allows.
    for where in disk tmpfs; do
    if [ "$where" = disk ]; then bench_dir=$(mktemp -d /var/tmp/lane-bench-disk.XXXXXX); else bench_dir=$(mktemp -d /dev/shm/lane-bench-disk.XXXXXX); fi
    if timeout 300 "$bin/cuinterpose" bench --no-overhead --no-capture --no-whole --to-disk "$bench_dir" \
            --json-out "$logs/bench-$where.json" >"$logs/bench-$where.txt" 2>"$logs/bench-$where.err"; then
        cat "$logs/bench-$where.txt"
        row "bench --to-disk ($where)" "-" "$(python3 - "$logs/bench-$where.json" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))["disk"]
parts = ["dir write %.2f read %.2f GB/s (O_DIRECT %s)" % (d["dir_write_gb_per_s"], d["dir_read_gb_per_s"], d["dir_rate"].get("direct"))]
parts += ["%s %s %.2f GB/s = %.0f%% of dir" % (r["run"], r["phase"], r["gb_per_s"], 100 * r["of_dir"]) for r in d["ratios"]]
c = d["checkpoint"]
parts.append("data %d MiB, zeros %d MiB, images %d MiB" % (c["data_bytes"] >> 20, c["zero_bytes"] >> 20, c["image_bytes"] >> 20))
s = d["second"]
parts.append("second checkpoint (%d MiB changed): written %d MiB, shared %d MiB, %.2fx the bytes, save %.2fx the first's (whole, left running: %.2fx)" % (
    s["changed_bytes"] >> 20, s["report"]["data_bytes"] >> 20, s["report"]["shared_bytes"] >> 20, s["written_ratio"], s.get("save_ratio", 0), s["time_ratio"]))
print("; ".join(parts))
PY
)" measured
    else
        row "bench --to-disk ($where)" "-" "$(tail -2 "$logs/bench-$where.err" | tr '\n\t' '  ')" FAIL
    fi
    rm -rf "$bench_dir"
    done
fi

if wants torch-disk; then
    log "PyTorch pair checkpointed to disk with CRIU, killed, restored, verified"
    export PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
    barrier=$(mktemp -d /tmp/torch-disk-barrier.XXXXXX)
    ckpt=/tmp/torch-ckpt.$$
    "$bin/cuinterpose" run --pid-namespace -- python3 "$repo/scripts/gpu/torch_share.py" --mode barrier \
        --barrier-dir "$barrier" --require-shim --size-mb 1024 >"$logs/torch-disk.jsonl" 2>"$logs/torch-disk.err" &
    launcher=$!
    for _ in $(seq 120); do [ -f "$barrier/ready.json" ] && break; sleep 1; done
    if [ -f "$barrier/ready.json" ] && "$bin/cuinterpose" checkpoint --pid "$launcher" --dir "$ckpt" --json \
            >"$logs/torch-checkpoint.json" 2>"$logs/torch-checkpoint.err"; then
        wait "$launcher" 2>/dev/null
        gone=$(pgrep -f "torch_share.py --mode barrier --barrier-dir $barrier" | wc -l)
        if "$bin/cuinterpose" restore --dir "$ckpt" --json >"$logs/torch-restore.json" 2>"$logs/torch-restore.err"; then
            touch "$barrier/go"
            for _ in $(seq 120); do grep -q '"phase": "done"' "$logs/torch-disk.jsonl" && break; sleep 1; done
            verdict=$(grep -q '"ok": false' "$logs/torch-disk.jsonl" && echo FAIL || (grep -q '"phase": "done"' "$logs/torch-disk.jsonl" && echo ok || echo FAIL))
            row "torch checkpoint/restore" "-" "$(python3 - "$logs/torch-checkpoint.json" "$logs/torch-restore.json" "$gone" <<'PY'
import json, sys
c, r = json.load(open(sys.argv[1])), json.load(open(sys.argv[2]))
# Phase times in ms; phases that move bytes add how many and at what rate.
rate = lambda p: "(%dMiB@%.2fGB/s)" % (p["bytes"] >> 20, p["bytes"] / p["millis"] / 1e6) if p["bytes"] else ""
ph = lambda rep: " ".join("%s=%.0f%s" % (p["name"], p["millis"], rate(p)) for p in rep["phases"] if p["millis"] >= 1)
print("left after dump: %s; checkpoint %s; restore %s; images %d MiB" % (sys.argv[3], ph(c), ph(r), c["image_bytes"] >> 20))
PY
)" "$verdict"
        else
            row "torch checkpoint/restore" "-" "restore: $(tail -3 "$logs/torch-restore.err" | tr '\n\t' '  ')" FAIL
            cp /tmp/cuinterpose-restore-*/restore.log "$logs/torch-criu-restore.log" 2>/dev/null
            touch "$barrier/go"
        fi
        cp "$ckpt/images/dump.log" "$logs/torch-criu-dump.log" 2>/dev/null
    else
        row "torch checkpoint/restore" "-" "checkpoint: $(tail -3 "$logs/torch-checkpoint.err" 2>/dev/null | tr '\n\t' '  ')" FAIL
        touch "$barrier/go"; kill "$launcher" 2>/dev/null
    fi
    rm -rf "$ckpt"
    unset PYTORCH_CUDA_ALLOC_CONF
fi

# Legacy CUDA IPC served by the shims (CUINTERPOSE_ALLOC=vmm): a pair that shares a buffer through
# cuIpcGetMemHandle/cuIpcOpenMemHandle, in barrier mode (ready.json, then idle until go), suspended
# and resumed in place, or checkpointed to disk, gone, and restored; then the consumer must see the
# producer's new writes and the producer the consumer's (the script's update/reverse phases).
ipc_ready() {  # barrier: waits for ready.json; prints the producer's pid
    local b=$1
    for _ in $(seq 180); do [ -f "$b/ready.json" ] && break; sleep 1; done
    [ -f "$b/ready.json" ] && python3 -c "import json;print(json.load(open('$b/ready.json'))['producer_pid'])"
}
ipc_verdict() {  # jsonl: ok when the script reached done with every phase ok
    local j=$1
    for _ in $(seq 180); do grep -q '"phase": "done"' "$j" && break; sleep 1; done
    if grep -q '"phase": "done"' "$j" && ! grep -q '"ok": false' "$j"; then echo ok
    else echo "FAIL $(grep '"ok": false' "$j" | head -1 | cut -c1-160)"; fi
}
ipc_in_place() {  # tag script args...: suspend/resume in place
    local tag=$1; shift
    local b; b=$(mktemp -d /tmp/ipc-barrier.XXXXXX)
    CUINTERPOSE_ALLOC=vmm "$bin/cuinterpose" run -- python3 "$@" --mode barrier --barrier-dir "$b" --require-shim \
        >"$logs/ipc-$tag.jsonl" 2>"$logs/ipc-$tag.err" &
    local launcher=$! producer
    if producer=$(ipc_ready "$b"); then
        "$bin/cuinterpose" inspect --pid "$producer" --json >"$logs/ipc-$tag-inspect.json" 2>&1
        local blockers
        blockers=$(python3 -c "import json;r=json.load(open('$logs/ipc-$tag-inspect.json'));print(sum(len(s['record']['blockers']) for s in r['snapshots']))" 2>/dev/null || echo "?")
        if "$bin/cuinterpose" suspend --pid "$producer" --json >"$logs/ipc-$tag-suspend.json" 2>"$logs/ipc-$tag-suspend.err" \
                && "$bin/cuinterpose" resume --pid "$producer" --json >"$logs/ipc-$tag-resume.json" 2>"$logs/ipc-$tag-resume.err"; then
            touch "$b/go"
            local verdict; verdict=$(ipc_verdict "$logs/ipc-$tag.jsonl")
            row "ipc $tag suspend/resume" "-" "$(python3 - "$logs/ipc-$tag-suspend.json" "$logs/ipc-$tag-resume.json" "$blockers" <<'PY'
import json, sys
s, r = json.load(open(sys.argv[1])), json.load(open(sys.argv[2]))
print("blockers %s; suspend %.0f ms, resume %.0f ms, shim moved %d MiB" % (
    sys.argv[3], s["total_millis"], r["total_millis"], s["saved_bytes"] >> 20))
PY
)" "${verdict%% *}"
            [ "$verdict" = ok ] || log "ipc $tag: $verdict"
        else
            row "ipc $tag suspend/resume" "-" "blockers $blockers; $(tail -2 "$logs/ipc-$tag-suspend.err" "$logs/ipc-$tag-resume.err" 2>/dev/null | tr '\n\t' '  ' | cut -c1-200)" FAIL
            touch "$b/go"
        fi
        timeout 120 tail --pid="$launcher" -f /dev/null
    else
        row "ipc $tag suspend/resume" "-" "never ready: $(tail -1 "$logs/ipc-$tag.err")" FAIL
    fi
    kill "$launcher" 2>/dev/null; wait "$launcher" 2>/dev/null
    rm -rf "$b"
}
ipc_to_disk() {  # tag script args...: checkpoint to disk, restore
    local tag=$1; shift
    local b ckpt=/tmp/ipc-ckpt.$$.$tag
    b=$(mktemp -d /tmp/ipc-disk-barrier.XXXXXX)
    CUINTERPOSE_ALLOC=vmm "$bin/cuinterpose" run --pid-namespace -- python3 "$@" --mode barrier --barrier-dir "$b" \
        --require-shim >"$logs/ipc-$tag-disk.jsonl" 2>"$logs/ipc-$tag-disk.err" &
    local launcher=$!
    if ipc_ready "$b" >/dev/null && "$bin/cuinterpose" checkpoint --pid "$launcher" --dir "$ckpt" --json \
            >"$logs/ipc-$tag-checkpoint.json" 2>"$logs/ipc-$tag-checkpoint.err"; then
        wait "$launcher" 2>/dev/null
        if "$bin/cuinterpose" restore --dir "$ckpt" --json >"$logs/ipc-$tag-restore.json" 2>"$logs/ipc-$tag-restore.err"; then
            touch "$b/go"
            local verdict; verdict=$(ipc_verdict "$logs/ipc-$tag-disk.jsonl")
            row "ipc $tag checkpoint/restore" "-" "$(python3 - "$logs/ipc-$tag-checkpoint.json" "$logs/ipc-$tag-restore.json" <<'PY'
import json, sys
c, r = json.load(open(sys.argv[1])), json.load(open(sys.argv[2]))
rate = lambda p: "(%dMiB@%.2fGB/s)" % (p["bytes"] >> 20, p["bytes"] / p["millis"] / 1e6) if p["bytes"] else ""
ph = lambda rep: " ".join("%s=%.0f%s" % (p["name"], p["millis"], rate(p)) for p in rep["phases"] if p["millis"] >= 1)
print("checkpoint %s; restore %s; images %d MiB" % (ph(c), ph(r), c["image_bytes"] >> 20))
PY
)" "${verdict%% *}"
            [ "$verdict" = ok ] || log "ipc $tag disk: $verdict"
        else
            row "ipc $tag checkpoint/restore" "-" "restore: $(tail -3 "$logs/ipc-$tag-restore.err" | tr '\n\t' '  ')" FAIL
            cp /tmp/cuinterpose-restore-*/restore.log "$logs/ipc-$tag-criu-restore.log" 2>/dev/null
            touch "$b/go"
        fi
        cp "$ckpt/images/dump.log" "$logs/ipc-$tag-criu-dump.log" 2>/dev/null
    else
        row "ipc $tag checkpoint/restore" "-" "checkpoint: $(tail -3 "$logs/ipc-$tag-checkpoint.err" 2>/dev/null | tr '\n\t' '  ')" FAIL
        touch "$b/go"; kill "$launcher" 2>/dev/null
    fi
    rm -rf "$ckpt" "$b"
}
if wants ipc; then
    log "legacy CUDA IPC served by the shims: demo, PyTorch default allocator, CuPy ipcGetMemHandle"
    for sharing in legacy-ipc private; do
        if timeout 300 "$bin/cuinterpose" demo --sharing "$sharing" >"$logs/ipc-demo-$sharing.txt" 2>"$logs/ipc-demo-$sharing.err"; then
            row "demo --sharing $sharing" "-" "$(tail -1 "$logs/ipc-demo-$sharing.txt")" ok
        else
            row "demo --sharing $sharing" "-" "$(tail -2 "$logs/ipc-demo-$sharing.err" | tr '\n\t' '  ')" FAIL
        fi
    done
    # PyTorch's own allocator (PYTORCH_CUDA_ALLOC_CONF unset: torch_share.py --allocator default
    # removes it): the tensor travels as legacy IPC, with its IPC event (left native).
    unset PYTORCH_CUDA_ALLOC_CONF
    torch_ipc=("$repo/scripts/gpu/torch_share.py" --allocator default --size-mb 1024)
    if CUINTERPOSE_ALLOC=vmm timeout 300 "$bin/cuinterpose" run -- python3 "${torch_ipc[@]}" --mode plain --require-shim \
            >"$logs/ipc-torch-plain.jsonl" 2>"$logs/ipc-torch-plain.err"; then
        row "ipc torch plain under shim" "-" "all phases ok" ok
    else
        row "ipc torch plain under shim" "-" "$(grep '"ok": false' "$logs/ipc-torch-plain.jsonl" | head -1 | cut -c1-160) $(tail -1 "$logs/ipc-torch-plain.err")" FAIL
    fi
    ipc_in_place torch "${torch_ipc[@]}"
    ipc_to_disk torch "${torch_ipc[@]}"
    if python3 -c "import cupy" 2>/dev/null; then
        cupy_ipc=("$repo/scripts/gpu/cupy_ipc.py" --size-mb 1024)
        timeout 300 python3 "${cupy_ipc[@]}" --mode plain >"$logs/ipc-cupy-native.jsonl" 2>"$logs/ipc-cupy-native.err" \
            && row "ipc cupy without shim" "-" "all phases ok" ok \
            || row "ipc cupy without shim" "-" "$(grep '"ok": false' "$logs/ipc-cupy-native.jsonl" | head -1 | cut -c1-160)" FAIL
        ipc_in_place cupy "${cupy_ipc[@]}"
    else
        row "ipc cupy" "-" "cupy is not installed on this machine" SKIPPED
    fi
fi

# NCCL tensor-parallel group (scripts/gpu/nccl_tp.py): one rank per GPU, at most two. On a one-GPU
# machine the group has one rank: NCCL's own buffers, its graph capture and its sockets go through
# suspend/resume and checkpoint/restore, without peer sharing (that needs nvidia-h200-x2).
nccl_group() {  # tag extra-args... : starts the group in its own PID namespace, waits for ready.json
    local tag=$1; shift
    nccl_barrier=$(mktemp -d /tmp/nccl-barrier.XXXXXX)
    "$bin/cuinterpose" run --pid-namespace -- python3 "$repo/scripts/gpu/nccl_tp.py" --mode barrier \
        --barrier-dir "$nccl_barrier" --world-size "$nccl_world" --require-shim --timeout 240 "$@" \
        >"$logs/nccl-$tag.jsonl" 2>"$logs/nccl-$tag.err" &
    nccl_launcher=$!
    for _ in $(seq 180); do [ -f "$nccl_barrier/ready.json" ] && return 0; sleep 1; done
    return 1
}
nccl_finish() {  # tag: lets the group run its after phases; prints the verdict and the failed phase
    local tag=$1
    touch "$nccl_barrier/go"
    for _ in $(seq 180); do grep -q '"phase": "done"' "$logs/nccl-$tag.jsonl" && break; sleep 1; done
    if grep -q '"phase": "done"' "$logs/nccl-$tag.jsonl" && ! grep -q '"ok": false' "$logs/nccl-$tag.jsonl"; then
        echo ok
    else
        echo "FAIL $(grep '"ok": false' "$logs/nccl-$tag.jsonl" | head -1 | cut -c1-160)"
    fi
}
if wants nccl; then
    log "NCCL tensor-parallel group under the shim"
    gpus=$(nvidia-smi --query-gpu=index --format=csv,noheader | wc -l)
    nccl_world=$(( gpus >= 2 ? 2 : 1 ))
    if timeout 300 "$bin/cuinterpose" run -- python3 scripts/gpu/nccl_tp.py --mode plain --world-size "$nccl_world" \
            --require-shim >"$logs/nccl-plain.jsonl" 2>"$logs/nccl-plain.err"; then
        row "nccl ${nccl_world} rank(s), plain under shim" "-" "$(grep '"phase": "start"' "$logs/nccl-plain.jsonl" | head -1 | python3 -c "import json,sys;r=json.loads(sys.stdin.readline());print('nccl', r.get('nccl'), 'all phases ok')")" ok
    else
        row "nccl ${nccl_world} rank(s), plain under shim" "-" "$(grep '"ok": false' "$logs/nccl-plain.jsonl" | head -1 | cut -c1-160) $(tail -1 "$logs/nccl-plain.err")" FAIL
    fi

    if nccl_group inplace; then
        root=$(python3 -c "import json;print(json.load(open('$nccl_barrier/ready.json'))['root_pid'])")
        # ready.json has namespace pids; the tool wants the launcher (it finds the namespace's init).
        "$bin/cuinterpose" inspect --pid "$nccl_launcher" --json >"$logs/nccl-inspect.json" 2>"$logs/nccl-inspect.err"
        tracked=$(python3 -c "
import json; r = json.load(open('$logs/nccl-inspect.json'))
s = r.get('shared', [])
print('%d shared allocations, %d MiB, %d with importers' % (len(s), sum(a.get('size', 0) for a in s) >> 20, sum(1 for a in s if a.get('importers'))))" 2>/dev/null || echo "inspect failed: $(tail -1 "$logs/nccl-inspect.err")")
        row "nccl inspect" "-" "$tracked" measured
        if "$bin/cuinterpose" suspend --pid "$nccl_launcher" --json >"$logs/nccl-suspend.json" 2>"$logs/nccl-suspend.err" \
                && "$bin/cuinterpose" resume --pid "$nccl_launcher" --json >"$logs/nccl-resume.json" 2>"$logs/nccl-resume.err"; then
            times=$(python3 - "$logs/nccl-suspend.json" "$logs/nccl-resume.json" <<'PY'
import json, sys
s, r = json.load(open(sys.argv[1])), json.load(open(sys.argv[2]))
print("suspend %.0f ms, resume %.0f ms, carried %d MiB" % (s["total_millis"], r["total_millis"], s.get("saved_bytes", 0) >> 20))
PY
)
            verdict=$(nccl_finish inplace)
            row "nccl suspend/resume, all-reduce + graph replay" "-" "$times" "$verdict"
        else
            row "nccl suspend/resume" "-" "$(tail -2 "$logs/nccl-suspend.err" "$logs/nccl-resume.err" 2>/dev/null | tr '\n\t' '  ' | cut -c1-200)" FAIL
            nccl_finish inplace >/dev/null
        fi
    else
        row "nccl suspend/resume" "-" "never ready: $(tail -1 "$logs/nccl-inplace.err")" FAIL
        kill "$nccl_launcher" 2>/dev/null
    fi
    wait "$nccl_launcher" 2>/dev/null

    maps=("")
    [ "$nccl_world" -ge 2 ] && maps+=("0=1,1=0")
    for map in "${maps[@]}"; do
        tag=disk${map:+-swapped}
        ckpt=/tmp/nccl-ckpt.$$
        if nccl_group "$tag"; then
            if "$bin/cuinterpose" checkpoint --pid "$nccl_launcher" --dir "$ckpt" --json \
                    >"$logs/nccl-$tag-checkpoint.json" 2>"$logs/nccl-$tag-checkpoint.err"; then
                wait "$nccl_launcher" 2>/dev/null
                if "$bin/cuinterpose" restore --dir "$ckpt" ${map:+--device-map "$map"} --json \
                        >"$logs/nccl-$tag-restore.json" 2>"$logs/nccl-$tag-restore.err"; then
                    verdict=$(nccl_finish "$tag")
                    row "nccl checkpoint/restore${map:+ --device-map $map}" "-" "$(python3 - "$logs/nccl-$tag-checkpoint.json" "$logs/nccl-$tag-restore.json" <<'PY'
import json, sys
c, r = json.load(open(sys.argv[1])), json.load(open(sys.argv[2]))
ph = lambda rep: " ".join("%s=%.0f" % (p["name"], p["millis"]) for p in rep["phases"] if p["millis"] >= 1)
print("checkpoint %s; restore %s; images %d MiB" % (ph(c), ph(r), c["image_bytes"] >> 20))
PY
)" "$verdict"
                else
                    row "nccl checkpoint/restore${map:+ --device-map $map}" "-" "restore: $(grep -v '^$' "$logs/nccl-$tag-restore.err" | tail -3 | tr '\n\t' '  ' | cut -c1-240)" FAIL
                    cp /tmp/cuinterpose-restore-*/restore.log "$logs/nccl-$tag-criu-restore.log" 2>/dev/null
                fi
            else
                row "nccl checkpoint${map:+ --device-map $map}" "-" "checkpoint: $(grep -v '^$' "$logs/nccl-$tag-checkpoint.err" | tail -3 | tr '\n\t' '  ' | cut -c1-240)" FAIL
                nccl_finish "$tag" >/dev/null
            fi
            cp "$ckpt/images/dump.log" "$logs/nccl-$tag-criu-dump.log" 2>/dev/null
        else
            row "nccl checkpoint" "-" "never ready: $(tail -1 "$logs/nccl-$tag.err")" FAIL
        fi
        kill "$nccl_launcher" 2>/dev/null; wait "$nccl_launcher" 2>/dev/null
        rm -rf "$ckpt"
    done

    # For contrast: the driver's own checkpoint of the same group without the shim, every call bounded.
    nccl_barrier=$(mktemp -d /tmp/nccl-native.XXXXXX)
    timeout 400 python3 scripts/gpu/nccl_tp.py --mode barrier --barrier-dir "$nccl_barrier" \
        --world-size "$nccl_world" --timeout 120 >"$logs/nccl-native.jsonl" 2>"$logs/nccl-native.err" &
    native_launcher=$!
    for _ in $(seq 180); do [ -f "$nccl_barrier/ready.json" ] && break; sleep 1; done
    if [ -f "$nccl_barrier/ready.json" ]; then
        pids=$(python3 -c "import json;print(','.join(map(str, json.load(open('$nccl_barrier/ready.json'))['pids'])))")
        timeout 300 python3 scripts/gpu/native_contrast.py --pids "$pids" --limit 60 \
            >"$logs/nccl-native-contrast.jsonl" 2>&1
        native=$(python3 -c "
import json
calls = [json.loads(l) for l in open('$logs/nccl-native-contrast.jsonl') if l.startswith('{')]
steps = ' '.join('%s=%s' % (c['step'], 'HUNG' if c.get('hung') else c['result']) for c in calls if c['step'] != 'summary')
print(steps, '->', next((c['outcome'] for c in calls if c['step'] == 'summary'), 'no summary'))" 2>/dev/null || echo "no report")
        touch "$nccl_barrier/go"
        for _ in $(seq 120); do grep -q '"phase": "done"' "$logs/nccl-native.jsonl" && break; sleep 1; done
        after=$(grep -q '"phase": "done"' "$logs/nccl-native.jsonl" && ! grep -q '"ok": false' "$logs/nccl-native.jsonl" \
            && echo "group ran on correctly" || echo "group broken: $(grep '"ok": false' "$logs/nccl-native.jsonl" | head -1 | cut -c1-120)")
        row "nccl ${nccl_world} rank(s) without shim: native checkpoint" "-" "$native; $after" measured
    else
        row "nccl without shim: native checkpoint" "-" "never ready: $(tail -1 "$logs/nccl-native.err")" FAIL
    fi
    pkill -9 -f "nccl_tp.py --mode barrier --barrier-dir $nccl_barrier" 2>/dev/null
    wait "$native_launcher" 2>/dev/null
    [ "$nccl_world" -ge 2 ] || row "nccl two ranks: peer sharing, --device-map 0=1,1=0" "-" "skipped: one GPU (needs nvidia-h200-x2)" "not run"
fi

if wants keep; then
    # The whole-process case with cuMemAlloc owned by the shim (vmm, the default) and the default
    # carrier (auto: the bench prepares it first, as a user does with `cuinterpose prepare`);
    # bench-all adds each process's own carrier, the carrier helper unprepared, and cuMemAlloc
    # left to the driver (CUINTERPOSE_ALLOC=native: 0.84-0.93x native, measured in session 7).
    wholes=(vmm)
    wants bench-all && wholes+=(vmm-process vmm-helper native)
    for alloc in "${wholes[@]}"; do
    carrier=auto
    case $alloc in *-process) carrier=process ;; *-helper) carrier=helper ;; esac
    log "keep: bench's whole-process case (16 GiB of cuMemAlloc ($alloc), plain twice, --keep-contexts twice, native)"
    if CUINTERPOSE_ALLOC=${alloc%-*} timeout 500 "$bin/cuinterpose" bench --no-overhead --no-capture --carrier "$carrier" \
            --json-out "$logs/bench-whole-$alloc.json" >"$logs/bench-whole-$alloc.txt" 2>"$logs/bench-whole-$alloc.err"; then
        cat "$logs/bench-whole-$alloc.txt"
        row "bench whole process ($alloc)" "-" "$(python3 - "$logs/bench-whole-$alloc.json" <<'PY'
import json, sys
w = json.load(open(sys.argv[1]))["whole"]
p1, p, k1, k, n = w["plain_first"], w["plain"], w["keep_contexts_first"], w["keep_contexts"], w["native"]
print("%d GiB %s: plain 1 %.0f+%.0f ms (%.2fx), plain 2 %.0f+%.0f ms (%.2fx native %.0f+%.0f ms); keep-contexts 1 %.0f+%.0f ms, %.1f/%.1f GB/s; 2 %.0f+%.0f ms, %.1f/%.1f GB/s" % (
    w["bytes"] >> 30, w["memory"], p1["suspend_millis"], p1["resume_millis"], w["speedup_vs_native_first"],
    p["suspend_millis"], p["resume_millis"], w["speedup_vs_native"],
    n["lock_millis"] + n["checkpoint_millis"], n["restore_millis"] + n["unlock_millis"],
    k1["suspend_millis"], k1["resume_millis"], k1["suspend_gb_per_s"], k1["resume_gb_per_s"],
    k["suspend_millis"], k["resume_millis"], k["suspend_gb_per_s"], k["resume_gb_per_s"]) + (
    "; prepared first: %d MiB pinned ahead in %.0f ms" % (sum(x["pinned_bytes"] for x in w["prepared"]["processes"]) >> 20, w["prepared"]["total_millis"])
    if w.get("prepared") else "") + "; plain 1 / 2 parts: " + " / ".join(
    ", ".join("%s %.0f" % (ph["name"], ph["millis"]) for ph in r["suspend_phases"] + r["resume_phases"]
              if ph["name"] in ("save", "native-checkpoint", "native-restore", "load"))
    for r in (p1, p)))
PY
)" measured
    else
        row "bench whole process ($alloc)" "-" "$(tail -2 "$logs/bench-whole-$alloc.err" | tr '\n\t' '  ')" FAIL
    fi
    done
fi

# One process holding device memory (scripts/gpu/{jax,torch}_hold.py), first without the shim (the
# GPU memory it uses natively: the overhead baseline), then under it: suspended and resumed plainly
# (round 1) and with --keep-contexts (round 2), its checksums and matmul unchanged after each.
# hold_case TAG ENV-ASSIGNMENT... -- SCRIPT ARGS...
hold_case() {
    local tag=$1; shift
    local envs=()
    while [ "$1" != "--" ]; do envs+=("$1"); shift; done
    shift
    local barrier used_native used_shim pid holder round mode flag used_before used_suspended verdict
    log "hold: $tag"
    barrier=$(mktemp -d /tmp/hold.XXXXXX)
    env "${envs[@]}" timeout 600 python3 "$@" --barrier-dir "$barrier/native" --rounds 1 \
        >"$logs/hold-$tag-native.jsonl" 2>"$logs/hold-$tag-native.err" &
    holder=$!
    for _ in $(seq 300); do [ -f "$barrier/native/ready.json" ] && break; sleep 1; done
    used_native=$(nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits | head -1)
    touch "$barrier/native/go-1"; wait "$holder" 2>/dev/null
    env "${envs[@]}" "$bin/cuinterpose" run -- python3 "$@" --barrier-dir "$barrier/shim" --require-shim --rounds 2 \
        >"$logs/hold-$tag.jsonl" 2>"$logs/hold-$tag.err" &
    holder=$!
    for _ in $(seq 300); do [ -f "$barrier/shim/ready.json" ] && break; sleep 1; done
    if [ ! -f "$barrier/shim/ready.json" ]; then
        row "hold $tag" "-" "never ready: $(tail -1 "$logs/hold-$tag.err")" FAIL
        kill "$holder" 2>/dev/null; wait "$holder" 2>/dev/null; rm -rf "$barrier"
        return
    fi
    used_shim=$(nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits | head -1)
    row "hold $tag memory" "-" "GPU used natively ${used_native} MiB, under the shim ${used_shim} MiB ($((used_shim - used_native)) MiB more)" measured
    pid=$(python3 -c "import json;print(json.load(open('$barrier/shim/ready.json'))['pid'])")
    "$bin/cuinterpose" inspect --pid "$pid" --json >"$logs/hold-$tag-inspect.json" 2>&1
    for round in 1 2; do
        mode=$([ "$round" = 1 ] && echo plain || echo keep-contexts)
        flag=$([ "$round" = 1 ] || echo --keep-contexts)
        used_before=$(nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits | head -1)
        # shellcheck disable=SC2086 # an empty flag is no word
        if ! "$bin/cuinterpose" suspend --pid "$pid" $flag --json >"$logs/hold-$tag-suspend-$round.json" 2>"$logs/hold-$tag-suspend-$round.err"; then
            row "hold $tag $mode suspend" "-" "$(tail -2 "$logs/hold-$tag-suspend-$round.err" | tr '\n\t' '  ')" FAIL
            touch "$barrier/shim/go-$round"; continue
        fi
        used_suspended=$(nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits | head -1)
        if ! "$bin/cuinterpose" resume --pid "$pid" --json >"$logs/hold-$tag-resume-$round.json" 2>"$logs/hold-$tag-resume-$round.err"; then
            row "hold $tag $mode resume" "-" "$(tail -2 "$logs/hold-$tag-resume-$round.err" | tr '\n\t' '  ')" FAIL
            touch "$barrier/shim/go-$round"; continue
        fi
        touch "$barrier/shim/go-$round"
        for _ in $(seq 120); do [ -f "$barrier/shim/checked-$round" ] && break; sleep 1; done
        verdict=$(grep -q '^ok' "$barrier/shim/checked-$round" 2>/dev/null && echo ok || echo FAIL)
        row "hold $tag $mode suspend/resume" "-" "$(python3 - "$logs/hold-$tag-suspend-$round.json" "$logs/hold-$tag-resume-$round.json" <<PY
import json, sys
s, r = json.load(open(sys.argv[1])), json.load(open(sys.argv[2]))
def phase(report, name):
    return sum(p["millis"] for p in report["phases"] if p["name"] == name)
moved = s["saved_bytes"]
rate = lambda ms: moved / ms / 1e6 if ms else 0.0
print("suspend %.0f ms (save %.0f ms, %.1f GB/s), resume %.0f ms (load %.0f ms, %.1f GB/s), carried %d MiB, GPU used ${used_before}->${used_suspended} MiB" % (
    s["total_millis"], phase(s, "save"), rate(phase(s, "save")), r["total_millis"], phase(r, "load"), rate(phase(r, "load")), moved >> 20))
PY
)" "$verdict"
    done
    timeout 120 tail --pid="$holder" -f /dev/null
    kill "$holder" 2>/dev/null; wait "$holder" 2>/dev/null
    rm -rf "$barrier"
}

if wants hold; then
    # XLA makes its memory with private cuMemCreate: carried whatever CUINTERPOSE_ALLOC says.
    hold_case jax XLA_PYTHON_CLIENT_PREALLOCATE=false -- "$repo/scripts/gpu/jax_hold.py" --size-gb 8
    # PyTorch's default caching allocator uses cudaMalloc: carried when the shim owns cuMemAlloc.
    hold_case torch-default CUINTERPOSE_ALLOC=vmm -- "$repo/scripts/gpu/torch_hold.py" --size-gb 8
    # Expandable segments are private cuMemCreate allocations.
    hold_case torch-expandable PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True -- "$repo/scripts/gpu/torch_hold.py" --size-gb 8
fi

# Busy workloads (scripts/gpu/busy_*.py, issue 27): each keeps issuing GPU work, with no barrier and
# no cooperation, while the tool suspends and resumes it, then checkpoints it to disk and restores
# it; it checks its own results every iteration and says at the end, in one JSON summary line,
# whether every check passed. The pids the tool is given are the launchers' (`cuinterpose run
# --pid-namespace`: the tool finds the namespace's init, as in the step nccl).
busy_ms() { echo $(( ($(date +%s%N) - $1) / 1000000 )); }  # ms since a `date +%s%N` stamp
busy_wait_ready() {  # path seconds pid: whether the file appeared in time (no waiting on a dead pid)
    local i
    for ((i = 0; i < $2 * 5; i++)); do
        [ -f "$1" ] && return 0
        kill -0 "$3" 2>/dev/null || break
        sleep 0.2
    done
    [ -f "$1" ]
}
busy_step_note() {  # what losses-file steps: "<what> at step N" (a warning past the compared steps)
    local n; n=$(busy_lines "$2")
    if [ "$n" -ge "$3" ]; then echo "$1 at step $n: AFTER the $3 compared steps"; else echo "$1 at step $n"; fi
}
busy_running() {  # ready-dir: whether a workload process started with it is alive (restored ones too)
    pgrep -f "ready-dir $1" >/dev/null 2>&1
}
busy_wait_summary() {  # jsonl seconds ready-dir: whether a summary line appeared in time (the restored
    local i             # tree is no child of ours: no waiting once none of its processes is left)
    for ((i = 0; i < $2; i++)); do
        grep -q '"summary": true' "$1" 2>/dev/null && return 0
        busy_running "$3" || break
        sleep 1
    done
    grep -q '"summary": true' "$1" 2>/dev/null
}
busy_drained() {  # report files...: the largest "drained <label> in <ms> ms" the tool printed, or "-"
    python3 - "$@" <<'PY'
import re, sys
found = []
for path in sys.argv[1:]:
    try:
        text = open(path, errors="replace").read()
    except OSError:
        continue
    # The text form, loosely, and a JSON key that names a drain with a number of ms, in case.
    found += re.findall(r"drained\b[^\n]*?\bin\s*([0-9]+(?:\.[0-9]+)?)\s*ms", text, re.I)
    found += re.findall(r'"[^"\n]*drain[^"\n]*(?:ms|millis)[^"\n]*"\s*:\s*([0-9]+(?:\.[0-9]+)?)', text, re.I)
print("%.0f ms" % max(map(float, found)) if found else "-")
PY
}
busy_summary() {  # jsonl err: "ok|FAIL<TAB>figures" from the workload's last summary line
    python3 - "$1" "$2" <<'PY'
import json, sys
record = None
for line in open(sys.argv[1], errors="replace"):
    if line.startswith("{") and '"summary": true' in line:
        try:
            record = json.loads(line)
        except ValueError:
            pass
if record is None:
    try:
        err = [l.strip() for l in open(sys.argv[2], errors="replace") if l.strip()]
    except OSError:
        err = []
    print("FAIL\tno summary line; %s" % (err[-1][:200] if err else "no stderr"))
    sys.exit()
parts = ["%d iterations, %d failed checks, longest iteration %.0f ms" % (
    record["iterations"], record["failures"], record["longest_iteration_ms"])]
if record.get("rounds_per_s"):
    parts.append("%.0f rounds/s" % record["rounds_per_s"])
if record.get("reference"):
    parts.append("losses bit-identical: %s (%d of %d steps compared)" % (
        "yes" if record.get("bit_identical") else "no", record.get("compared", 0), record.get("steps", 0)))
if record.get("first_failure"):
    parts.append("first failure: %s" % json.dumps(record["first_failure"], sort_keys=True)[:200])
print("%s\t%s" % ("ok" if record.get("ok") else "FAIL", "; ".join(parts)))
PY
}
busy_reap() {  # pid: ends our child (TERM, then KILL after 30 s) and reaps it, bounded
    kill "$1" 2>/dev/null
    timeout 30 tail --pid="$1" -f /dev/null
    kill -9 "$1" 2>/dev/null
    wait "$1" 2>/dev/null
}
busy_tail() { grep -v '^$' "$1" 2>/dev/null | tail -2 | tr '\n\t' '  ' | cut -c1-200; }
busy_lines() { if [ -f "$1" ]; then wc -l <"$1"; else echo 0; fi; }
# busy_plain TAG ENV-ASSIGNMENT... -- SCRIPT ARGS...: the workload alone, without the shim or the tool
# (ready, 2 s of work, stop), so that a failure under the tool is not the workload's own.
busy_plain() {
    local tag=$1; shift
    local envs=()
    while [ "$1" != "--" ]; do envs+=("$1"); shift; done
    shift
    busy_wanted "$tag" || return 0
    local dir lg pid st result
    dir=$(mktemp -d "/tmp/busy-plain-$tag.XXXXXX")
    lg=$logs/busy-plain-$tag
    env "${envs[@]}" python3 "$@" --ready-dir "$dir" --max-seconds 300 >"$lg.jsonl" 2>"$lg.err" &
    pid=$!
    busy_wait_ready "$dir/ready.json" 300 "$pid" && sleep 2
    touch "$dir/stop"
    timeout 120 tail --pid="$pid" -f /dev/null
    kill -0 "$pid" 2>/dev/null && busy_reap "$pid"
    wait "$pid" 2>/dev/null
    st=$?
    result=$(busy_summary "$lg.jsonl" "$lg.err")
    row "busy $tag without shim" "-" "${result#*$'\t'}" "$([ "$st" -eq 0 ] && [ "${result%%$'\t'*}" = ok ] && echo ok || echo "FAIL (exit $st)")"
    pkill -9 -f "ready-dir $dir" 2>/dev/null
    rm -rf "$dir"
}
# busy_idle TAG ENV-ASSIGNMENT... -- SCRIPT ARGS...: the workload under the shim for a few seconds,
#   no capture: what the shim costs it while it runs (rounds/s against busy_plain's).
busy_idle() {
    local tag=$1; shift
    local envs=(PYTHONFAULTHANDLER=1)
    while [ "$1" != "--" ]; do envs+=("$1"); shift; done
    shift
    busy_wanted "$tag" || return 0
    local dir lg pid st result
    dir=$(mktemp -d "/tmp/busy-idle-$tag.XXXXXX")
    lg=$logs/busy-idle-$tag
    env "${envs[@]}" "$bin/cuinterpose" run --pid-namespace -- python3 "$@" --ready-dir "$dir" \
        --require-shim --max-seconds 300 >"$lg.jsonl" 2>"$lg.err" &
    pid=$!
    busy_wait_ready "$dir/ready.json" 300 "$pid" && sleep 5
    touch "$dir/stop"
    timeout 120 tail --pid="$pid" -f /dev/null
    kill -0 "$pid" 2>/dev/null && busy_reap "$pid"
    wait "$pid" 2>/dev/null
    st=$?
    result=$(busy_summary "$lg.jsonl" "$lg.err")
    row "busy $tag under the shim, no capture" "-" "${result#*$'\t'}" "$([ "$st" -eq 0 ] && [ "${result%%$'\t'*}" = ok ] && echo ok || echo "FAIL (exit $st)")"
    pkill -9 -f "ready-dir $dir" 2>/dev/null
    rm -rf "$dir"
}
# busy_case TAG ACTIONS LOSSES STEPS ENV-ASSIGNMENT... -- SCRIPT ARGS...
#   ACTIONS: "suspend", "checkpoint" or "suspend,checkpoint"; LOSSES/STEPS: the training loop's loss
#   file and the steps it must reach before stop (else "-" and 0), compared with $busy_ref's.
# BUSY_SUSPEND_ARGS: extra arguments of the busy case's `suspend` (e.g. --keep-contexts).
busy_case() {
    local tag=$1 actions=$2 losses=$3 need_steps=$4; shift 4
    local suspend_args
    read -r -a suspend_args <<<"${BUSY_SUSPEND_ARGS:-}"
    local envs=(PYTHONFAULTHANDLER=1)  # a crash prints every Python thread's stack to the .err
    # LANE_SHIM_LOG=debug: the shims' log level for the busy cases (into each workload's .err).
    [ -n "${LANE_SHIM_LOG:-}" ] && envs+=("CUINTERPOSE_LOG=$LANE_SHIM_LOG")
    while [ "$1" != "--" ]; do envs+=("$1"); shift; done
    shift
    busy_wanted "$tag" || return 0
    local dir lg launcher t0 st ckpt restored=no verdict=ok
    local suspend_ms=- resume_ms=- checkpoint_ms=- restore_ms=- drained_s=- drained_c=- notes=()  # "N ms" or "exit N"
    log "busy: $tag ($actions)"
    dir=$(mktemp -d "/tmp/busy-$tag.XXXXXX")
    ckpt=/tmp/busy-ckpt.$$.$tag
    lg=$logs/busy-$tag
    env "${envs[@]}" "$bin/cuinterpose" run --pid-namespace -- python3 "$@" --ready-dir "$dir" --require-shim \
        --max-seconds 500 >"$lg.jsonl" 2>"$lg.err" &
    launcher=$!
    if ! busy_wait_ready "$dir/ready.json" 300 "$launcher"; then
        row "busy $tag" "-" "never ready: $(busy_summary "$lg.jsonl" "$lg.err" | cut -f2)" FAIL
        touch "$dir/stop"; busy_reap "$launcher"
        rm -rf "$dir"; return
    fi
    sleep 2.5  # let it work
    "$bin/cuinterpose" inspect --json --pid "$launcher" >"$lg-inspect.json" 2>&1  # what the shims track
    if [[ $actions == *suspend* ]]; then
        [ "$losses" = - ] || notes+=("$(busy_step_note suspended "$losses" "$need_steps")")
        t0=$(date +%s%N)
        "$bin/cuinterpose" suspend "${suspend_args[@]}" --pid "$launcher" >"$lg-suspend.txt" 2>&1
        st=$?
        if [ "$st" -eq 0 ]; then
            suspend_ms="$(busy_ms "$t0") ms"
            sleep 1
            t0=$(date +%s%N)
            "$bin/cuinterpose" resume --pid "$launcher" >"$lg-resume.txt" 2>&1
            st=$?
            if [ "$st" -eq 0 ]; then resume_ms="$(busy_ms "$t0") ms"
                # What the shims track once rebuilt: compared with the inspect before the suspend.
                "$bin/cuinterpose" inspect --json --pid "$launcher" >"$lg-inspect-resumed.json" 2>&1
            else resume_ms="exit $st"; verdict=FAIL; notes+=("resume: $(busy_tail "$lg-resume.txt")"); fi
        else
            suspend_ms="exit $st"; verdict=FAIL; notes+=("suspend: $(busy_tail "$lg-suspend.txt")")
        fi
        drained_s=$(busy_drained "$lg-suspend.txt")
        sleep 2.5  # let it work again
    fi
    if [[ $actions == *checkpoint* ]]; then
        if kill -0 "$launcher" 2>/dev/null; then
            [ "$losses" = - ] || notes+=("$(busy_step_note checkpointed "$losses" "$need_steps")")
            t0=$(date +%s%N)
            "$bin/cuinterpose" checkpoint --pid "$launcher" --dir "$ckpt" >"$lg-checkpoint.txt" 2>&1
            st=$?
            drained_c=$(busy_drained "$lg-checkpoint.txt")
            if [ "$st" -eq 0 ]; then
                checkpoint_ms="$(busy_ms "$t0") ms"
                # Without --leave-running the tree is gone after the dump: reap the launcher (bounded).
                timeout 60 tail --pid="$launcher" -f /dev/null
                kill -0 "$launcher" 2>/dev/null || wait "$launcher" 2>/dev/null
                t0=$(date +%s%N)
                "$bin/cuinterpose" restore --dir "$ckpt" >"$lg-restore.txt" 2>&1
                st=$?
                if [ "$st" -eq 0 ]; then
                    restore_ms="$(busy_ms "$t0") ms"; restored=yes
                    sleep 2.5  # let the restored tree work
                else
                    restore_ms="exit $st"; verdict=FAIL; notes+=("restore: $(busy_tail "$lg-restore.txt")")
                    cp /tmp/cuinterpose-restore-*/restore.log "$lg-criu-restore.log" 2>/dev/null
                fi
                cp "$ckpt/images/dump.log" "$lg-criu-dump.log" 2>/dev/null
            else
                checkpoint_ms="exit $st"; verdict=FAIL; notes+=("checkpoint: $(busy_tail "$lg-checkpoint.txt")")
            fi
        else
            verdict=FAIL; notes+=("gone before the checkpoint")
        fi
    fi
    if [ "$losses" != - ]; then  # the training loop must reach its compared steps before stop
        for _ in $(seq 600); do
            [ "$(busy_lines "$losses")" -ge "$need_steps" ] && break
            busy_running "$dir" || break
            sleep 0.5
        done
    fi
    touch "$dir/stop"
    busy_wait_summary "$lg.jsonl" 240 "$dir" || notes+=("no summary line (within 240 s of stop, or its processes are gone)")
    if [ "$restored" = no ]; then  # still our child: its exit status too, bounded
        timeout 60 tail --pid="$launcher" -f /dev/null
        if kill -0 "$launcher" 2>/dev/null; then
            busy_reap "$launcher"; verdict=FAIL; notes+=("still running 60 s after stop: killed")
        else
            wait "$launcher" 2>/dev/null
            st=$?
            [ "$st" -eq 0 ] || { verdict=FAIL; notes+=("exit $st"); }
        fi
    fi
    if [ "$losses" != - ]; then  # the files themselves too, in case the run left no summary
        local written; written=$(busy_lines "$losses")
        if [ "$written" -lt "$need_steps" ]; then
            verdict=FAIL; notes+=("loss file: only $written of $need_steps steps written")
        elif cmp -s <(head -n "$need_steps" "$busy_ref") <(head -n "$need_steps" "$losses"); then
            notes+=("loss file: first $need_steps steps identical to the reference")
        else
            verdict=FAIL; notes+=("loss file: first $need_steps steps NOT identical to the reference")
        fi
    fi
    local result  # not "summary": row() appends to the file named by the global $summary
    result=$(busy_summary "$lg.jsonl" "$lg.err")
    [ "${result%%$'\t'*}" = ok ] || verdict=FAIL
    local figures="" drained=""
    [[ $actions == *suspend* ]] && figures="suspend $suspend_ms / resume $resume_ms"
    [[ $actions == *checkpoint* ]] && figures="${figures:+$figures; }checkpoint $checkpoint_ms / restore $restore_ms"
    [[ $actions == *suspend* ]] && drained="suspend $drained_s"
    [[ $actions == *checkpoint* ]] && drained="${drained:+$drained, }checkpoint $drained_c"
    drained="drained (max per process): $drained"
    figures="$figures; $drained; ${result#*$'\t'}"
    local note
    for note in "${notes[@]}"; do figures="$figures; $note"; done
    row "busy $tag" "-" "$figures" "$verdict"
    # Anything left (a failed stop): the stop file is there, so each ends by itself within
    # --max-seconds; the main script is ended here by its unique ready directory, its children
    # follow it (they watch their parent).
    pkill -9 -f "ready-dir $dir" 2>/dev/null
    rm -rf "$dir" "$ckpt"
}

if wants preempt; then
    log "kernels preempted between two contexts after a native checkpoint/restore of one (no shim)"
    (cd scripts/gpu && timeout 300 python3 preempt_after_restore.py) >"$logs/preempt.jsonl" 2>"$logs/preempt.err"
    while IFS=$'\t' read -r name figures verdict; do
        row "preempt after restore: $name" "-" "$figures" "$verdict"
    done < <(python3 -c "
import json
for l in open('$logs/preempt.jsonl'):
    r = json.loads(l)
    def times(s):
        return ''.join(' %s median/longest %s/%s ms' % (p, s[p]['median_ms'], s[p]['longest_ms']) for p in ('before', 'after') if p in s)
    w = '; '.join('%s %s rounds%s%s' % (s['worker'], s.get('rounds'), times(s), (', ' + s['error']) if s.get('error') else '') for s in r.get('workers', []))
    n = r.get('native', {})
    steps = ', '.join('%s %s' % (k, v if isinstance(v, str) else '%s ms' % v['ms']) for k, v in n.items())
    print('%s\t%s; %s\t%s' % (r['case'], steps, w, 'ok' if r['ok'] else 'FAIL'))
" 2>/dev/null)
    [ -s "$logs/preempt.jsonl" ] || row "preempt after restore" "-" "no output: $(tail -1 "$logs/preempt.err")" FAIL
fi

if wants busy; then
    log "busy workloads: suspend/resume and checkpoint/restore while they work"
    busy_steps=150
    busy_ref=$logs/busy-train-reference.losses
    if python3 -c "import cupy" 2>/dev/null; then
        # Kernels spinning on each other's flags in legacy IPC memory: suspend/resume only (issue 27).
        busy_plain spin -- "$repo/scripts/gpu/busy_spin.py"
        busy_idle spin-vmm CUINTERPOSE_ALLOC=vmm -- "$repo/scripts/gpu/busy_spin.py"
        busy_idle spin-native CUINTERPOSE_ALLOC=native -- "$repo/scripts/gpu/busy_spin.py"
        busy_case spin suspend - 0 CUINTERPOSE_ALLOC=vmm -- "$repo/scripts/gpu/busy_spin.py" --stall-timeout 20
        # The same without the driver's checkpoint (contexts kept): whether the native
        # checkpoint/restore of a context is what the pair fails on after a resume.
        BUSY_SUSPEND_ARGS=--keep-contexts busy_case spin-keep suspend - 0 CUINTERPOSE_ALLOC=vmm -- \
            "$repo/scripts/gpu/busy_spin.py" --stall-timeout 20
    else
        row "busy spin" "-" "cupy is not installed on this machine" SKIPPED
    fi
    # The run left alone: no shim, exactly 150 steps.
    if ! busy_wanted train; then
        :
    elif timeout 600 python3 "$repo/scripts/gpu/busy_train.py" --steps "$busy_steps" --losses "$busy_ref" \
            >"$logs/busy-train-reference.jsonl" 2>"$logs/busy-train-reference.err"; then
        row "busy train reference (no shim)" "-" "$(busy_summary "$logs/busy-train-reference.jsonl" "$logs/busy-train-reference.err" | cut -f2); $(python3 -c "
import json
r = [json.loads(l) for l in open('$logs/busy-train-reference.jsonl') if '\"summary\": true' in l][-1]
print('%d params, batch %d x %d, median step %.0f ms' % (r['params'], r['batch'], r['seq'], r['step_ms_median']))" 2>/dev/null)" ok
        for action in suspend checkpoint; do
            busy_case "train-$action" "$action" "$logs/busy-train-$action.losses" "$busy_steps" -- \
                "$repo/scripts/gpu/busy_train.py" --steps "$busy_steps" --losses "$logs/busy-train-$action.losses" \
                --reference "$busy_ref"
        done
    else
        row "busy train reference (no shim)" "-" "$(busy_summary "$logs/busy-train-reference.jsonl" "$logs/busy-train-reference.err" | cut -f2)" FAIL
    fi
    # Each workload alone first (the training loop's alone run is its reference above), then
    # under the tool. PyTorch's caching allocator on cudaMalloc (legacy IPC), then expandable
    # segments (VMM).
    busy_plain pair-default -- "$repo/scripts/gpu/busy_pair.py" --allocator default
    busy_case pair-default suspend,checkpoint - 0 CUINTERPOSE_ALLOC=vmm -- "$repo/scripts/gpu/busy_pair.py" --allocator default
    busy_plain pair-expandable -- "$repo/scripts/gpu/busy_pair.py" --allocator expandable
    busy_case pair-expandable suspend,checkpoint - 0 -- "$repo/scripts/gpu/busy_pair.py" --allocator expandable
    busy_plain jax XLA_PYTHON_CLIENT_PREALLOCATE=false -- "$repo/scripts/gpu/busy_jax.py"
    busy_case jax suspend,checkpoint - 0 XLA_PYTHON_CLIENT_PREALLOCATE=false -- "$repo/scripts/gpu/busy_jax.py"
    busy_plain nccl -- "$repo/scripts/gpu/busy_nccl.py"
    busy_case nccl suspend,checkpoint - 0 -- "$repo/scripts/gpu/busy_nccl.py"
fi

if wants launch; then
    log "launch-bound overhead: small launches and copies from several threads, with and without the shim"
    if "$bin/cuinterpose" bench --help 2>&1 | grep -q -- --launch; then
        timeout 300 "$bin/cuinterpose" bench --launch >"$logs/bench-launch.txt" 2>"$logs/bench-launch.err"
        st=$?
        line=$(grep -v '^$' "$logs/bench-launch.txt" | tail -1 | tr '\t' ' ' | cut -c1-300)
        [ -n "$line" ] || line="(no output; stderr: $(busy_tail "$logs/bench-launch.err"))"
        ratio=$(printf '%s\n' "$line" | grep -oiE 'ratio"?[[:space:]]*[:=]?[[:space:]]*[0-9]+(\.[0-9]+)?' | head -1 | grep -oE '[0-9]+(\.[0-9]+)?$')
        if [ "$st" -ne 0 ]; then
            row "bench --launch" "-" "exit $st: $(busy_tail "$logs/bench-launch.err")" FAIL
        elif [ -n "$ratio" ]; then
            row "bench --launch (target ratio <= 1.02)" "-" "$line" "$(python3 -c "print('ok' if $ratio <= 1.02 else 'ABOVE 1.02')")"
        else
            row "bench --launch" "-" "$line" measured
        fi
    else
        row "bench --launch" "-" "cuinterpose bench has no --launch in this build" "not run"
    fi
fi

if wants unlock; then
    log "open question: driver calls between native restore and unlock"
    timeout 120 python3 scripts/gpu/restore_before_unlock.py --wait 10 >"$logs/unlock.jsonl" 2>"$logs/unlock.err"
    row "calls before unlock" "-" "$(python3 -c "
import json
for l in open('$logs/unlock.jsonl'):
    r = json.loads(l)
    if r['phase'] == 'restored':
        print('returned=%s in %ss get_info=%s alloc=%s' % (r['returned'], r['seconds'], r.get('mem_get_info'), r.get('mem_alloc')))
" 2>/dev/null || tail -1 "$logs/unlock.err")" measured
fi

if wants placement; then
    log "open question: a pinned carrier in the application or in a helper never checkpointed"
    for gib in 8 16; do
        timeout 300 python3 scripts/gpu/carrier_placement.py --count "$gib" --size $((1 << 30)) \
            >"$logs/placement-$gib.jsonl" 2>"$logs/placement-$gib.err"
        placement_status=$?
        while IFS=$'\t' read -r name figures; do
            row "carrier placement: $name" "-" "$figures" measured
        done < <(python3 -c "
import json
steps = {}
for l in open('$logs/placement-$gib.jsonl'):
    r = json.loads(l)
    if r.get('summary'):
        print('%s, %d GiB\tcycle %d: suspend %.0f ms, resume %.0f ms, %.2fx native; GPU used while suspended %d MiB (the tool/helper context %d MiB)' % (r['case'], r['bytes'] >> 30, r['last_cycle'], r['suspend_ms'], r['resume_ms'], r['x_native'], r['suspended_used_mib'], r['context_mib']))
    elif 'step' in r and r['cycle'] == 2 and r['step'] != 'check':
        steps.setdefault(r['case'], []).append('%s %.0f' % (r['step'], r['millis']))
for case, parts in steps.items():
    print('%s steps, $gib GiB\t%s' % (case, ', '.join(parts)))
" 2>/dev/null)
        [ "$placement_status" = 0 ] || row "carrier placement, $gib GiB" "-" "exit $placement_status: $(tail -1 "$logs/placement-$gib.err")" FAIL
    done
fi

if wants floor; then
    log "the native pair of a nearly empty process, with and without its context's stack"
    (cd scripts/gpu && timeout 120 python3 context_floor.py --cycles 3) >"$logs/floor.jsonl" 2>"$logs/floor.err"
    floor_status=$?
    while IFS=$'\t' read -r name figures; do
        row "context floor: $name" "-" "$figures" measured
    done < <(python3 -c "
import json
rows = {}
for l in open('$logs/floor.jsonl'):
    r = json.loads(l)
    rows.setdefault(r['case'], []).append(r)
for case, rs in rows.items():
    last = rs[-1]
    freed = last.get('free_mib_shrunk', last['free_mib_before']) - last['free_mib_before']
    print('%s\tcheckpoint %s ms, restore %s ms (cycles 1-%d); stack %s B, %d MiB freed by the shrink; bytes intact %s' % (case, '/'.join('%.0f' % r['checkpoint_ms'] for r in rs), '/'.join('%.0f' % r['restore_ms'] for r in rs), len(rs), last['stack'], freed, all(r['intact'] for r in rs)))
" 2>/dev/null)
    [ "$floor_status" = 0 ] || row "context floor" "-" "exit $floor_status: $(tail -1 "$logs/floor.err")" FAIL
fi

if wants hang; then
    log "exporter checkpointed with a live import (hangs on r580; bounded)"
    timeout 120 "$bin/cuinterpose-scenarios" --json --driver fake exporter-live-import >"$logs/hang-fake.jsonl" 2>&1
    timeout 120 "$bin/cuinterpose-scenarios" --json --driver system --hang-limit-s 30 exporter-live-import >"$logs/hang-real.jsonl" 2>&1
    f=$(python3 -c "import json,sys;print(json.loads(open('$logs/hang-fake.jsonl').readline())['outcome'])" 2>/dev/null || echo error)
    r=$(python3 -c "import json,sys;print(json.loads(open('$logs/hang-real.jsonl').readline())['outcome'])" 2>/dev/null || echo error)
    row exporter-live-import "$f" "$r" "documented: fake times out, r580 hangs"
fi

# The kernel's GPU messages (Xid: a channel reset, a preemption timeout) while the lane ran.
{ dmesg 2>&1 || journalctl -k --no-pager 2>&1; } | grep -iE 'xid|nvrm' | tail -100 >"$logs/kernel-gpu.txt"
tar -C "$logs" -czf "$out/lane-logs.tgz" . 2>/dev/null
echo
echo "================ GPU lane summary ($(head -1 "$logs/gpu.txt")) ================"
column -t -s $'\t' -N SCENARIO,FAKE,REAL,VERDICT "$summary" 2>/dev/null || cat "$summary"
