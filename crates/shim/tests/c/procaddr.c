/* Route 3: the driver's resolvers. Built twice: linked against libcuda and calling the resolvers
 * through the PLT, and with -DVIA_DLSYM, where the driver is only dlopen()ed RTLD_LOCAL and the
 * resolvers come from dlsym(handle, ...) (the CUDA runtime's bootstrap). */
#include "probe.h"

#ifndef VIA_DLSYM
CUresult cuGetProcAddress(const char *, void **, int, unsigned long long);
CUresult cuGetProcAddress_v2(const char *, void **, int, unsigned long long, int *);
/* Weak: a driver need not export it (the fake does not); the shim always does. */
CUresult cuGetProcAddress_v2_ptsz(const char *, void **, int, unsigned long long, int *)
    __attribute__((weak));
#endif

static gpa_v1_t v1;
static gpa_v2_t v2, ptsz;

static void *q2(gpa_v2_t f, const char *label, const char *symbol, int version,
                unsigned long long flags) {
    void *p = (void *)0x1; /* the resolver must overwrite it */
    int status = -7;
    CUresult r = f(symbol, &p, version, flags, &status);
    if (r != 0 && p == (void *)0x1) p = NULL;
    report(label, r, status, p);
    return p;
}

static void *q1(const char *label, const char *symbol, int version) {
    void *p = NULL;
    CUresult r = v1(symbol, &p, version, 0);
    report(label, r, -1, p);
    return p;
}

int main(void) {
#ifdef VIA_DLSYM
    void *cuda = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!cuda) { fprintf(stderr, "dlopen: %s\n", dlerror()); return 2; }
    v1 = (gpa_v1_t)dlsym(cuda, "cuGetProcAddress");
    v2 = (gpa_v2_t)dlsym(cuda, "cuGetProcAddress_v2");
    ptsz = (gpa_v2_t)dlsym(cuda, "cuGetProcAddress_v2_ptsz");
#else
    v1 = cuGetProcAddress;
    v2 = cuGetProcAddress_v2;
    ptsz = cuGetProcAddress_v2_ptsz;
#endif
    if (!v1 || !v2) { fprintf(stderr, "no resolver\n"); return 2; }
    report("resolver.v2", 0, 0, (void *)v2);
    report("resolver.ptsz", 0, 0, (void *)ptsz);

    init_t init = (init_t)q2(v2, "v2.cuInit", "cuInit", 12000, 0);
    create_t create = (create_t)q2(v2, "v2.cuMemCreate", "cuMemCreate", 12000, 0);
    q2(v2, "v2.cuMemMap", "cuMemMap", 12000, 0);
    q2(v2, "v2.cuMemFree", "cuMemFree", 12000, 0);
    q2(v2, "v2.cuIpcOpenMemHandle", "cuIpcOpenMemHandle", 12000, 0);
    q2(v2, "v2.cuIpcOpenMemHandle.old_abi", "cuIpcOpenMemHandle", 10020, 0);
    q2(v2, "v2.cuMulticastBindMem", "cuMulticastBindMem", 12010, 0);
    q2(v2, "v2.cuMemcpyHtoD", "cuMemcpyHtoD", 12000, 0);
    q2(v2, "v2.cuMemGetAllocationGranularity", "cuMemGetAllocationGranularity", 12000, 0);
    q2(v2, "v2.cuCtxCreate", "cuCtxCreate", 12000, 0);
    q2(v2, "v2.cuGetExportTable", "cuGetExportTable", 12000, 0);
    q2(v2, "v2.cuNoSuchFunction", "cuNoSuchFunction", 12000, 0);
    q2(v2, "v2.too_new", "cuMemCreate", 99999, 0);
    q2(v2, "v2.not_yet", "cuMemCreate", 10000, 0);
    q2(v2, "v2.bad_flags", "cuMemCreate", 12000, 0x80);
    gpa_v2_t nested = (gpa_v2_t)q2(v2, "v2.cuGetProcAddress", "cuGetProcAddress", 12000, 0);
    q2(v2, "v2.cuGetProcAddress.old", "cuGetProcAddress", 11030, 0);
    {
        void *p = NULL;
        CUresult r = v2("cuMemCreate", &p, 12000, 0, NULL);
        report("v2.no_status.cuMemCreate", r, -1, p);
    }
    q1("v1.cuMemCreate", "cuMemCreate", 12000);
    q1("v1.cuMemcpyHtoD", "cuMemcpyHtoD", 12000);
    q1("v1.cuNoSuchFunction", "cuNoSuchFunction", 12000);
    q1("v1.cuIpcOpenMemHandle.old_abi", "cuIpcOpenMemHandle", 10020);
    q1("v1.cuGetProcAddress", "cuGetProcAddress", 12000);
    q2(v2, "v2.ptds.cuMemCreate", "cuMemCreate", 12000, 2);
    q2(v2, "v2.ptds.cuMemcpyHtoDAsync", "cuMemcpyHtoDAsync", 12000, 2);
    q2(v2, "v2.legacy.cuMemCreate", "cuMemCreate", 12000, 1);
    if (ptsz) {
        q2(ptsz, "ptsz.cuMemCreate", "cuMemCreate", 12000, 0);
        q2(ptsz, "ptsz.cuMemcpyHtoDAsync", "cuMemcpyHtoDAsync", 12000, 0);
        q2(ptsz, "ptsz.legacy.cuMemCreate", "cuMemCreate", 12000, 1);
    }
    if (nested) q2(nested, "nested.cuMemCreate", "cuMemCreate", 12000, 0);

    if (init && create) {
        report("call.cuInit", init(0), 0, NULL);
        report("call.cuMemCreate.null_handle", create(NULL, 0, NULL, 0), 0, NULL);
        CUmemAllocationProp prop = posix_prop();
        CUmemGenericAllocationHandle handle = 0;
        report("call.cuMemCreate.unaligned", create(&handle, 1, &prop, 0), 0, NULL);
    }
    return 0;
}
