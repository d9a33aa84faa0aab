/* Linked against libmallocspy.so (so the spy is the allocator with or without the shim). Counts
 * allocations made by explicit-handle and pseudo-handle dlsym lookups, including the shim's first
 * lookups of the process. */
#include "probe.h"

int spy_during_lookup(void);
int spy_resolved(void);
int spy_watch(int on);

int main(void) {
    void *cuda = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!cuda) { fprintf(stderr, "dlopen: %s\n", dlerror()); return 2; }
    void *p[6];
    spy_watch(1);
    p[0] = dlsym(cuda, "cuMemCreate");
    p[1] = dlsym(cuda, "cuGetProcAddress_v2");
    p[2] = dlsym(cuda, "cuDriverGetVersion");
    p[3] = dlsym(cuda, "cuInit");
    p[4] = dlsym(RTLD_DEFAULT, "getpid");
    p[5] = dlsym(RTLD_NEXT, "getpid");
    int during = spy_watch(0);
    report("spy.init", spy_during_lookup(), spy_resolved(), NULL);
    report("spy.lookups", during, 0, NULL);
    report("spy.cuMemCreate", 0, 0, p[0]);
    report("spy.cuGetProcAddress_v2", 0, 0, p[1]);
    report("spy.cuDriverGetVersion", 0, 0, p[2]);
    report("spy.cuInit", 0, 0, p[3]);
    report("spy.getpid.default", 0, 0, p[4]);
    report("spy.getpid.next", 0, 0, p[5]);
    return 0;
}
