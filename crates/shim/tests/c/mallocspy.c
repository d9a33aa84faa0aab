/* Route 8: an allocator interposer that, like jemalloc or a heap profiler, finds the allocator it
 * wraps with dlsym(RTLD_NEXT, ...) from inside its own malloc. An allocation made while that lookup
 * runs would re-enter it before it is ready; those are served from a static arena and counted.
 * spy_watch(1)/spy_watch(0) count every allocation in between (spy_watch(0) returns the count). */
#include <dlfcn.h>
#include <stddef.h>
#include <string.h>

static void *(*next_malloc)(size_t);
static void *(*next_calloc)(size_t, size_t);
static void *(*next_realloc)(void *, size_t);
static void (*next_free)(void *);
static int in_lookup, during_lookup, watching, watched;
static _Alignas(16) char arena[1 << 16];
static size_t used;

static void *bump(size_t n) {
    n = (n + 15) & ~(size_t)15;
    if (used + n > sizeof arena) return NULL;
    void *p = arena + used;
    used += n;
    return p;
}

static int in_arena(void *p) { return (char *)p >= arena && (char *)p < arena + sizeof arena; }

static void resolve(void) {
    in_lookup = 1;
    next_malloc = (void *(*)(size_t))dlsym(RTLD_NEXT, "malloc");
    next_calloc = (void *(*)(size_t, size_t))dlsym(RTLD_NEXT, "calloc");
    next_realloc = (void *(*)(void *, size_t))dlsym(RTLD_NEXT, "realloc");
    next_free = (void (*)(void *))dlsym(RTLD_NEXT, "free");
    in_lookup = 0;
}

void *malloc(size_t n) {
    if (in_lookup) { during_lookup++; return bump(n); }
    if (!next_malloc) resolve();
    if (watching) watched++;
    return next_malloc(n);
}

void *calloc(size_t count, size_t n) {
    if (in_lookup) { during_lookup++; return bump(count * n); }
    if (!next_calloc) resolve();
    if (watching) watched++;
    return next_calloc(count, n);
}

void *realloc(void *p, size_t n) {
    if (in_lookup) { during_lookup++; return bump(n); }
    if (!next_realloc) resolve();
    if (watching) watched++;
    if (in_arena(p)) {
        void *fresh = next_malloc(n);
        if (fresh) memcpy(fresh, p, n);
        return fresh;
    }
    return next_realloc(p, n);
}

void free(void *p) {
    if (!p || in_arena(p)) return;
    if (!next_free) resolve();
    next_free(p);
}

int spy_during_lookup(void) { return during_lookup; }
int spy_resolved(void) { return next_malloc && next_calloc && next_realloc && next_free; }

int spy_watch(int on) {
    if (on) { watched = 0; watching = 1; return 0; }
    watching = 0;
    return watched;
}
