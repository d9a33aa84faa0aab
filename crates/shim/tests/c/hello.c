/* Route 4: run beside a second RTLD_NEXT interposer (next.c). Linked against libcuda. */
#include "probe.h"

CUresult cuMemCreate(CUmemGenericAllocationHandle *, size_t, const CUmemAllocationProp *,
                     unsigned long long);

int main(void) {
    puts("hello");
    fflush(stdout);
    report("call.cuMemCreate.null_handle", cuMemCreate(NULL, 0, NULL, 0), 0, NULL);
    return 0;
}
