/* Every gated entry the test names, through each route an application has: the global scope (what
 * a program linked with -lcuda binds to), dlsym on the driver opened RTLD_LOCAL, and the driver's
 * resolver cuGetProcAddress_v2 found through that dlsym. Each pointer found is reported; with
 * "hold", each is then called (all arguments zero) on a thread of its own while the test holds the
 * process's gates closed, and the calls that came back before it opened them are named.
 *
 * Arguments: [hold] NAME,BASE,VERSION,FLAGS ... (BASE, VERSION and FLAGS: the resolver request).
 * Protocol with "hold": prints "ready", reads a line (the gates are closed), starts the calls,
 * prints "passed LABEL" for each call back within 300 ms and "held", reads a line (the gates are
 * open), waits for every call and prints "released N" (the number of calls that came back). */
#include "probe.h"
#include <pthread.h>
#include <stdlib.h>
#include <unistd.h>

/* Wide enough for every gated entry (cuLaunchKernel has 11 arguments): a callee reads only its
 * own, and a zero is a null pointer, a zero size or the null stream for each of them. */
typedef CUresult (*any_t)(uintptr_t, uintptr_t, uintptr_t, uintptr_t, uintptr_t, uintptr_t,
                          uintptr_t, uintptr_t, uintptr_t, uintptr_t, uintptr_t, uintptr_t);

struct call {
    char label[192];
    any_t f;
    int returned;
    pthread_t thread;
};

static void *run(void *arg) {
    struct call *c = arg;
    c->f(0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0);
    __atomic_store_n(&c->returned, 1, __ATOMIC_SEQ_CST);
    return NULL;
}

static struct call *calls;
static int ncalls;

static void found(const char *route, const char *name, int r, int status, void *p) {
    char label[192];
    snprintf(label, sizeof label, "%s.%s", route, name);
    report(label, r, status, p);
    if (p) {
        struct call *c = &calls[ncalls++];
        memcpy(c->label, label, sizeof label);
        c->f = (any_t)p;
    }
}

static void wait_line(void) {
    char line[64];
    if (!fgets(line, sizeof line, stdin)) exit(3);
}

int main(int argc, char **argv) {
    int hold = argc > 1 && strcmp(argv[1], "hold") == 0;
    int first = hold ? 2 : 1;
    void *cuda = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!cuda) { fprintf(stderr, "dlopen: %s\n", dlerror()); return 2; }
    init_t init = (init_t)dlsym(cuda, "cuInit");
    gpa_v2_t v2 = (gpa_v2_t)dlsym(cuda, "cuGetProcAddress_v2");
    if (!init || !v2) { fprintf(stderr, "no cuInit or resolver\n"); return 2; }
    report("call.cuInit", init(0), -1, NULL);
    calls = calloc(3 * (size_t)argc, sizeof *calls);
    if (!calls) return 2;
    for (int i = first; i < argc; i++) {
        char spec[256];
        snprintf(spec, sizeof spec, "%s", argv[i]);
        char *name = strtok(spec, ","), *base = strtok(NULL, ","), *version = strtok(NULL, ","),
             *flags = strtok(NULL, ",");
        if (!name || !base || !version || !flags) { fprintf(stderr, "bad spec %s\n", argv[i]); return 2; }
        found("export", name, 0, 0, dlsym(RTLD_DEFAULT, name));
        found("dlsym", name, 0, 0, dlsym(cuda, name));
        void *p = NULL;
        int status = -7;
        CUresult r = v2(base, &p, atoi(version), strtoull(flags, NULL, 0), &status);
        found("procaddr", name, r, status, r == 0 ? p : NULL);
    }
    if (!hold) return 0;
    printf("ready\n");
    fflush(stdout);
    wait_line();
    for (int i = 0; i < ncalls; i++) {
        if (pthread_create(&calls[i].thread, NULL, run, &calls[i]) != 0) return 2;
    }
    usleep(300 * 1000);
    for (int i = 0; i < ncalls; i++) {
        if (__atomic_load_n(&calls[i].returned, __ATOMIC_SEQ_CST)) printf("passed %s\n", calls[i].label);
    }
    printf("held\n");
    fflush(stdout);
    wait_line();
    int released = 0;
    for (int i = 0; i < ncalls; i++) {
        pthread_join(calls[i].thread, NULL);
        released += calls[i].returned;
    }
    printf("released %d of %d\n", released, ncalls);
    return 0;
}
