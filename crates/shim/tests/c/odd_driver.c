/* A minimal libcuda.so.1 (not the fake driver) whose resolver returns what the resolver rule must
 * cope with: a future ABI of a tracked function (cuMemCreate_v9 at 13010), a future ABI of an
 * untracked one, a pointer into the middle of a function, a pointer with a non-success status, a
 * pointer with an error result, the 13.1 device-explicit multicast bind, and per-thread-stream
 * variants (flag 2). Each function returns
 * a code of its own so that a test can see which one a call reached. ODD_DRIVER_VERSION: the
 * driver's CUDA version (default 13010). */
#include <stdlib.h>
#include <string.h>

typedef int CUresult;

static int version(void) {
    const char *v = getenv("ODD_DRIVER_VERSION");
    return v ? atoi(v) : 13010;
}

CUresult cuInit(unsigned flags) { (void)flags; return 0; }
CUresult cuDriverGetVersion(int *v) { *v = version(); return 0; }
CUresult cuMemCreate(void *h, unsigned long s, const void *p, unsigned long long f) {
    (void)h; (void)s; (void)p; (void)f; return 7100;
}
CUresult cuMemCreate_v9(void *h, unsigned long s, const void *p, unsigned long long f, int extra) {
    (void)h; (void)s; (void)p; (void)f; (void)extra; return 7109;
}
CUresult cuMemcpyHtoD_v9(void) { return 7209; }
CUresult cuMemMap(void) { return 7300; }
CUresult cuMemRelease(unsigned long long h) { (void)h; return 7400; }
CUresult cuMemUnmap(void) { return 7500; }
CUresult cuMemcpyHtoDAsync_v2(void) { return 7600; }
CUresult cuMemcpyHtoDAsync_v2_ptsz(void) { return 7602; }
CUresult cuMulticastBindMem(void) { return 7001; }
CUresult cuMulticastBindMem_v2(void) { return 7002; }

CUresult cuGetProcAddress_v2(const char *symbol, void **pfn, int cuda_version,
                             unsigned long long flags, int *status);

CUresult cuGetProcAddress(const char *symbol, void **pfn, int cuda_version,
                          unsigned long long flags) {
    int status = 0;
    CUresult r = cuGetProcAddress_v2(symbol, pfn, cuda_version, flags, &status);
    return r == 0 && !*pfn ? 500 : r;
}

CUresult cuGetProcAddress_v2(const char *symbol, void **pfn, int cuda_version,
                             unsigned long long flags, int *status) {
    int st = 0;
    CUresult r = 0;
    void *p = NULL;
    if (cuda_version > version()) return 1;
    if (!strcmp(symbol, "cuInit")) p = (void *)cuInit;
    else if (!strcmp(symbol, "cuDriverGetVersion")) p = (void *)cuDriverGetVersion;
    else if (!strcmp(symbol, "cuMemCreate"))
        p = cuda_version >= 13010 ? (void *)cuMemCreate_v9 : (void *)cuMemCreate;
    else if (!strcmp(symbol, "cuMemcpyHtoD")) p = (void *)cuMemcpyHtoD_v9;
    else if (!strcmp(symbol, "cuMemcpyHtoDAsync"))
        p = flags & 2 ? (void *)cuMemcpyHtoDAsync_v2_ptsz : (void *)cuMemcpyHtoDAsync_v2;
    else if (!strcmp(symbol, "cuMemMap")) p = (char *)(void *)cuMemMap + 1;
    else if (!strcmp(symbol, "cuMemRelease")) { p = (void *)cuMemRelease; st = 2; }
    else if (!strcmp(symbol, "cuMemUnmap")) { p = (void *)cuMemUnmap; r = 999; }
    else if (!strcmp(symbol, "cuMulticastBindMem"))
        p = cuda_version >= 13010 ? (void *)cuMulticastBindMem_v2 : (void *)cuMulticastBindMem;
    else if (!strcmp(symbol, "cuGetProcAddress"))
        p = cuda_version >= 12000 ? (void *)cuGetProcAddress_v2 : (void *)cuGetProcAddress;
    else st = 1;
    *pfn = p;
    if (status) *status = st;
    return r;
}
