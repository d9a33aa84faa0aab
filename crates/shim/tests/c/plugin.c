/* A library that is not the driver but exports a same-named symbol (must never be substituted). */
int cuMemCreate(void *handle, unsigned long size, const void *prop, unsigned long long flags) {
    (void)handle; (void)size; (void)prop; (void)flags;
    return 4242;
}
