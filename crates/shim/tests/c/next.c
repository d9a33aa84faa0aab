/* A second interposer that finds what it wraps with dlsym(RTLD_NEXT, ...), as most do. If the
 * lookup were made relative to the wrong object it would get its own function back. */
#include "probe.h"
#include <unistd.h>

int puts(const char *s) {
    static int (*next)(const char *);
    if (!next) {
        next = (int (*)(const char *))dlsym(RTLD_NEXT, "puts");
        if (!next || next == puts) {
            fprintf(stderr, "libnext: RTLD_NEXT gave %s\n", next ? "its own puts" : "nothing");
            _exit(3);
        }
    }
    fputs("[libnext] ", stdout);
    return next(s);
}

CUresult cuMemCreate(CUmemGenericAllocationHandle *h, size_t size, const CUmemAllocationProp *prop,
                     unsigned long long flags) {
    static create_t next;
    if (!next) {
        next = (create_t)dlsym(RTLD_NEXT, "cuMemCreate");
        if (!next || next == cuMemCreate) {
            fprintf(stderr, "libnext: RTLD_NEXT gave %s\n", next ? "its own cuMemCreate" : "nothing");
            _exit(4);
        }
        report("next.cuMemCreate.next", 0, 0, (void *)next);
    }
    return next(h, size, prop, flags);
}
