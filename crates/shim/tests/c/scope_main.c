#include "probe.h"

int main(int argc, char **argv) {
    if (argc < 2) return 2;
    void *lib = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
    if (!lib) { fprintf(stderr, "dlopen: %s\n", dlerror()); return 2; }
    report("main.default", 0, 0, dlsym(RTLD_DEFAULT, "scopedep_marker"));
    void (*probe)(void) = (void (*)(void))dlsym(lib, "scope_probe");
    if (!probe) return 2;
    probe();
    return 0;
}
