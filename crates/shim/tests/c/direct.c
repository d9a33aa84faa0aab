/* Route 1: a program linked against libcuda (-lcuda) calls the driver through its PLT. */
#include "probe.h"
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

CUresult cuInit(unsigned);
CUresult cuDriverGetVersion(int *);
CUresult cuMemCreate(CUmemGenericAllocationHandle *, size_t, const CUmemAllocationProp *,
                     unsigned long long);
CUresult cuMemRelease(CUmemGenericAllocationHandle);
CUresult cuMemMap(CUdeviceptr, size_t, size_t, CUmemGenericAllocationHandle, unsigned long long);
CUresult cuMemGetAllocationGranularity(size_t *, const CUmemAllocationProp *, unsigned);
CUresult cuGetProcAddress_v2(const char *, void **, int, unsigned long long, int *);

/* Whether this process's control socket exists (the shim's runtime binds it at its start). */
static int control_socket(void) {
    const char *dir = getenv("CUINTERPOSE_CONTROL_DIR");
    char path[512], ns[64];
    struct stat st;
    ssize_t n;
    unsigned long long inode = 0;
    if (!dir) return -1;
    /* The shim names its socket cuinterpose-<pid namespace inode>-<pid>.sock. */
    n = readlink("/proc/self/ns/pid", ns, sizeof ns - 1);
    if (n <= 0) return -1;
    ns[n] = 0;
    if (sscanf(ns, "pid:[%llu]", &inode) != 1) return -1;
    snprintf(path, sizeof path, "%s/cuinterpose-%llu-%d.sock", dir, inode, (int)getpid());
    return stat(path, &st) == 0 && S_ISSOCK(st.st_mode);
}

int main(void) {
    report("addr.cuMemCreate", 0, 0, (void *)cuMemCreate);
    report("addr.cuMemMap", 0, 0, (void *)cuMemMap);
    report("addr.cuInit", 0, 0, (void *)cuInit);
    report("addr.cuGetProcAddress_v2", 0, 0, (void *)cuGetProcAddress_v2);
    report("addr.cuMemGetAllocationGranularity", 0, 0, (void *)cuMemGetAllocationGranularity);
    report("addr.cuDriverGetVersion", 0, 0, (void *)cuDriverGetVersion);

    report("call.cuMemCreate.before_init", cuMemCreate(NULL, 0, NULL, 0), 0, NULL);
    report("runtime.before_init", 0, control_socket(), NULL);
    report("call.cuInit", cuInit(0), 0, NULL);
    report("runtime.after_init", 0, control_socket(), NULL);
    int version = 0;
    CUresult r = cuDriverGetVersion(&version);
    report("call.cuDriverGetVersion", r, version, NULL);

    CUmemAllocationProp prop = posix_prop();
    size_t granularity = 0;
    report("call.granularity", cuMemGetAllocationGranularity(&granularity, &prop, 0),
           (int)(granularity >> 10), NULL);
    CUmemGenericAllocationHandle handle = 0;
    report("call.cuMemCreate.null_handle", cuMemCreate(NULL, granularity, &prop, 0), 0, NULL);
    report("call.cuMemCreate.null_prop", cuMemCreate(&handle, granularity, NULL, 0), 0, NULL);
    report("call.cuMemCreate.unaligned", cuMemCreate(&handle, 1, &prop, 0), 0, NULL);
    r = cuMemCreate(&handle, granularity, &prop, 0);
    report("call.cuMemCreate.ok", r, handle != 0, NULL);
    report("call.cuMemRelease.ok", cuMemRelease(handle), 0, NULL);
    report("call.cuMemRelease.bogus", cuMemRelease(0xdead), 0, NULL);
    return 0;
}
