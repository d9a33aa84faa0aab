//! One rank of the fake NCCL's process tests: loads `libcuda.so.1` and `libnccl.so.2` with
//! `dlopen` (whatever `LD_LIBRARY_PATH` finds first, as an application of NCCL does) and runs
//! all-reduces on device memory, checking every result.
//!
//! ```text
//! fake-nccl-rank id                                  print a new unique id (hex)
//! fake-nccl-rank allreduce ID NRANKS RANK COUNT      COUNT all-reduces, 10 in flight at a time
//! fake-nccl-rank stall ID NRANKS RANK GO_FILE        the last rank calls only once GO_FILE exists;
//!                                                    the others show their stream busy meanwhile
//! ```
//!
//! Prints `busy` (stall, ranks but the last, once their stream is seen busy) and, at the end,
//! `ok <checksum>`: a hash of every result, equal on every rank when results are bit-identical.

#![allow(unsafe_code)]

use std::ffi::{CStr, c_char, c_int, c_uint, c_void};
use std::io::Write;
use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail, ensure};

type CuResult = u32;
type Ptr = u64;
const CUDA_ERROR_NOT_READY: CuResult = 600;

const NCCL_INT32: c_int = 2;
const NCCL_UINT32: c_int = 3;
const NCCL_FLOAT32: c_int = 7;
const NCCL_SUM: c_int = 0;

/// `ncclUniqueId`, passed by value to `ncclCommInitRank` as a C caller passes it.
#[repr(C)]
#[derive(Clone, Copy)]
struct UniqueId {
    internal: [u8; 128],
}

/// The entry points used, copied out of the libraries (which stay loaded for the process's life).
struct Api {
    cu_init: unsafe extern "C" fn(c_uint) -> CuResult,
    cu_device_get_count: unsafe extern "C" fn(*mut c_int) -> CuResult,
    cu_device_get: unsafe extern "C" fn(*mut c_int, c_int) -> CuResult,
    cu_primary_ctx_retain: unsafe extern "C" fn(*mut *mut c_void, c_int) -> CuResult,
    cu_ctx_set_current: unsafe extern "C" fn(*mut c_void) -> CuResult,
    cu_stream_create: unsafe extern "C" fn(*mut *mut c_void, c_uint) -> CuResult,
    cu_stream_query: unsafe extern "C" fn(*mut c_void) -> CuResult,
    cu_stream_synchronize: unsafe extern "C" fn(*mut c_void) -> CuResult,
    cu_mem_alloc: unsafe extern "C" fn(*mut Ptr, usize) -> CuResult,
    cu_memcpy_htod: unsafe extern "C" fn(Ptr, *const c_void, usize) -> CuResult,
    cu_memcpy_dtoh: unsafe extern "C" fn(*mut c_void, Ptr, usize) -> CuResult,
    nccl_get_unique_id: unsafe extern "C" fn(*mut UniqueId) -> u32,
    nccl_comm_init_rank: unsafe extern "C" fn(*mut *mut c_void, c_int, UniqueId, c_int) -> u32,
    nccl_comm_destroy: unsafe extern "C" fn(*mut c_void) -> u32,
    nccl_comm_count: unsafe extern "C" fn(*mut c_void, *mut c_int) -> u32,
    nccl_comm_user_rank: unsafe extern "C" fn(*mut c_void, *mut c_int) -> u32,
    nccl_comm_cu_device: unsafe extern "C" fn(*mut c_void, *mut c_int) -> u32,
    nccl_all_reduce: unsafe extern "C" fn(
        *const c_void,
        *mut c_void,
        usize,
        c_int,
        c_int,
        *mut c_void,
        *mut c_void,
    ) -> u32,
    nccl_get_last_error: unsafe extern "C" fn(*mut c_void) -> *const c_char,
}

macro_rules! sym {
    ($lib:expr, $name:literal) => {{
        // SAFETY: the library exports this name with the signature of the field it fills
        // (cuda.h, nccl.h); the library is leaked, so the pointer stays valid.
        let s = unsafe { $lib.get($name) }.with_context(|| format!("{:?}", $name))?;
        *s
    }};
}

