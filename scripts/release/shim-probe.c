/* A CUDA program of an old userland, for scripts/test-release.sh: built against glibc 2.17 (zig cc),
 * run inside a Debian chroot with LD_PRELOAD=libcuinterpose.so and the fake driver. It loads the
 * driver the way applications do (dlopen + dlsym, which the shim intercepts), initialises it (the
 * shim's runtime starts at the first successful cuInit and binds its control socket), prints its
 * pid and waits for its stdin to close, so the tool can talk to its shim meanwhile. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <unistd.h>

typedef int (*init_t)(unsigned);

int main(void) {
    void *driver = dlopen("libcuda.so.1", RTLD_NOW | RTLD_GLOBAL);
    if (!driver) {
        fprintf(stderr, "shim-probe: %s\n", dlerror());
        return 1;
    }
    init_t init = (init_t)dlsym(driver, "cuInit");
    Dl_info where;
    if (!init || !dladdr((void *)init, &where)) {
        fprintf(stderr, "shim-probe: no cuInit\n");
        return 1;
    }
    int result = init(0);
    printf("pid=%d cuInit=%d cuInit_from=%s\n", (int)getpid(), result, where.dli_fname);
    fflush(stdout);
    char byte;
    while (read(0, &byte, 1) > 0) {
    }
    return result == 0 ? 0 : 1;
}
