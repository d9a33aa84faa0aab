/* Route 2: a program that only dlopen()s the driver (RTLD_LOCAL) and looks entry points up with
 * dlsym(handle, ...). argv[1]: a plugin library exporting its own cuMemCreate. */
#include "probe.h"

static void lookup(void *handle, const char *where, const char *name) {
    char label[128];
    dlerror();
    void *p = dlsym(handle, name);
    const char *error = dlerror();
    snprintf(label, sizeof label, "%s.%s", where, name);
    report(label, p ? 0 : -1, error != NULL, p);
}

int main(int argc, char **argv) {
    void *cuda = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!cuda) { fprintf(stderr, "dlopen libcuda.so.1: %s\n", dlerror()); return 2; }
    const char *names[] = {"cuInit", "cuMemCreate", "cuMemMap", "cuMemFree_v2",
                           "cuIpcOpenMemHandle_v2", "cuMemcpyHtoD_v2", "cuDriverGetVersion",
                           "cuGetProcAddress", "cuGetProcAddress_v2", "cuGetExportTable",
                           "cuNoSuchFunction", "cuIpcOpenMemHandle"};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) lookup(cuda, "dlsym", names[i]);
    /* libcuda is local: RTLD_DEFAULT sees only the global scope (the preloaded shim, if any). */
    lookup(RTLD_DEFAULT, "default", "cuMemCreate");

    init_t init = (init_t)dlsym(cuda, "cuInit");
    create_t create = (create_t)dlsym(cuda, "cuMemCreate");
    report("call.cuInit", init(0), 0, NULL);
    report("call.cuMemCreate.null_handle", create(NULL, 0, NULL, 0), 0, NULL);
    CUmemAllocationProp prop = posix_prop();
    CUmemGenericAllocationHandle handle = 0;
    report("call.cuMemCreate.unaligned", create(&handle, 1, &prop, 0), 0, NULL);
    if (argc > 1) {
        void *plugin = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
        if (!plugin) { fprintf(stderr, "dlopen plugin: %s\n", dlerror()); return 2; }
        lookup(plugin, "plugin", "cuMemCreate");
        create_t theirs = (create_t)dlsym(plugin, "cuMemCreate");
        report("call.plugin.cuMemCreate", theirs(NULL, 0, NULL, 0), 0, NULL);
    }
    return 0;
}