impl Api {
    fn load() -> Result<Api> {
        // SAFETY: loading the libraries runs their initialisers, which is what they are for.
        let cuda = unsafe { libloading::Library::new("libcuda.so.1") }.context("libcuda.so.1")?;
        // SAFETY: as above.
        let nccl = unsafe { libloading::Library::new("libnccl.so.2") }.context("libnccl.so.2")?;
        let (cuda, nccl) = (Box::leak(Box::new(cuda)), Box::leak(Box::new(nccl)));
        Ok(Api {
            cu_init: sym!(cuda, b"cuInit"),
            cu_device_get_count: sym!(cuda, b"cuDeviceGetCount"),
            cu_device_get: sym!(cuda, b"cuDeviceGet"),
            cu_primary_ctx_retain: sym!(cuda, b"cuDevicePrimaryCtxRetain"),
            cu_ctx_set_current: sym!(cuda, b"cuCtxSetCurrent"),
            cu_stream_create: sym!(cuda, b"cuStreamCreate"),
            cu_stream_query: sym!(cuda, b"cuStreamQuery"),
            cu_stream_synchronize: sym!(cuda, b"cuStreamSynchronize"),
            cu_mem_alloc: sym!(cuda, b"cuMemAlloc_v2"),
            cu_memcpy_htod: sym!(cuda, b"cuMemcpyHtoD_v2"),
            cu_memcpy_dtoh: sym!(cuda, b"cuMemcpyDtoH_v2"),
            nccl_get_unique_id: sym!(nccl, b"ncclGetUniqueId"),
            nccl_comm_init_rank: sym!(nccl, b"ncclCommInitRank"),
            nccl_comm_destroy: sym!(nccl, b"ncclCommDestroy"),
            nccl_comm_count: sym!(nccl, b"ncclCommCount"),
            nccl_comm_user_rank: sym!(nccl, b"ncclCommUserRank"),
            nccl_comm_cu_device: sym!(nccl, b"ncclCommCuDevice"),
            nccl_all_reduce: sym!(nccl, b"ncclAllReduce"),
            nccl_get_last_error: sym!(nccl, b"ncclGetLastError"),
        })
    }
}

fn cu(call: &str, result: CuResult) -> Result<()> {
    ensure!(result == 0, "{call} returned CUresult {result}");
    Ok(())
}

fn nccl(api: &Api, call: &str, result: u32) -> Result<()> {
    if result != 0 {
        // SAFETY: no pointer is dereferenced by the call (the communicator is ignored).
        let last = unsafe { (api.nccl_get_last_error)(std::ptr::null_mut()) };
        // SAFETY: the library returns a NUL-terminated per-thread buffer.
        let text = unsafe { CStr::from_ptr(last) };
        bail!(
            "{call} returned ncclResult {result}: {}",
            text.to_string_lossy()
        );
    }
    Ok(())
}

const STREAMS: usize = 3;

/// What a rank needs for collectives: its context's stream and its communicator.
struct Rank {
    api: Api,
    nranks: u32,
    rank: u32,
    /// Collective `seq` runs on `streams[seq % STREAMS]`: a communicator's collectives on several
    /// streams at once, as an application may enqueue them. Three, so that collectives sharing a
    /// staging slot (4 apart) run on different streams.
    streams: [*mut c_void; STREAMS],
    comm: *mut c_void,
}

fn parse_id(hex: &str) -> Result<UniqueId> {
    ensure!(
        hex.len() == 256 && hex.is_ascii(),
        "a unique id is 256 hex digits"
    );
    let mut id = UniqueId {
        internal: [0u8; 128],
    };
    for (i, byte) in id.internal.iter_mut().enumerate() {
        *byte = u8::from_str_radix(&hex[2 * i..2 * i + 2], 16).context("unique id")?;
    }
    Ok(id)
}

