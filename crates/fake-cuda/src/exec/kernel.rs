//! The built-in kernels of the fake (the shared contract: the kernel table of this crate's README,
//! "Modules and kernels"): what each one takes and what it does when its stream executes it.
//! Arguments are copied at launch, as the driver does; memory is checked and touched at execution
//! (see [`super::access`]).

use std::ffi::c_void;
use std::time::{Duration, Instant};

use cuda_abi::CUresult;

use super::access::{self, Fault};
use super::{Outcome, poll_interval};
use crate::Res;
use crate::state::Driver;

/// A kernel parameter's type.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Param {
    U64,
    U32,
}

use Param::{U32, U64};

/// The kernels the fake implements.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Builtin {
    Noop,
    FillU32,
    IotaU32,
    AddU32,
    ChecksumU32,
    Copy,
    Sleep,
    SpinUntilU32,
    SetU32,
    SumU32,
    SumF32,
}

/// Name, kernel, parameters in order.
const BUILTINS: &[(&str, Builtin, &[Param])] = &[
    ("cuinterpose_noop", Builtin::Noop, &[]),
    ("cuinterpose_fill_u32", Builtin::FillU32, &[U64, U64, U32]),
    ("cuinterpose_iota_u32", Builtin::IotaU32, &[U64, U64, U32]),
    (
        "cuinterpose_add_u32",
        Builtin::AddU32,
        &[U64, U64, U64, U32],
    ),
    (
        "cuinterpose_checksum_u32",
        Builtin::ChecksumU32,
        &[U64, U64, U64],
    ),
    ("cuinterpose_copy", Builtin::Copy, &[U64, U64, U64]),
    ("cuinterpose_sleep", Builtin::Sleep, &[U64]),
    (
        "cuinterpose_spin_until_u32",
        Builtin::SpinUntilU32,
        &[U64, U32],
    ),
    ("cuinterpose_set_u32", Builtin::SetU32, &[U64, U32]),
    ("cuinterpose_sum_u32", Builtin::SumU32, &[U64, U64, U64]),
    ("cuinterpose_sum_f32", Builtin::SumF32, &[U64, U64, U64]),
];

impl Builtin {
    pub(crate) fn by_name(name: &str) -> Option<Builtin> {
        BUILTINS
            .iter()
            .find(|(n, _, _)| *n == name)
            .map(|&(_, k, _)| k)
    }

    fn params(self) -> &'static [Param] {
        BUILTINS
            .iter()
            .find(|(_, k, _)| *k == self)
            .map_or(&[], |&(_, _, p)| p)
    }
}

/// A launched kernel: which one, and its argument values (copied at launch).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Kernel {
    pub which: Builtin,
    pub args: [u64; 4],
}

impl Kernel {
    /// Reads the arguments of `which` from `kernelParams` (an array of pointers to each value).
    ///
    /// # Safety
    /// `params` is null or points to one readable pointer per parameter, each null or pointing
    /// to a readable value of the parameter's type.
    pub(crate) unsafe fn launch(which: Builtin, params: *mut *mut c_void) -> Res<Kernel> {
        let mut args = [0u64; 4];
        let wanted = which.params();
        if wanted.is_empty() {
            return Ok(Kernel { which, args });
        }
        if params.is_null() {
            return Err(CUresult::ERROR_INVALID_VALUE);
        }
        for (i, (slot, kind)) in args.iter_mut().zip(wanted).enumerate() {
            // SAFETY: the caller passes one pointer per parameter at `params`, so slot `i`
            // is inside that array.
            let slot_ptr = unsafe { params.add(i) };
            // SAFETY: as above, a readable pointer (null refused by read_in).
            let p = unsafe { crate::read_in(slot_ptr.cast_const()) }?;
            *slot = match kind {
                // SAFETY: the caller's pointer to a u64 argument (null refused by read_in).
                U64 => unsafe { crate::read_in(p.cast::<u64>().cast_const()) }?,
                // SAFETY: the caller's pointer to a u32 argument (null refused by read_in).
                U32 => u64::from(unsafe { crate::read_in(p.cast::<u32>().cast_const()) }?),
            };
        }
        Ok(Kernel { which, args })
    }
}

