/* A stand-in dynamic CUDA runtime (soname libcudart.so.12) with the driver-entry-point API.
 * FAKE_CUDART_VERSION: what cudaRuntimeGetVersion reports (default 12080); below 12000 it is the
 * 11.x runtime whose cudaGetDriverEntryPoint has three arguments (the fourth is never touched).
 * FAKE_CUDART_BYPASS=1: find the driver's resolver with glibc's own dlsym (taken with dlvsym), so
 * that the interposer's dlsym hook does not see it; otherwise use dlsym as real runtimes do. */
#include "probe.h"
#include <stdlib.h>

static int version(void) {
    const char *v = getenv("FAKE_CUDART_VERSION");
    return v ? atoi(v) : 12080;
}

int cudaRuntimeGetVersion(int *v) {
    *v = version();
    return 0;
}

static gpa_v2_t driver(void) {
    static gpa_v2_t cached;
    if (cached) return cached;
    void *cuda = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!cuda) return NULL;
    if (getenv("FAKE_CUDART_BYPASS")) {
        void *(*libc_dlsym)(void *, const char *) =
            (void *(*)(void *, const char *))dlvsym(RTLD_NEXT, "dlsym", "GLIBC_2.34");
        if (!libc_dlsym)
            libc_dlsym = (void *(*)(void *, const char *))dlvsym(RTLD_NEXT, "dlsym", "GLIBC_2.2.5");
        cached = (gpa_v2_t)libc_dlsym(cuda, "cuGetProcAddress_v2");
    } else {
        cached = (gpa_v2_t)dlsym(cuda, "cuGetProcAddress_v2");
    }
    return cached;
}

static int lookup(const char *symbol, void **fp, int cuda_version, unsigned long long flags,
                  int *status, int has_status) {
    gpa_v2_t d = driver();
    if (!d) return 801;
    int driver_status = 0;
    if (d(symbol, fp, cuda_version, flags, &driver_status) != 0) return 1;
    if (has_status) {
        if (status) *status = driver_status;
        return 0;
    }
    return *fp ? 0 : 500;
}

int cudaGetDriverEntryPoint(const char *symbol, void **fp, unsigned long long flags, int *status) {
    return lookup(symbol, fp, version(), flags, status, version() >= 12000);
}

int cudaGetDriverEntryPoint_ptsz(const char *symbol, void **fp, unsigned long long flags,
                                 int *status) {
    if (!(flags & 3)) flags |= 2;
    return lookup(symbol, fp, version(), flags, status, version() >= 12000);
}

int cudaGetDriverEntryPointByVersion(const char *symbol, void **fp, unsigned cuda_version,
                                     unsigned long long flags, int *status) {
    return lookup(symbol, fp, (int)cuda_version, flags, status, 1);
}

int cudaGetDriverEntryPointByVersion_ptsz(const char *symbol, void **fp, unsigned cuda_version,
                                          unsigned long long flags, int *status) {
    if (!(flags & 3)) flags |= 2;
    return lookup(symbol, fp, (int)cuda_version, flags, status, 1);
}
