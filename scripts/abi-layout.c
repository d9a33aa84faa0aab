/* Prints the layout of the CUDA structs that crates/cuda-abi mirrors, in the format of
 * cuda_abi::layout::report(). Built and run by scripts/gpu-lane.sh against the machine's cuda.h. */
#include <cuda.h>
#include <stddef.h>
#include <stdio.h>

#define S(T) printf("struct %s size %zu align %zu\n", #T, sizeof(T), _Alignof(T))
#define F(T, f) printf("field %s.%s offset %zu\n", #T, #f, offsetof(T, f))

int main(void) {
    S(CUuuid); F(CUuuid, bytes);
    S(CUmemLocation); F(CUmemLocation, type); F(CUmemLocation, id);
    S(CUmemAllocationProp); F(CUmemAllocationProp, type); F(CUmemAllocationProp, requestedHandleTypes);
    F(CUmemAllocationProp, location); F(CUmemAllocationProp, win32HandleMetaData);
    F(CUmemAllocationProp, allocFlags);
    S(CUmemAccessDesc); F(CUmemAccessDesc, location); F(CUmemAccessDesc, flags);
    S(CUmulticastObjectProp); F(CUmulticastObjectProp, numDevices); F(CUmulticastObjectProp, size);
    F(CUmulticastObjectProp, handleTypes); F(CUmulticastObjectProp, flags);
    S(CUipcMemHandle); F(CUipcMemHandle, reserved);
    S(CUmemFabricHandle); F(CUmemFabricHandle, data);
    S(CUcheckpointLockArgs); F(CUcheckpointLockArgs, timeoutMs); F(CUcheckpointLockArgs, reserved0);
    F(CUcheckpointLockArgs, reserved1);
    S(CUcheckpointCheckpointArgs); F(CUcheckpointCheckpointArgs, reserved);
    S(CUcheckpointGpuPair); F(CUcheckpointGpuPair, oldUuid); F(CUcheckpointGpuPair, newUuid);
    S(CUcheckpointRestoreArgs); F(CUcheckpointRestoreArgs, gpuPairs); F(CUcheckpointRestoreArgs, gpuPairsCount);
    F(CUcheckpointRestoreArgs, reserved); F(CUcheckpointRestoreArgs, reserved1);
    S(CUcheckpointUnlockArgs); F(CUcheckpointUnlockArgs, reserved);
    return 0;
}
