//! Registry memory per tracked allocation, measured with a counting allocator: one allocation
//! created, mapped twice with access for two devices (what a typical shared allocation costs).
//! Prints the figures; asserts a generous bound so that a regression is noticed.

#![allow(unsafe_code)] // the counting allocator

use cuinterpose_shim_runtime::registry::{Kind, Registry};
use protocol::record::{AccessRecord, AllocationId, AllocationProps};
use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicIsize, Ordering};

struct Counting;

static LIVE: AtomicIsize = AtomicIsize::new(0);

// SAFETY: forwards to the system allocator and only counts.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        LIVE.fetch_add(layout.size() as isize, Ordering::Relaxed);
        // SAFETY: the caller's layout.
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        LIVE.fetch_sub(layout.size() as isize, Ordering::Relaxed);
        // SAFETY: allocated above with this layout.
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

const N: u64 = 20_000;

#[test]
fn registry_bytes_per_allocation() {
    let props = AllocationProps {
        allocation_type: 1,
        requested_handle_types: 1,
        location_type: 1,
        location_id: 0,
        compression_type: 0,
        gpu_direct_rdma_capable: 0,
        usage: 0,
    };
    let grants = [
        AccessRecord {
            location_type: 1,
            location_id: 0,
            flags: 3,
        },
        AccessRecord {
            location_type: 1,
            location_id: 1,
            flags: 3,
        },
    ];
    let mut reg = Registry::new();
    let start = LIVE.load(Ordering::Relaxed);
    for i in 0..N {
        let mut id = [0u8; 16];
        id[..8].copy_from_slice(&i.to_le_bytes());
        let h = reg.insert(
            Kind::Created {
                id: AllocationId(id),
                shared: true,
                unsupported_exports: Vec::new(),
            },
            2 << 20,
            props,
            cuda::DriverHandle::from_raw(0x1000 + i),
        );
        let base = 0x7000_0000_0000 + i * (8 << 20);
        reg.insert_mapping(base, 2 << 20, 0, h);
        reg.insert_mapping(base + (4 << 20), 2 << 20, 0, h);
        reg.set_access(base, 2 << 20, &grants);
        reg.set_access(base + (4 << 20), 2 << 20, &grants);
    }
    let used = LIVE.load(Ordering::Relaxed) - start;
    let per = used as f64 / N as f64;
    println!(
        "registry: {used} bytes for {N} allocations with 2 mappings and 2 access grants each: {per:.0} bytes per allocation"
    );
    assert_eq!(reg.report(1, 0).mappings.len(), 2 * N as usize);
    assert!(per < 2048.0, "{per} bytes per allocation");
}