fn outcome(r: Result<(), Fault>) -> Outcome {
    match r {
        Ok(()) => Outcome::Done,
        Err(Fault) => Outcome::Fault,
    }
}

/// Executes one step of kernel `k` on `device`'s behalf, under the lock. `started` is when it
/// began (a sleep counts from there).
pub(crate) fn run(d: &Driver, device: usize, k: &Kernel, started: &mut Option<Instant>) -> Outcome {
    let [a, b, c, e] = k.args;
    match k.which {
        Builtin::Noop => Outcome::Done,
        Builtin::Sleep => {
            let now = Instant::now();
            // A sleep past what the clock can represent never ends: look again in a second.
            match started
                .get_or_insert(now)
                .checked_add(Duration::from_nanos(a))
            {
                Some(end) if now >= end => Outcome::Done,
                Some(end) => Outcome::Pending(end - now),
                None => Outcome::Pending(Duration::from_secs(1)),
            }
        }
        Builtin::SpinUntilU32 => match access::read_u32(d, device, a) {
            Err(Fault) => Outcome::Fault,
            Ok(v) if v >= b as u32 => Outcome::Done,
            Ok(_) => Outcome::Pending(poll_interval()),
        },
        Builtin::SetU32 => outcome(access::write(d, device, a, &(b as u32).to_le_bytes())),
        Builtin::FillU32 => outcome(fill(d, device, a, b, |_| c as u32)),
        Builtin::IotaU32 => outcome(fill(d, device, a, b, |i| (c as u32).wrapping_add(i as u32))),
        Builtin::AddU32 => outcome(add(d, device, a, b, c, e as u32)),
        Builtin::ChecksumU32 => outcome(checksum(d, device, a, b, c)),
        Builtin::Copy => outcome(
            access::read(d, device, b, c).and_then(|bytes| access::write(d, device, a, &bytes)),
        ),
        Builtin::SumU32 => outcome(sum(d, device, a, b, c, |x, y| x.wrapping_add(y))),
        Builtin::SumF32 => outcome(sum(d, device, a, b, c, |x, y| {
            (f32::from_bits(x) + f32::from_bits(y)).to_bits()
        })),
    }
}

fn fill(
    d: &Driver,
    device: usize,
    dst: u64,
    count: u64,
    value: impl Fn(u64) -> u32,
) -> Result<(), Fault> {
    let len = count.checked_mul(4).ok_or(Fault)?;
    // Checked before anything is built, so a bogus count faults instead of allocating.
    access::require(d, device, dst, len, crate::memory::Need::Write)?;
    let words: Vec<u32> = (0..count).map(value).collect();
    access::write_words(d, device, dst, &words)
}

fn add(
    d: &Driver,
    device: usize,
    dst: u64,
    src: u64,
    count: u64,
    addend: u32,
) -> Result<(), Fault> {
    let len = count.checked_mul(4).ok_or(Fault)?;
    access::require(d, device, dst, len, crate::memory::Need::Write)?;
    let words: Vec<u32> = access::read_words(d, device, src, count)?
        .into_iter()
        .map(|w| w.wrapping_add(addend))
        .collect();
    access::write_words(d, device, dst, &words)
}

fn checksum(d: &Driver, device: usize, src: u64, count: u64, out: u64) -> Result<(), Fault> {
    access::require(d, device, out, 8, crate::memory::Need::Write)?;
    let total = access::read_words(d, device, src, count)?
        .into_iter()
        .fold(0u64, |acc, w| acc.wrapping_add(u64::from(w)));
    access::write(d, device, out, &total.to_le_bytes())
}

fn sum(
    d: &Driver,
    device: usize,
    dst: u64,
    src: u64,
    count: u64,
    op: impl Fn(u32, u32) -> u32,
) -> Result<(), Fault> {
    let mut acc = access::read_words(d, device, dst, count)?;
    let add = access::read_words(d, device, src, count)?;
    for (x, y) in acc.iter_mut().zip(add) {
        *x = op(*x, y);
    }
    access::write_words(d, device, dst, &acc)
}