impl Rank {
    /// Makes device `rank % count` current, a stream on it, and joins the communicator.
    fn join(api: Api, id: UniqueId, nranks: u32, rank: u32) -> Result<Rank> {
        // SAFETY: no pointers.
        cu("cuInit", unsafe { (api.cu_init)(0) })?;
        let mut count = 0;
        // SAFETY: a live local out-pointer.
        cu("cuDeviceGetCount", unsafe {
            (api.cu_device_get_count)(&mut count)
        })?;
        let (mut device, ordinal) = (0, rank as c_int % count.max(1));
        // SAFETY: as above.
        cu("cuDeviceGet", unsafe {
            (api.cu_device_get)(&mut device, ordinal)
        })?;
        let mut ctx = std::ptr::null_mut();
        // SAFETY: as above.
        let retained = unsafe { (api.cu_primary_ctx_retain)(&mut ctx, device) };
        cu("cuDevicePrimaryCtxRetain", retained)?;
        // SAFETY: a context the driver just gave.
        cu("cuCtxSetCurrent", unsafe { (api.cu_ctx_set_current)(ctx) })?;
        let mut streams = [std::ptr::null_mut(); STREAMS];
        for stream in &mut streams {
            // SAFETY: a live out-pointer.
            cu("cuStreamCreate", unsafe {
                (api.cu_stream_create)(stream, 0)
            })?;
        }
        let mut comm = std::ptr::null_mut();
        // SAFETY: as above; the id is passed by value.
        let joined =
            unsafe { (api.nccl_comm_init_rank)(&mut comm, nranks as c_int, id, rank as c_int) };
        nccl(&api, "ncclCommInitRank", joined)?;
        let (mut n, mut r, mut d) = (0, 0, -1);
        // SAFETY: a communicator just made; live local out-pointers.
        let counted = unsafe { (api.nccl_comm_count)(comm, &mut n) };
        nccl(&api, "ncclCommCount", counted)?;
        // SAFETY: as above.
        let ranked = unsafe { (api.nccl_comm_user_rank)(comm, &mut r) };
        nccl(&api, "ncclCommUserRank", ranked)?;
        // SAFETY: as above.
        let deviced = unsafe { (api.nccl_comm_cu_device)(comm, &mut d) };
        nccl(&api, "ncclCommCuDevice", deviced)?;
        ensure!(
            (n, r, d) == (nranks as c_int, rank as c_int, ordinal),
            "the communicator says {n} ranks, rank {r}, device {d}"
        );
        Ok(Rank {
            api,
            nranks,
            rank,
            streams,
            comm,
        })
    }

    fn alloc(&self, bytes: usize) -> Result<Ptr> {
        let mut p = 0;
        // SAFETY: a live local out-pointer.
        cu("cuMemAlloc_v2", unsafe {
            (self.api.cu_mem_alloc)(&mut p, bytes)
        })?;
        Ok(p)
    }

    fn upload(&self, dst: Ptr, data: &[u32]) -> Result<()> {
        // SAFETY: `data` is readable for its length; `dst` is an allocation at least as long.
        let copied =
            unsafe { (self.api.cu_memcpy_htod)(dst, data.as_ptr().cast(), size_of_val(data)) };
        cu("cuMemcpyHtoD_v2", copied)
    }

    fn download(&self, src: Ptr, count: usize) -> Result<Vec<u32>> {
        let mut data = vec![0u32; count];
        // SAFETY: `data` is writable for `count` elements; `src` holds at least as many.
        let copied = unsafe {
            (self.api.cu_memcpy_dtoh)(data.as_mut_ptr().cast(), src, size_of_val(data.as_slice()))
        };
        cu("cuMemcpyDtoH_v2", copied)?;
        Ok(data)
    }

    fn stream(&self, seq: u32) -> *mut c_void {
        self.streams[seq as usize % STREAMS]
    }

    fn all_reduce(&self, seq: u32, send: Ptr, recv: Ptr, count: usize) -> Result<()> {
        // SAFETY: device buffers of `count` elements, a live communicator and stream.
        let sent = unsafe {
            (self.api.nccl_all_reduce)(
                send as *const c_void,
                recv as *mut c_void,
                count,
                Dtype::of(seq).nccl(),
                NCCL_SUM,
                self.comm,
                self.stream(seq),
            )
        };
        nccl(&self.api, "ncclAllReduce", sent)
    }

    fn query(&self, seq: u32) -> CuResult {
        // SAFETY: a live stream.
        unsafe { (self.api.cu_stream_query)(self.stream(seq)) }
    }

    fn synchronize(&self) -> Result<()> {
        for stream in self.streams {
            // SAFETY: a live stream.
            cu("cuStreamSynchronize", unsafe {
                (self.api.cu_stream_synchronize)(stream)
            })?;
        }
        Ok(())
    }

    fn destroy(self) -> Result<()> {
        // SAFETY: a live communicator, destroyed once.
        let destroyed = unsafe { (self.api.nccl_comm_destroy)(self.comm) };
        nccl(&self.api, "ncclCommDestroy", destroyed)
    }
}

