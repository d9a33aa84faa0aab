/* Shared by the test programs: the few CUDA declarations they need (no cuda.h on CI machines)
 * and one reporting format, parsed by tests/common/mod.rs:
 *   LABEL result=R status=S provider=BASENAME sname=SYMBOL
 * provider/sname come from dladdr() of the pointer ("null" for a null pointer, "?" if unknown). */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <string.h>
#include <stdint.h>
#include <stddef.h>

typedef int CUresult;
typedef int CUdevice;
typedef unsigned long long CUdeviceptr;
typedef unsigned long long CUmemGenericAllocationHandle;
typedef struct {
    unsigned type;
    unsigned requestedHandleTypes;
    struct { unsigned type; int id; } location;
    void *win32HandleMetaData;
    unsigned char compressionType, gpuDirectRDMACapable;
    unsigned short usage;
    unsigned char reserved[4];
} CUmemAllocationProp;

typedef CUresult (*gpa_v1_t)(const char *, void **, int, unsigned long long);
typedef CUresult (*gpa_v2_t)(const char *, void **, int, unsigned long long, int *);
typedef CUresult (*init_t)(unsigned);
typedef CUresult (*create_t)(CUmemGenericAllocationHandle *, size_t, const CUmemAllocationProp *,
                             unsigned long long);

static const char *base_of(const char *path) {
    const char *slash = strrchr(path, '/');
    return slash ? slash + 1 : path;
}

static void report(const char *label, int result, int status, const void *p) {
    Dl_info info;
    const char *provider = "null", *sname = "null";
    if (p) {
        provider = "?";
        sname = "?";
        if (dladdr(p, &info)) {
            if (info.dli_fname && info.dli_fname[0]) provider = base_of(info.dli_fname);
            if (info.dli_sname && info.dli_saddr == p) sname = info.dli_sname;
        }
    }
    printf("%s result=%d status=%d provider=%s sname=%s\n", label, result, status, provider, sname);
    fflush(stdout);
}

/* A property the fake driver accepts: pinned device memory on device 0, POSIX fd handles. */
static CUmemAllocationProp posix_prop(void) {
    CUmemAllocationProp prop;
    memset(&prop, 0, sizeof prop);
    prop.type = 1;
    prop.requestedHandleTypes = 1;
    prop.location.type = 1;
    prop.location.id = 0;
    return prop;
}
