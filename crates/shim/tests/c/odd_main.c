/* The resolver rule against odd_driver.c. Linked against it (-lcuda). */
#include "probe.h"

CUresult cuGetProcAddress_v2(const char *, void **, int, unsigned long long, int *);
CUresult cuGetProcAddress(const char *, void **, int, unsigned long long);
/* Weak: this driver does not export it; the shim does. */
CUresult cuGetProcAddress_v2_ptsz(const char *, void **, int, unsigned long long, int *)
    __attribute__((weak));
CUresult cuMemCreate(void *, unsigned long, const void *, unsigned long long);
CUresult cuMulticastBindMem(unsigned long long, size_t, unsigned long long, size_t, size_t,
                            unsigned long long);
CUresult cuMulticastBindMem_v2(unsigned long long, int, size_t, unsigned long long, size_t, size_t,
                               unsigned long long);

static void query(gpa_v2_t f, const char *label, const char *symbol, int version,
                  unsigned long long flags) {
    void *p = (void *)0x1;
    int status = -7;
    CUresult r = f(symbol, &p, version, flags, &status);
    report(label, r, status, p == (void *)0x1 ? NULL : p);
}

static void q2(const char *label, const char *symbol, int version) {
    query(cuGetProcAddress_v2, label, symbol, version, 0);
}

int main(void) {
    report("resolver.ptsz", 0, 0, (void *)cuGetProcAddress_v2_ptsz);
    if (cuGetProcAddress_v2_ptsz) {
        query(cuGetProcAddress_v2_ptsz, "ptsz.cuMemcpyHtoDAsync", "cuMemcpyHtoDAsync", 12000, 0);
        query(cuGetProcAddress_v2_ptsz, "ptsz.legacy.cuMemcpyHtoDAsync", "cuMemcpyHtoDAsync",
              12000, 1);
    }
    query(cuGetProcAddress_v2, "v2.cuMemcpyHtoDAsync", "cuMemcpyHtoDAsync", 12000, 0);
    q2("v2.cuMemCreate.12000", "cuMemCreate", 12000);
    q2("v2.cuMemCreate.13010", "cuMemCreate", 13010);
    q2("v2.cuMemcpyHtoD", "cuMemcpyHtoD", 12000);
    q2("v2.cuMemMap", "cuMemMap", 12000);
    q2("v2.cuMemRelease", "cuMemRelease", 12000);
    q2("v2.cuMemUnmap", "cuMemUnmap", 12000);
    q2("v2.cuMulticastBindMem.12010", "cuMulticastBindMem", 12010);
    q2("v2.cuMulticastBindMem.13010", "cuMulticastBindMem", 13010);
    q2("v2.cuGetProcAddress", "cuGetProcAddress", 12000);
    {
        void *p = NULL;
        CUresult r = cuGetProcAddress("cuMemCreate", &p, 13010, 0);
        report("v1.cuMemCreate.13010", r, -1, p);
    }
    report("addr.cuMulticastBindMem_v2", 0, 0, (void *)cuMulticastBindMem_v2);
    report("call.cuMemCreate", cuMemCreate(NULL, 0, NULL, 0), 0, NULL);
    report("call.cuMulticastBindMem", cuMulticastBindMem(0, 0, 0, 0, 0, 0), 0, NULL);
    report("call.cuMulticastBindMem_v2", cuMulticastBindMem_v2(0, 0, 0, 0, 0, 0, 0), 0, NULL);
    return 0;
}
