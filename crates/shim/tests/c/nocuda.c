/* Route 7: a process that never touches CUDA. Reports what the preloaded shim did to it: threads,
 * open descriptors, and whether the driver got loaded. */
#define _GNU_SOURCE
#include <dirent.h>
#include <link.h>
#include <stdio.h>
#include <string.h>

static int driver_loaded;

static int each(struct dl_phdr_info *info, size_t size, void *data) {
    (void)size; (void)data;
    if (info->dlpi_name && strstr(info->dlpi_name, "libcuda")) driver_loaded = 1;
    return 0;
}

int main(void) {
    int threads = -1, fds = 0;
    char line[256];
    FILE *status = fopen("/proc/self/status", "r");
    while (status && fgets(line, sizeof line, status))
        if (sscanf(line, "Threads: %d", &threads) == 1) break;
    if (status) fclose(status);
    DIR *dir = opendir("/proc/self/fd");
    for (struct dirent *e; dir && (e = readdir(dir));)
        if (e->d_name[0] != '.') fds++;
    if (dir) closedir(dir);
    dl_iterate_phdr(each, NULL);
    printf("threads=%d fds=%d driver_loaded=%d\n", threads, fds - 1, driver_loaded);
    return 0;
}
