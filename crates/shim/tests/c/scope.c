/* A library dlopen()ed RTLD_LOCAL with a dependency of its own (scopedep.c): RTLD_DEFAULT and
 * RTLD_NEXT from here must search this library's scope, which only works if the lookup is made
 * relative to the real caller. */
#include "probe.h"

void scopedep_marker(void);

void scope_probe(void) {
    report("scope.default", 0, 0, dlsym(RTLD_DEFAULT, "scopedep_marker"));
    report("scope.next", 0, 0, dlsym(RTLD_NEXT, "scopedep_marker"));
    scopedep_marker();
}
