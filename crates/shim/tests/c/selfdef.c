/* The executable defines (and, with -rdynamic, exports) its own cuMemCreate, which comes first in
 * the global scope. The shim's wrapper addresses must still be its own (-Bsymbolic-functions), and
 * its wrapper must reach the driver, not this function. */
#include "probe.h"

CUresult cuMemCreate(CUmemGenericAllocationHandle *h, size_t size, const CUmemAllocationProp *prop,
                     unsigned long long flags) {
    (void)h; (void)size; (void)prop; (void)flags;
    return 31337;
}

int main(void) {
    void *cuda = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!cuda) { fprintf(stderr, "dlopen: %s\n", dlerror()); return 2; }
    create_t create = (create_t)dlsym(cuda, "cuMemCreate");
    report("dlsym.cuMemCreate", 0, 0, (void *)create);
    gpa_v2_t v2 = (gpa_v2_t)dlsym(cuda, "cuGetProcAddress_v2");
    void *p = NULL;
    int status = -7;
    CUresult r = v2("cuMemCreate", &p, 12000, 0, &status);
    report("v2.cuMemCreate", r, status, p);
    report("call.dlsym.cuMemCreate", create(NULL, 0, NULL, 0), 0, NULL);
    report("call.v2.cuMemCreate", ((create_t)p)(NULL, 0, NULL, 0), 0, NULL);
    report("call.own.cuMemCreate", cuMemCreate(NULL, 0, NULL, 0), 0, NULL);
    return 0;
}
