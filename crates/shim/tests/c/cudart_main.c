/* Route 5: a program bound to a dynamic libcudart (-lcudart) resolving driver entry points through
 * the runtime, and the same functions found with dlsym(handle) on the runtime. argv[1] == "old":
 * call as a CUDA 11 program would, three arguments (a garbage fourth register). */
#include "probe.h"

typedef int (*gdep_t)(const char *, void **, unsigned long long, int *);
typedef int (*gdepv_t)(const char *, void **, unsigned, unsigned long long, int *);
int cudaGetDriverEntryPoint(const char *, void **, unsigned long long, int *);
int cudaGetDriverEntryPoint_ptsz(const char *, void **, unsigned long long, int *);
int cudaGetDriverEntryPointByVersion(const char *, void **, unsigned, unsigned long long, int *);
int cudaGetDriverEntryPointByVersion_ptsz(const char *, void **, unsigned, unsigned long long,
                                          int *);

static void *ep(gdep_t f, const char *label, const char *symbol) {
    void *p = NULL;
    int status = -7;
    int r = f(symbol, &p, 0, &status);
    report(label, r, status, p);
    return p;
}

static void epv(gdepv_t f, const char *label, const char *symbol, unsigned version) {
    void *p = NULL;
    int status = -7;
    int r = f(symbol, &p, version, 0, &status);
    report(label, r, status, p);
}

int main(int argc, char **argv) {
    report("addr.cudaGetDriverEntryPoint", 0, 0, (void *)cudaGetDriverEntryPoint);
    if (argc > 1 && strcmp(argv[1], "old") == 0) {
        const char *names[] = {"cuMemCreate", "cuMemcpyHtoD", "cuIpcOpenMemHandle"};
        for (size_t i = 0; i < 3; i++) {
            char label[64];
            void *p = NULL;
            snprintf(label, sizeof label, "old.%s", names[i]);
            int r = cudaGetDriverEntryPoint(names[i], &p, 0, (int *)(uintptr_t)1);
            report(label, r, -1, p);
        }
        return 0;
    }
    ep(cudaGetDriverEntryPoint, "ep.cuMemCreate", "cuMemCreate");
    ep(cudaGetDriverEntryPoint, "ep.cuIpcOpenMemHandle", "cuIpcOpenMemHandle");
    ep(cudaGetDriverEntryPoint, "ep.cuMemcpyHtoD", "cuMemcpyHtoD");
    ep(cudaGetDriverEntryPoint, "ep.cuNoSuchFunction", "cuNoSuchFunction");
    ep(cudaGetDriverEntryPoint_ptsz, "ep_ptsz.cuMemCreate", "cuMemCreate");
    ep(cudaGetDriverEntryPoint_ptsz, "ep_ptsz.cuMemcpyHtoDAsync", "cuMemcpyHtoDAsync");
    epv(cudaGetDriverEntryPointByVersion, "bv.cuMemCreate", "cuMemCreate", 12000);
    epv(cudaGetDriverEntryPointByVersion, "bv.cuIpcOpenMemHandle.old_abi", "cuIpcOpenMemHandle",
        10020);
    epv(cudaGetDriverEntryPointByVersion, "bv.cuMemcpyHtoD", "cuMemcpyHtoD", 12000);
    epv(cudaGetDriverEntryPointByVersion, "bv.too_new", "cuMemCreate", 99999);
    epv(cudaGetDriverEntryPointByVersion_ptsz, "bv_ptsz.cuMemMap", "cuMemMap", 12000);

    void *rt = dlopen("libcudart.so.12", RTLD_NOW | RTLD_LOCAL);
    if (!rt) { fprintf(stderr, "dlopen libcudart: %s\n", dlerror()); return 2; }
    gdep_t via_dlsym = (gdep_t)dlsym(rt, "cudaGetDriverEntryPoint");
    report("dlsym.cudaGetDriverEntryPoint", 0, 0, (void *)via_dlsym);
    report("dlsym.cudaGetDriverEntryPointByVersion", 0, 0,
           dlsym(rt, "cudaGetDriverEntryPointByVersion"));
    report("dlsym.cudaRuntimeGetVersion", 0, 0, dlsym(rt, "cudaRuntimeGetVersion"));
    create_t create = (create_t)ep(via_dlsym, "dlsym_ep.cuMemCreate", "cuMemCreate");
    init_t init = (init_t)ep(via_dlsym, "dlsym_ep.cuInit", "cuInit");
    if (init && create) {
        report("call.cuInit", init(0), 0, NULL);
        report("call.cuMemCreate.null_handle", create(NULL, 0, NULL, 0), 0, NULL);
    }
    return 0;
}