#[derive(Clone, Copy, Debug)]
enum Dtype {
    U32,
    I32,
    F32,
}

impl Dtype {
    /// Collectives cycle through the types.
    fn of(seq: u32) -> Dtype {
        [Dtype::U32, Dtype::I32, Dtype::F32][seq as usize % 3]
    }

    fn nccl(self) -> c_int {
        match self {
            Dtype::U32 => NCCL_UINT32,
            Dtype::I32 => NCCL_INT32,
            Dtype::F32 => NCCL_FLOAT32,
        }
    }

    /// `a + b` on the bits of two elements.
    fn add(self, a: u32, b: u32) -> u32 {
        match self {
            Dtype::U32 | Dtype::I32 => a.wrapping_add(b),
            Dtype::F32 => (f32::from_bits(a) + f32::from_bits(b)).to_bits(),
        }
    }
}

/// Elements of collective `seq`: distinct per collective.
fn count_of(seq: u32) -> usize {
    1000 + (seq as usize % 13) * 17
}

/// Rank `rank`'s element `i` of collective `seq`: distinct per rank, collective and element.
fn input(rank: u32, seq: u32, i: usize, dtype: Dtype) -> u32 {
    let i = i as u32;
    match dtype {
        Dtype::U32 => {
            (rank + 1).wrapping_mul(0x9e37_79b9) ^ (seq << 20) ^ i.wrapping_mul(2_654_435_761)
        }
        Dtype::I32 => ((rank as i32 - 2) * 1_000_003 - (seq as i32) * 7919 + i as i32 * 31) as u32,
        // Sums that are not exact: the order of the additions shows in the bits.
        Dtype::F32 => (0.1 * (rank + 1) as f32 + seq as f32 * 1.37 - i as f32 / 3.0).to_bits(),
    }
}

/// The sum of every rank's element, added in rank order (as the library promises).
fn expected(nranks: u32, seq: u32, i: usize, dtype: Dtype) -> u32 {
    (1..nranks).fold(input(0, seq, i, dtype), |acc, r| {
        dtype.add(acc, input(r, seq, i, dtype))
    })
}

/// FNV-1a over every result, so ranks can compare them bit for bit.
struct Checksum(u64);

impl Checksum {
    fn add(&mut self, data: &[u32]) {
        for byte in data.iter().flat_map(|w| w.to_le_bytes()) {
            self.0 = (self.0 ^ u64::from(byte)).wrapping_mul(0x0100_0000_01b3);
        }
    }
}

/// Device buffers for `IN_FLIGHT` collectives (send and receive), each large enough for any.
const IN_FLIGHT: usize = 10;

struct Buffers(Vec<(Ptr, Ptr)>);

impl Buffers {
    fn new(rank: &Rank) -> Result<Buffers> {
        let bytes = count_of(12) * 4;
        let pairs = (0..IN_FLIGHT)
            .map(|_| Ok((rank.alloc(bytes)?, rank.alloc(bytes)?)))
            .collect::<Result<_>>()?;
        Ok(Buffers(pairs))
    }
}

/// Uploads collective `seq`'s input to pair `slot`; returns its send and receive buffers (the
/// same, in place, when `seq` is odd).
fn upload(rank: &Rank, buffers: &Buffers, slot: usize, seq: u32) -> Result<(Ptr, Ptr)> {
    let (dtype, count) = (Dtype::of(seq), count_of(seq));
    let data: Vec<u32> = (0..count)
        .map(|i| input(rank.rank, seq, i, dtype))
        .collect();
    let (send, recv) = buffers.0[slot];
    let recv = if seq % 2 == 1 { send } else { recv };
    rank.upload(send, &data)?;
    Ok((send, recv))
}

/// Uploads and enqueues collective `seq` alone; returns its receive buffer.
fn start(rank: &Rank, buffers: &Buffers, seq: u32) -> Result<Ptr> {
    let (send, recv) = upload(rank, buffers, 0, seq)?;
    rank.all_reduce(seq, send, recv, count_of(seq))?;
    Ok(recv)
}

