//! The types and values of `nccl.h` this library implements. Results, data types and reduction
//! operations are plain integers with named constants (never Rust enums), because a caller may
//! pass any value and an out-of-range enum would be undefined behaviour.

use std::ffi::{CStr, c_char};

/// `NCCL_UNIQUE_ID_BYTES`.
pub const UNIQUE_ID_BYTES: usize = 128;

/// `ncclUniqueId`: 128 opaque bytes, passed by value to `ncclCommInitRank`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct NcclUniqueId {
    pub internal: [c_char; UNIQUE_ID_BYTES],
}

/// `ncclResult_t`.
pub type NcclResult = u32;
pub const NCCL_SUCCESS: NcclResult = 0;
pub const NCCL_UNHANDLED_CUDA_ERROR: NcclResult = 1;
pub const NCCL_SYSTEM_ERROR: NcclResult = 2;
pub const NCCL_INTERNAL_ERROR: NcclResult = 3;
pub const NCCL_INVALID_ARGUMENT: NcclResult = 4;
pub const NCCL_INVALID_USAGE: NcclResult = 5;
pub const NCCL_REMOTE_ERROR: NcclResult = 6;
pub const NCCL_IN_PROGRESS: NcclResult = 7;

/// `ncclDataType_t` values this library reduces (the others are refused).
pub const NCCL_INT32: i32 = 2;
pub const NCCL_UINT32: i32 = 3;
pub const NCCL_FLOAT32: i32 = 7;

/// `ncclRedOp_t`: only `ncclSum` is implemented.
pub const NCCL_SUM: i32 = 0;

/// The NCCL release this library answers `ncclGetVersion` with: 2.27.3, coded as
/// `NCCL_VERSION(2, 27, 3)` = major * 10000 + minor * 100 + patch (the coding since 2.9).
pub const VERSION_CODE: i32 = 2 * 10000 + 27 * 100 + 3;

/// `ncclGetErrorString`'s text, as real NCCL words it.
pub fn error_string(result: NcclResult) -> &'static CStr {
    match result {
        NCCL_SUCCESS => c"no error",
        NCCL_UNHANDLED_CUDA_ERROR => c"unhandled cuda error (run with NCCL_DEBUG=INFO for details)",
        NCCL_SYSTEM_ERROR => c"unhandled system error (run with NCCL_DEBUG=INFO for details)",
        NCCL_INTERNAL_ERROR => c"internal error - please report this issue to the NCCL developers",
        NCCL_INVALID_ARGUMENT => c"invalid argument (run with NCCL_DEBUG=WARN for details)",
        NCCL_INVALID_USAGE => c"invalid usage (run with NCCL_DEBUG=WARN for details)",
        NCCL_REMOTE_ERROR => c"remote process exited or there was a network error",
        NCCL_IN_PROGRESS => c"NCCL operation in progress",
        _ => c"unknown result code",
    }
}

/// The element types an all-reduce sums, and how.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Element {
    /// `ncclInt32` and `ncclUint32`: two's complement wrapping sums are the same bits.
    U32,
    /// `ncclFloat32`.
    F32,
}

impl Element {
    /// The element type of a `(datatype, op)` pair this library implements.
    pub fn of(datatype: i32, op: i32) -> Option<Element> {
        if op != NCCL_SUM {
            return None;
        }
        match datatype {
            NCCL_INT32 | NCCL_UINT32 => Some(Element::U32),
            NCCL_FLOAT32 => Some(Element::F32),
            _ => None,
        }
    }

    /// Bytes per element.
    pub fn size(self) -> u64 {
        4
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_id_is_the_headers_size() {
        assert_eq!(size_of::<NcclUniqueId>(), 128);
        assert_eq!(align_of::<NcclUniqueId>(), 1);
    }

    #[test]
    fn only_sums_of_32_bit_types_are_implemented() {
        assert_eq!(Element::of(NCCL_INT32, NCCL_SUM), Some(Element::U32));
        assert_eq!(Element::of(NCCL_UINT32, NCCL_SUM), Some(Element::U32));
        assert_eq!(Element::of(NCCL_FLOAT32, NCCL_SUM), Some(Element::F32));
        // ncclInt8, ncclInt64, ncclFloat16, ncclFloat64, ncclBfloat16.
        for other in [0, 1, 4, 5, 6, 8, 9, 12, -1] {
            assert_eq!(Element::of(other, NCCL_SUM), None, "{other}");
        }
        // ncclProd, ncclMax, ncclMin, ncclAvg.
        for op in 1..=4 {
            assert_eq!(Element::of(NCCL_FLOAT32, op), None, "{op}");
        }
    }

    #[test]
    fn every_result_has_its_text() {
        assert_eq!(error_string(NCCL_SUCCESS), c"no error");
        assert!(
            error_string(NCCL_INVALID_ARGUMENT)
                .to_bytes()
                .starts_with(b"invalid argument")
        );
        assert_eq!(error_string(99), c"unknown result code");
        assert_eq!(VERSION_CODE, 22703);
    }
}
