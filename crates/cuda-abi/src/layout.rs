//! Sizes, alignments and field offsets of the mirrored structs, in the line format that
//! `scripts/abi-layout.c` prints from the real `cuda.h`: `struct NAME size S align A` and
//! `field NAME.FIELD offset O`. The GPU lane diffs the two outputs.

use crate::*;
use core::mem::{align_of, offset_of, size_of};

/// One struct's layout.
#[derive(Debug, Clone, Copy)]
pub struct StructLayout {
    pub name: &'static str,
    pub size: usize,
    pub align: usize,
    pub fields: &'static [(&'static str, usize)],
}

macro_rules! layouts {
    ($( $c_name:literal => $ty:ty { $( $field:ident ),* $(,)? } )*) => {
        /// Every mirrored struct whose layout must match `cuda.h`.
        pub const LAYOUT: &[StructLayout] = &[
            $( StructLayout {
                name: $c_name,
                size: size_of::<$ty>(),
                align: align_of::<$ty>(),
                fields: &[ $( (stringify!($field), offset_of!($ty, $field)) ),* ],
            }, )*
        ];
    };
}

layouts! {
    "CUuuid" => CUuuid { bytes }
    "CUmemLocation" => CUmemLocation { type_, id }
    "CUmemAllocationProp" => CUmemAllocationProp {
        type_, requestedHandleTypes, location, win32HandleMetaData, allocFlags
    }
    "CUmemAccessDesc" => CUmemAccessDesc { location, flags }
    "CUmulticastObjectProp" => CUmulticastObjectProp { numDevices, size, handleTypes, flags }
    "CUipcMemHandle" => CUipcMemHandle { reserved }
    "CUmemFabricHandle" => CUmemFabricHandle { data }
    "CUcheckpointLockArgs" => CUcheckpointLockArgs { timeoutMs, reserved0, reserved1 }
    "CUcheckpointCheckpointArgs" => CUcheckpointCheckpointArgs { reserved }
    "CUcheckpointGpuPair" => CUcheckpointGpuPair { oldUuid, newUuid }
    "CUcheckpointRestoreArgs" => CUcheckpointRestoreArgs {
        gpuPairs, gpuPairsCount, reserved, reserved1
    }
    "CUcheckpointUnlockArgs" => CUcheckpointUnlockArgs { reserved }
}

/// The layout report, one line per struct and per field, in `LAYOUT` order.
pub fn report() -> String {
    let mut out = String::new();
    for s in LAYOUT {
        out.push_str(&format!(
            "struct {} size {} align {}\n",
            s.name, s.size, s.align
        ));
        for (field, offset) in s.fields {
            out.push_str(&format!(
                "field {}.{} offset {}\n",
                s.name,
                c_field_name(field),
                offset
            ));
        }
    }
    out
}

/// Rust cannot name a field `type`; the mirror calls it `type_`.
fn c_field_name(rust_name: &str) -> &str {
    rust_name.strip_suffix('_').unwrap_or(rust_name)
}

#[cfg(test)]
mod tests {
    #[test]
    fn report_names_c_fields() {
        let report = super::report();
        assert!(report.contains("struct CUmemAllocationProp size 32 align 8\n"));
        assert!(report.contains("field CUmemAllocationProp.type offset 0\n"));
        assert!(report.contains("field CUcheckpointRestoreArgs.reserved1 offset 56\n"));
    }
}