/// Checks collective `seq`'s result in `recv` (its stream synchronized).
fn check(rank: &Rank, recv: Ptr, seq: u32, sum: &mut Checksum) -> Result<()> {
    let (dtype, count) = (Dtype::of(seq), count_of(seq));
    let got = rank.download(recv, count)?;
    for (i, &value) in got.iter().enumerate() {
        let want = expected(rank.nranks, seq, i, dtype);
        ensure!(
            value == want,
            "rank {} collective {seq} ({dtype:?}) element {i}: {value:#x}, expected {want:#x}",
            rank.rank
        );
    }
    sum.add(&got);
    Ok(())
}

/// Collectives `first..=last`, `IN_FLIGHT` enqueued at a time before one synchronisation. The
/// inputs of a batch are all uploaded before its first collective is enqueued: a synchronous
/// copy waits for every blocking stream, which would serialise the collectives.
fn run_batches(
    rank: &Rank,
    buffers: &Buffers,
    first: u32,
    last: u32,
    sum: &mut Checksum,
) -> Result<()> {
    let seqs: Vec<u32> = (first..=last).collect();
    for batch in seqs.chunks(IN_FLIGHT) {
        let pairs = batch
            .iter()
            .enumerate()
            .map(|(slot, &seq)| upload(rank, buffers, slot, seq))
            .collect::<Result<Vec<_>>>()?;
        for (&seq, &(send, recv)) in batch.iter().zip(&pairs) {
            rank.all_reduce(seq, send, recv, count_of(seq))?;
        }
        rank.synchronize()?;
        let recvs = pairs.iter().map(|&(_, recv)| recv);
        for (&seq, recv) in batch.iter().zip(recvs) {
            check(rank, recv, seq, sum)?;
        }
    }
    Ok(())
}

/// Collective 1 with the last rank late: the others' streams stay busy until it calls.
fn stall(rank: &Rank, buffers: &Buffers, go: &Path, sum: &mut Checksum) -> Result<()> {
    let laggard = rank.nranks - 1;
    if rank.rank == laggard {
        ensure!(
            (0..STREAMS as u32).all(|s| rank.query(s) == 0),
            "the late rank's stream is busy before it calls"
        );
        let deadline = Instant::now() + Duration::from_secs(120);
        while !go.exists() {
            ensure!(Instant::now() < deadline, "{} never appeared", go.display());
            std::thread::sleep(Duration::from_millis(10));
        }
        let recv = start(rank, buffers, 1)?;
        rank.synchronize()?;
        return check(rank, recv, 1, sum);
    }
    let recv = start(rank, buffers, 1)?;
    std::thread::sleep(Duration::from_secs(1));
    let status = rank.query(1);
    ensure!(
        status == CUDA_ERROR_NOT_READY,
        "rank {}: cuStreamQuery gave {status} a second into a collective its peer has not called",
        rank.rank
    );
    println!("busy");
    std::io::stdout().flush()?;
    rank.synchronize()?;
    check(rank, recv, 1, sum)
}

fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let api = Api::load()?;
    if args.first().map(String::as_str) == Some("id") {
        let mut id = UniqueId {
            internal: [0u8; 128],
        };
        // SAFETY: a live local of the id's size.
        nccl(&api, "ncclGetUniqueId", unsafe {
            (api.nccl_get_unique_id)(&mut id)
        })?;
        println!(
            "{}",
            id.internal
                .iter()
                .map(|b| format!("{b:02x}"))
                .collect::<String>()
        );
        return Ok(());
    }
    let [mode, id, nranks, rank, last] = args.as_slice() else {
        bail!(
            "usage: fake-nccl-rank (id | allreduce ID NRANKS RANK COUNT | stall ID NRANKS RANK GO_FILE)"
        );
    };
    let rank = Rank::join(api, parse_id(id)?, nranks.parse()?, rank.parse()?)?;
    let buffers = Buffers::new(&rank)?;
    let mut sum = Checksum(0xcbf2_9ce4_8422_2325);
    match mode.as_str() {
        "allreduce" => run_batches(&rank, &buffers, 1, last.parse()?, &mut sum)?,
        "stall" => {
            stall(&rank, &buffers, Path::new(last), &mut sum)?;
            run_batches(&rank, &buffers, 2, 2 + IN_FLIGHT as u32, &mut sum)?;
        }
        other => bail!("unknown mode {other}"),
    }
    rank.destroy()?;
    println!("ok {:016x}", sum.0);
    Ok(())
}
