//! The commands, executed on the command thread. The grammar is in the crate's README and in
//! [`COMMANDS`]; every command answers one [`Reply`].

use std::collections::BTreeMap;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use cuda_abi::{CUmemAccessDesc, CUmemLocation, access_flags, granularity_flags, location_type};
use serde_json::{Value, json};

use super::{ServeOptions, Shared};
use crate::driver::{self, CuError, Driver};
use crate::grammar::{self, Args, UsageError, parse_int, parse_number, usage};
use crate::pattern::Pattern;
use crate::reply::{Reply, kind};
use crate::wire;

mod busy;
mod multicast;

/// Every command word with a one-line synopsis (the README holds the details).
pub const COMMANDS: &[(&str, &str)] = &[
    ("ping", "ping"),
    ("info", "info"),
    ("uuid", "uuid [--device D]"),
    (
        "granularity",
        "granularity [--device D] [--handle-types T] [--recommended]",
    ),
    (
        "create",
        "create NAME SIZE [--device D] [--handle-types posix|fabric|none|posix+fabric]",
    ),
    ("release", "release HANDLE"),
    ("reserve", "reserve NAME SIZE [--align A] [--addr A]"),
    ("free-va", "free-va RESERVATION | free-va ADDR SIZE"),
    (
        "map",
        "map HANDLE ADDR [--alloc-offset O] [--size S] [--as NAME]",
    ),
    ("unmap", "unmap MAPPING | unmap ADDR SIZE"),
    (
        "set-access",
        "set-access ADDR [SIZE] [--device D[:rw|:r|:none]]... [--read-only]",
    ),
    ("get-access", "get-access ADDR [--device D]"),
    ("peer-access", "peer-access enable|disable DEVICE"),
    ("export", "export HANDLE [--type posix|fabric] [--as NAME]"),
    ("import", "import NAME [--fd FD | --raw-fd N] [--size S]"),
    ("close-fd", "close-fd FD"),
    ("open-fd", "open-fd NAME PATH"),
    ("tcp-listen", "tcp-listen NAME (127.0.0.1, a free port)"),
    ("tcp-connect", "tcp-connect NAME ADDR:PORT"),
    ("tcp-accept", "tcp-accept NAME LISTENER"),
    ("tcp-send", "tcp-send SOCKET TEXT"),
    ("tcp-recv", "tcp-recv SOCKET LEN [--timeout MS]"),
    ("send-fd", "send-fd FD --to PEER [--as NAME]"),
    ("send-ipc", "send-ipc BLOB --to PEER [--as NAME]"),
    ("retain-from-address", "retain-from-address NAME ADDR"),
    ("get-props", "get-props HANDLE"),
    (
        "fill",
        "fill REGION SEED [--offset O] [--len L] [--pattern-offset P]",
    ),
    ("memset", "memset REGION VALUE [--offset O] [--len L]"),
    (
        "verify",
        "verify REGION (SEED | --byte V) [--offset O] [--len L] [--pattern-offset P]",
    ),
    (
        "malloc",
        "malloc NAME SIZE [--kind plain|managed|async|pitch]",
    ),
    ("free", "free NAME [--async]"),
    ("ipc-get", "ipc-get NAME REGION"),
    ("ipc-open", "ipc-open NAME [--blob B] [--size S]"),
    ("ipc-close", "ipc-close NAME"),
    ("pointer-attrs", "pointer-attrs REGION [--offset O]"),
    ("mem-info", "mem-info"),
    ("addresses", "addresses"),
    ("sync", "sync"),
    ("sleep", "sleep MS"),
    ("wait", "wait fd|ipc|file NAME [--timeout MS]"),
    ("exit", "exit [CODE]"),
    (
        "recv-fd",
        "recv-fd NAME (sent by peers, with the descriptor attached)",
    ),
    ("recv-ipc", "recv-ipc NAME HEX (sent by peers)"),
    (
        "mc-create",
        "mc-create NAME SIZE --devices N [--handle-types T] (fake driver only)",
    ),
    (
        "mc-add-device",
        "mc-add-device MC [--device D] (fake driver only)",
    ),
    (
        "mc-bind-mem",
        "mc-bind-mem MC MC_OFFSET HANDLE --size S [--mem-offset O] (fake driver only)",
    ),
    (
        "mc-bind-addr",
        "mc-bind-addr MC MC_OFFSET ADDR [--size S] (fake driver only)",
    ),
    (
        "mc-unbind",
        "mc-unbind MC MC_OFFSET SIZE [--device D] (fake driver only)",
    ),
    (
        "busy-loop",
        "busy-loop NAME ADDR [--elements N] (iota, add, checksum on a thread of its own)",
    ),
    (
        "busy-ring",
        "busy-ring NAME --mine ADDR --prev ADDR [--mine-read ADDR] [--prev-write ADDR] --rank R --prev-rank P [--elements N]",
    ),
    ("nccl-id", "nccl-id BLOB (ncclGetUniqueId)"),
    (
        "busy-nccl",
        "busy-nccl NAME --id BLOB --ranks N --rank R [--elements N]",
    ),
    ("busy-status", "busy-status NAME"),
    ("busy-hold", "busy-hold NAME ROUND"),
    ("busy-release", "busy-release NAME"),
    ("busy-wait", "busy-wait NAME ROUND [--timeout MS]"),
    ("busy-stop", "busy-stop NAME [--timeout MS]"),
];

/// Copies move through host buffers of this size.
const CHUNK: usize = 16 << 20;

/// Timeout of one connection to a peer (send-fd, send-ipc).
const PEER_TIMEOUT: Duration = Duration::from_secs(60);

#[derive(Debug, Clone)]
struct Handle {
    value: u64,
    size: Option<u64>,
    origin: &'static str,
}

#[derive(Debug, Clone)]
enum RegionKind {
    Reservation,
    Mapping { handle: String, alloc_offset: u64 },
    Malloc,
    IpcOpen,
}

#[derive(Debug, Clone)]
struct Region {
    kind: RegionKind,
    base: u64,
    size: u64,
}

impl Region {
    fn kind_name(&self) -> &'static str {
        match self.kind {
            RegionKind::Reservation => "reservation",
            RegionKind::Mapping { .. } => "mapping",
            RegionKind::Malloc => "malloc",
            RegionKind::IpcOpen => "ipc",
        }
    }
}

/// A command's effect on the process: its reply, and the exit status if it was `exit`.
pub struct Step {
    pub reply: Reply,
    pub exit: Option<i32>,
}

/// Why a command failed, before it becomes a [`Reply`].
enum Fail {
    Usage(String),
    State(String),
    Io(String),
    Timeout(String),
    Driver(CuError),
    Reply(Box<Reply>),
}

impl From<UsageError> for Fail {
    fn from(e: UsageError) -> Fail {
        Fail::Usage(e.0)
    }
}

impl From<CuError> for Fail {
    fn from(e: CuError) -> Fail {
        Fail::Driver(e)
    }
}

type Outcome = Result<Reply, Fail>;

fn state(message: impl Into<String>) -> Fail {
    Fail::State(message.into())
}

/// Executes commands against one driver and context.
pub struct Exec<'a> {
    driver: &'a Driver,
    device: i32,
    shared: &'a Shared,
    options: &'a ServeOptions,
    handles: BTreeMap<String, Handle>,
    regions: BTreeMap<String, Region>,
    kernels: Option<std::sync::Arc<crate::kernels::Kernels>>,
    nccl: Option<std::sync::Arc<crate::nccl::Nccl>>,
    busy: BTreeMap<String, crate::busy::Busy>,
}

impl<'a> Exec<'a> {
    pub fn new(
        driver: &'a Driver,
        device: i32,
        shared: &'a Shared,
        options: &'a ServeOptions,
    ) -> Exec<'a> {
        Exec {
            driver,
            device,
            shared,
            options,
            handles: BTreeMap::new(),
            regions: BTreeMap::new(),
            kernels: None,
            nccl: None,
            busy: BTreeMap::new(),
        }
    }

    /// Runs one command line.
    pub fn run(&mut self, line: &str) -> Step {
        let word = grammar::command_word(line).unwrap_or("").to_owned();
        let flags: &[&str] = match word.as_str() {
            "granularity" => &["recommended"],
            "set-access" => &["read-only"],
            "free" => &["async"],
            _ => &[],
        };
        let mut exit = None;
        let result = Args::parse(line, flags)
            .map_err(Fail::from)
            .and_then(|args| self.dispatch(&args, &mut exit));
        let reply = match result {
            Ok(reply) => reply,
            Err(Fail::Usage(m)) => Reply::fail(&word, kind::USAGE, m),
            Err(Fail::State(m)) => Reply::fail(&word, kind::STATE, m),
            Err(Fail::Io(m)) => Reply::fail(&word, kind::IO, m),
            Err(Fail::Timeout(m)) => Reply::fail(&word, kind::TIMEOUT, m),
            Err(Fail::Driver(e)) => {
                Reply::driver(&word, e.call, self.driver.error_name(e.result), e.result.0)
            }
            Err(Fail::Reply(r)) => *r,
        };
        Step { reply, exit }
    }

    fn dispatch(&mut self, a: &Args, exit: &mut Option<i32>) -> Outcome {
        match a.command.as_str() {
            "ping" => {
                a.check(0, &[])?;
                Ok(Reply::ok("ping").with("pid", std::process::id()))
            }
            "info" => self.info(a),
            "uuid" => self.uuid(a),
            "granularity" => self.granularity(a),
            "create" => self.create(a),
            "release" => self.release(a),
            "reserve" => self.reserve(a),
            "free-va" => self.free_va(a),
            "map" => self.map(a),
            "unmap" => self.unmap(a),
            "set-access" => self.set_access(a),
            "get-access" => self.get_access(a),
            "peer-access" => self.peer_access(a),
            "export" => self.export(a),
            "import" => self.import(a),
            "close-fd" => self.close_fd(a),
            "open-fd" => self.open_fd(a),
            "tcp-listen" => self.tcp_listen(a),
            "tcp-connect" => self.tcp_connect(a),
            "tcp-accept" => self.tcp_accept(a),
            "tcp-send" => self.tcp_send(a),
            "tcp-recv" => self.tcp_recv(a),
            "send-fd" => self.send_fd(a),
            "send-ipc" => self.send_ipc(a),
            "retain-from-address" => self.retain(a),
            "get-props" => self.get_props(a),
            "fill" => self.fill(a),
            "memset" => self.memset(a),
            "verify" => self.verify(a),
            "malloc" => self.malloc(a),
            "free" => self.free(a),
            "ipc-get" => self.ipc_get(a),
            "ipc-open" => self.ipc_open(a),
            "ipc-close" => self.ipc_close(a),
            "mc-create" => self.mc_create(a),
            "mc-add-device" => self.mc_add_device(a),
            "mc-bind-mem" => self.mc_bind_mem(a),
            "mc-bind-addr" => self.mc_bind_addr(a),
            "mc-unbind" => self.mc_unbind(a),
            "pointer-attrs" => self.pointer_attrs(a),
            "busy-loop" => self.busy_loop(a),
            "busy-ring" => self.busy_ring(a),
            "nccl-id" => self.nccl_id(a),
            "busy-nccl" => self.busy_nccl(a),
            "busy-status" => self.busy_status(a),
            "busy-hold" => self.busy_hold(a),
            "busy-release" => self.busy_release(a),
            "busy-wait" => self.busy_wait(a),
            "busy-stop" => self.busy_stop(a),
            "mem-info" => self.mem_info(a),
            "addresses" => {
                a.check(0, &[])?;
                Ok(self.addresses())
            }
            "sync" => {
                a.check(0, &[])?;
                self.driver.synchronize()?;
                Ok(Reply::ok("sync"))
            }
            "sleep" => sleep(a),
            "wait" => self.wait(a),
            "exit" => {
                let code = exit_code(a)?;
                *exit = Some(code);
                Ok(Reply::ok("exit").with("code", code))
            }
            "recv-fd" | "recv-ipc" => Err(Fail::Usage(format!(
                "{} is only accepted from a peer connection",
                a.command
            ))),
            "" => Err(Fail::Usage("empty command".into())),
            other => Err(Fail::Usage(format!("unknown command {other:?}"))),
        }
    }

    fn uuid(&mut self, a: &Args) -> Outcome {
        a.check(0, &["device"])?;
        let device = self.device_opt(a)?;
        let uuid = self.driver.device_uuid(self.driver.device(device)?)?;
        Ok(Reply::ok("uuid")
            .with("device", device)
            .with("uuid", grammar::to_hex(&uuid)))
    }

    fn mem_info(&mut self, a: &Args) -> Outcome {
        a.check(0, &[])?;
        let (free, total) = self.driver.mem_info()?;
        Ok(Reply::ok("mem-info")
            .with("free", free)
            .with("total", total))
    }

    fn device_opt(&self, a: &Args) -> Result<i32, Fail> {
        match a.opt("device") {
            Some(d) => Ok(i32::try_from(parse_int(d)?).map_err(|_| usage("device out of range"))?),
            None => Ok(self.device),
        }
    }

    fn new_region_name(&self, name: &str) -> Result<(), Fail> {
        if self.regions.contains_key(name) {
            return Err(state(format!("region {name:?} exists")));
        }
        if name.starts_with("0x") || name.starts_with('#') || name.contains('+') {
            return Err(Fail::Usage(format!("{name:?} is not a usable name")));
        }
        Ok(())
    }

    fn new_handle_name(&self, name: &str) -> Result<(), Fail> {
        if self.handles.contains_key(name) {
            return Err(state(format!("handle {name:?} exists")));
        }
        if name.starts_with('#') {
            return Err(Fail::Usage(format!("{name:?} is not a usable name")));
        }
        Ok(())
    }

    /// `NAME` or `#VALUE` (a raw handle value, for error paths).
    fn handle(&self, spec: &str) -> Result<u64, Fail> {
        if let Some(raw) = spec.strip_prefix('#') {
            return Ok(parse_number(raw)?);
        }
        self.handles
            .get(spec)
            .map(|h| h.value)
            .ok_or_else(|| state(format!("no handle {spec:?}")))
    }

    /// `REGION[+OFFSET]` or a literal address: the address and the bytes left in the region from
    /// there (`None` for a literal).
    fn address(&self, spec: &str) -> Result<(u64, Option<u64>), Fail> {
        let (name, offset) = match spec.split_once('+') {
            Some((n, o)) => (n, parse_number(o)?),
            None => (spec, 0),
        };
        if name.starts_with(|c: char| c.is_ascii_digit()) {
            let base = parse_number(name)?;
            return Ok((base.wrapping_add(offset), None));
        }
        let region = self
            .regions
            .get(name)
            .ok_or_else(|| state(format!("no region {name:?}")))?;
        if offset > region.size {
            return Err(Fail::Usage(format!(
                "offset {offset} is beyond region {name:?} of {} bytes",
                region.size
            )));
        }
        Ok((region.base + offset, Some(region.size - offset)))
    }

    fn info(&self, a: &Args) -> Outcome {
        a.check(0, &[])?;
        let version = self.driver.driver_version()?;
        let count = self.driver.device_count()?;
        let maps = std::fs::read_to_string("/proc/self/maps").unwrap_or_default();
        let libcuda = maps
            .lines()
            .filter_map(|l| l.split_whitespace().nth(5))
            .find(|p| p.contains("libcuda.so"))
            .map(str::to_owned);
        let shim = maps.contains("libcuinterpose");
        Ok(Reply::ok("info")
            .with("pid", std::process::id())
            .with("ns_pid", ns_pid())
            .with("rank", self.options.rank)
            .with("device", self.device)
            .with("devices", count)
            .with("driver_version", version)
            .with("resolve", self.driver.route().as_str())
            .with("libcuda", libcuda)
            .with("shim", shim))
    }

    fn granularity(&self, a: &Args) -> Outcome {
        a.check(0, &["device", "handle-types", "recommended"])?;
        let types = handle_types_opt(a)?;
        let prop = driver::device_prop(self.device_opt(a)?, types);
        let option = if a.flag("recommended") {
            granularity_flags::RECOMMENDED
        } else {
            granularity_flags::MINIMUM
        };
        let g = self.driver.granularity(&prop, option)?;
        Ok(Reply::ok("granularity").with("granularity", g))
    }

    fn create(&mut self, a: &Args) -> Outcome {
        a.check(2, &["device", "handle-types"])?;
        let name = a.pos(0, "name")?;
        self.new_handle_name(name)?;
        let size = parse_number(a.pos(1, "size")?)?;
        let device = self.device_opt(a)?;
        let types = handle_types_opt(a)?;
        let h = self
            .driver
            .mem_create(size, &driver::device_prop(device, types))?;
        self.handles.insert(
            name.to_owned(),
            Handle {
                value: h,
                size: Some(size),
                origin: "created",
            },
        );
        Ok(Reply::ok("create")
            .with("name", name)
            .with("handle", h)
            .with("size", size)
            .with("device", device)
            .with("handle_types", driver::handle_types_name(types)))
    }

    fn release(&mut self, a: &Args) -> Outcome {
        a.check(1, &[])?;
        let spec = a.pos(0, "handle")?;
        let h = self.handle(spec)?;
        self.driver.mem_release(h)?;
        self.handles.remove(spec);
        Ok(Reply::ok("release").with("handle", h))
    }

    fn reserve(&mut self, a: &Args) -> Outcome {
        a.check(2, &["align", "addr"])?;
        let name = a.pos(0, "name")?;
        self.new_region_name(name)?;
        let size = parse_number(a.pos(1, "size")?)?;
        let align = a.num_opt("align")?.unwrap_or(0);
        let addr = a.num_opt("addr")?.unwrap_or(0);
        let base = self.driver.address_reserve(size, align, addr)?;
        self.regions.insert(
            name.to_owned(),
            Region {
                kind: RegionKind::Reservation,
                base,
                size,
            },
        );
        Ok(Reply::ok("reserve")
            .with("name", name)
            .with("base", base)
            .with("size", size))
    }

    fn free_va(&mut self, a: &Args) -> Outcome {
        a.check(2, &[])?;
        let spec = a.pos(0, "reservation or address")?;
        let (base, size, name) = match a.pos_opt(1) {
            Some(size) => (self.address(spec)?.0, parse_number(size)?, None),
            None => {
                let r = self
                    .regions
                    .get(spec)
                    .filter(|r| matches!(r.kind, RegionKind::Reservation))
                    .ok_or_else(|| state(format!("no reservation {spec:?}")))?;
                (r.base, r.size, Some(spec.to_owned()))
            }
        };
        self.driver.address_free(base, size)?;
        if let Some(name) = name {
            self.regions.remove(&name);
        }
        Ok(Reply::ok("free-va").with("base", base).with("size", size))
    }

    fn map(&mut self, a: &Args) -> Outcome {
        a.check(2, &["alloc-offset", "size", "as"])?;
        let handle_spec = a.pos(0, "handle")?;
        let h = self.handle(handle_spec)?;
        let (addr, room) = self.address(a.pos(1, "address")?)?;
        let name = a.opt("as").unwrap_or(handle_spec).to_owned();
        self.new_region_name(&name)?;
        let alloc_offset = a.num_opt("alloc-offset")?.unwrap_or(0);
        let size = match (a.num_opt("size")?, room) {
            (Some(s), _) => s,
            (None, Some(room)) => room,
            (None, None) => {
                return Err(Fail::Usage("map at a literal address needs --size".into()));
            }
        };
        self.driver.map(addr, size, alloc_offset, h)?;
        self.regions.insert(
            name.clone(),
            Region {
                kind: RegionKind::Mapping {
                    handle: handle_spec.to_owned(),
                    alloc_offset,
                },
                base: addr,
                size,
            },
        );
        Ok(Reply::ok("map")
            .with("name", name)
            .with("base", addr)
            .with("size", size)
            .with("alloc_offset", alloc_offset))
    }

    fn unmap(&mut self, a: &Args) -> Outcome {
        a.check(2, &[])?;
        let spec = a.pos(0, "mapping or address")?;
        let (base, size) = match a.pos_opt(1) {
            Some(size) => (self.address(spec)?.0, parse_number(size)?),
            None => {
                let r = self
                    .regions
                    .get(spec)
                    .filter(|r| matches!(r.kind, RegionKind::Mapping { .. }))
                    .ok_or_else(|| state(format!("no mapping {spec:?}")))?;
                (r.base, r.size)
            }
        };
        self.driver.unmap(base, size)?;
        self.regions.retain(|_, r| {
            !(matches!(r.kind, RegionKind::Mapping { .. }) && r.base == base && r.size == size)
        });
        Ok(Reply::ok("unmap").with("base", base).with("size", size))
    }

    fn set_access(&mut self, a: &Args) -> Outcome {
        a.check(2, &["device", "read-only"])?;
        let (addr, room) = self.address(a.pos(0, "address")?)?;
        let size = match (a.pos_opt(1), room) {
            (Some(s), _) => parse_number(s)?,
            (None, Some(room)) => room,
            (None, None) => {
                return Err(Fail::Usage(
                    "set-access at a literal address needs SIZE".into(),
                ));
            }
        };
        let default_flags = if a.flag("read-only") {
            access_flags::PROT_READ
        } else {
            access_flags::PROT_READWRITE
        };
        let mut devices = a.all("device");
        let own = self.device.to_string();
        if devices.is_empty() {
            devices.push(&own);
        }
        let mut desc = Vec::new();
        for d in devices {
            let (id, flags) = match d.split_once(':') {
                Some((id, "rw")) => (id, access_flags::PROT_READWRITE),
                Some((id, "r")) => (id, access_flags::PROT_READ),
                Some((id, "none")) => (id, access_flags::PROT_NONE),
                Some((_, other)) => return Err(Fail::Usage(format!("unknown access {other:?}"))),
                None => (d, default_flags),
            };
            desc.push(CUmemAccessDesc {
                location: CUmemLocation {
                    type_: location_type::DEVICE,
                    id: i32::try_from(parse_int(id)?).map_err(|_| usage("device out of range"))?,
                },
                flags,
            });
        }
        self.driver.set_access(addr, size, &desc)?;
        Ok(Reply::ok("set-access")
            .with("base", addr)
            .with("size", size)
            .with("descriptors", desc.len()))
    }

    fn get_access(&self, a: &Args) -> Outcome {
        a.check(1, &["device"])?;
        let (addr, _) = self.address(a.pos(0, "address")?)?;
        let flags = self.driver.get_access(self.device_opt(a)?, addr)?;
        let name = match flags as u32 {
            access_flags::PROT_READWRITE => "rw",
            access_flags::PROT_READ => "r",
            access_flags::PROT_NONE => "none",
            _ => "other",
        };
        Ok(Reply::ok("get-access")
            .with("flags", flags)
            .with("access", name))
    }

    fn peer_access(&self, a: &Args) -> Outcome {
        a.check(2, &[])?;
        let enable = match a.pos(0, "enable|disable")? {
            "enable" => true,
            "disable" => false,
            other => return Err(Fail::Usage(format!("peer-access {other:?}?"))),
        };
        let device: i32 = a
            .pos(1, "device")?
            .parse()
            .map_err(|_| Fail::Usage("peer-access: DEVICE is a device ordinal".into()))?;
        self.driver.peer_access(device, enable)?;
        Ok(Reply::ok("peer-access")
            .with("device", device)
            .with("enabled", enable))
    }

    fn export(&mut self, a: &Args) -> Outcome {
        a.check(1, &["type", "as"])?;
        let spec = a.pos(0, "handle")?;
        let h = self.handle(spec)?;
        let name = a.opt("as").unwrap_or(spec).to_owned();
        match a.opt("type").unwrap_or("posix") {
            "posix" => {
                let fd = self.driver.export_fd(h)?;
                let raw = fd.as_raw_fd();
                self.shared.inbox().fds.insert(name.clone(), fd);
                Ok(Reply::ok("export").with("name", name).with("fd", raw))
            }
            "fabric" => {
                let bytes = self.driver.export_fabric(h)?;
                self.shared
                    .inbox()
                    .blobs
                    .insert(name.clone(), bytes.to_vec());
                Ok(Reply::ok("export")
                    .with("name", name)
                    .with("fabric", grammar::to_hex(&bytes)))
            }
            other => Err(Fail::Usage(format!("unknown handle type {other:?}"))),
        }
    }

    fn import(&mut self, a: &Args) -> Outcome {
        a.check(1, &["fd", "raw-fd", "size"])?;
        let name = a.pos(0, "name")?;
        self.new_handle_name(name)?;
        let h = match a.opt("raw-fd") {
            Some(raw) => {
                let n = i32::try_from(parse_int(raw)?).map_err(|_| usage("fd out of range"))?;
                self.driver.import_raw_fd(n)?
            }
            None => {
                let fd_name = a.opt("fd").unwrap_or(name);
                // A duplicate, so that the inbox is not locked during the driver call (an
                // interposed import may talk to other processes that send us descriptors).
                let fd = {
                    let inbox = self.shared.inbox();
                    let fd = inbox
                        .fds
                        .get(fd_name)
                        .ok_or_else(|| state(format!("no descriptor {fd_name:?}")))?;
                    fd.try_clone()
                        .map_err(|e| Fail::Io(format!("cannot duplicate {fd_name:?}: {e}")))?
                };
                self.driver.import_fd(fd.as_fd())?
            }
        };
        let size = a.num_opt("size")?;
        self.handles.insert(
            name.to_owned(),
            Handle {
                value: h,
                size,
                origin: "imported",
            },
        );
        Ok(Reply::ok("import").with("name", name).with("handle", h))
    }

    fn close_fd(&mut self, a: &Args) -> Outcome {
        a.check(1, &[])?;
        let name = a.pos(0, "descriptor")?;
        self.shared
            .inbox()
            .fds
            .remove(name)
            .ok_or_else(|| state(format!("no descriptor {name:?}")))?;
        Ok(Reply::ok("close-fd").with("name", name))
    }

    fn open_fd(&mut self, a: &Args) -> Outcome {
        a.check(2, &[])?;
        let name = a.pos(0, "name")?;
        let path = a.pos(1, "path")?;
        let file = std::fs::File::open(path).map_err(|e| Fail::Io(format!("{path}: {e}")))?;
        let fd = OwnedFd::from(file);
        let raw = fd.as_raw_fd();
        self.shared.inbox().fds.insert(name.to_owned(), fd);
        Ok(Reply::ok("open-fd").with("name", name).with("fd", raw))
    }

    /// A second descriptor of the socket held as `name` (the held one stays for later commands).
    fn socket(&self, name: &str) -> Result<OwnedFd, Fail> {
        let inbox = self.shared.inbox();
        let fd = inbox
            .fds
            .get(name)
            .ok_or_else(|| state(format!("no socket {name:?}")))?;
        fd.try_clone().map_err(|e| Fail::Io(format!("{name}: {e}")))
    }

    fn hold(&mut self, name: &str, fd: OwnedFd) {
        self.shared.inbox().fds.insert(name.to_owned(), fd);
    }

    // TCP sockets held like descriptors, for checkpoints of workloads with connections (NCCL's
    // bootstrap and proxy connections are TCP).
    fn tcp_listen(&mut self, a: &Args) -> Outcome {
        a.check(1, &[])?;
        let name = a.pos(0, "name")?;
        let io = |e: std::io::Error| Fail::Io(format!("tcp-listen: {e}"));
        let listener = std::net::TcpListener::bind("127.0.0.1:0").map_err(io)?;
        let port = listener.local_addr().map_err(io)?.port();
        self.hold(name, OwnedFd::from(listener));
        Ok(Reply::ok("tcp-listen")
            .with("name", name)
            .with("port", port))
    }

    fn tcp_connect(&mut self, a: &Args) -> Outcome {
        a.check(2, &[])?;
        let name = a.pos(0, "name")?;
        let addr = a.pos(1, "address")?;
        let addr: std::net::SocketAddr = addr
            .parse()
            .map_err(|e| Fail::Usage(format!("tcp-connect: address {addr:?}: {e}")))?;
        let stream = std::net::TcpStream::connect_timeout(&addr, Duration::from_secs(10))
            .map_err(|e| Fail::Io(format!("tcp-connect {addr}: {e}")))?;
        let local = stream
            .local_addr()
            .map(|a| a.to_string())
            .unwrap_or_default();
        self.hold(name, OwnedFd::from(stream));
        Ok(Reply::ok("tcp-connect")
            .with("name", name)
            .with("local", local))
    }

    fn tcp_accept(&mut self, a: &Args) -> Outcome {
        a.check(2, &[])?;
        let name = a.pos(0, "name")?;
        let listener = std::net::TcpListener::from(self.socket(a.pos(1, "listener")?)?);
        let (stream, peer) = listener
            .accept()
            .map_err(|e| Fail::Io(format!("tcp-accept: {e}")))?;
        self.hold(name, OwnedFd::from(stream));
        Ok(Reply::ok("tcp-accept")
            .with("name", name)
            .with("peer", peer.to_string()))
    }

    fn tcp_send(&mut self, a: &Args) -> Outcome {
        a.check(2, &[])?;
        let name = a.pos(0, "socket")?;
        let text = a.pos(1, "text")?;
        let mut stream = std::net::TcpStream::from(self.socket(name)?);
        std::io::Write::write_all(&mut stream, text.as_bytes())
            .map_err(|e| Fail::Io(format!("tcp-send {name}: {e}")))?;
        Ok(Reply::ok("tcp-send")
            .with("name", name)
            .with("bytes", text.len()))
    }

    fn tcp_recv(&mut self, a: &Args) -> Outcome {
        a.check(2, &["timeout"])?;
        let name = a.pos(0, "socket")?;
        let len = usize::try_from(parse_number(a.pos(1, "length")?)?)
            .map_err(|e| Fail::Usage(format!("tcp-recv: length: {e}")))?;
        let timeout = Duration::from_millis(a.num_opt("timeout")?.unwrap_or(10_000));
        let mut stream = std::net::TcpStream::from(self.socket(name)?);
        let mut buffer = vec![0u8; len];
        stream
            .set_read_timeout(Some(timeout))
            .and_then(|()| std::io::Read::read_exact(&mut stream, &mut buffer))
            .map_err(|e| Fail::Io(format!("tcp-recv {name}: {e}")))?;
        Ok(Reply::ok("tcp-recv")
            .with("name", name)
            .with("text", String::from_utf8_lossy(&buffer)))
    }

    fn peer_path(&self, peer: &str) -> PathBuf {
        match (&self.options.peer_dir, peer.parse::<usize>()) {
            (Some(dir), Ok(rank)) => dir.join(format!("{rank}.sock")),
            _ => PathBuf::from(peer),
        }
    }

    fn peer_reply(&self, cmd: &str, replies: Result<Vec<Reply>, wire::WireError>) -> Outcome {
        match replies {
            Ok(mut r) => match r.pop() {
                Some(peer) if peer.ok => Ok(Reply::ok(cmd).with("peer", json!(peer.data))),
                Some(peer) => Err(Fail::Reply(Box::new(
                    Reply::fail(cmd, kind::IO, "the peer refused")
                        .with("peer_error", peer.outcome())
                        .with("peer_message", peer.message.unwrap_or_default()),
                ))),
                None => Err(Fail::Io("the peer did not answer".into())),
            },
            Err(e) => Err(Fail::Io(e.to_string())),
        }
    }

    fn send_fd(&mut self, a: &Args) -> Outcome {
        a.check(1, &["to", "as"])?;
        let name = a.pos(0, "descriptor")?;
        let to = a
            .opt("to")
            .ok_or_else(|| usage("send-fd needs --to PEER"))?;
        let as_name = a.opt("as").unwrap_or(name);
        // A duplicate, so that the inbox is not locked while a peer is talked to: the peer may be
        // sending to us at the same time, and our connection thread needs the inbox to store it.
        let fd = {
            let inbox = self.shared.inbox();
            let fd = inbox
                .fds
                .get(name)
                .ok_or_else(|| state(format!("no descriptor {name:?}")))?;
            fd.try_clone()
                .map_err(|e| Fail::Io(format!("cannot duplicate {name:?}: {e}")))?
        };
        let path = self.peer_path(to);
        let line = format!("recv-fd {as_name}");
        let replies = wire::call(&path, &[&line], Some(fd.as_fd()), PEER_TIMEOUT);
        self.peer_reply("send-fd", replies)
    }

    fn send_ipc(&mut self, a: &Args) -> Outcome {
        a.check(1, &["to", "as"])?;
        let name = a.pos(0, "blob")?;
        let to = a
            .opt("to")
            .ok_or_else(|| usage("send-ipc needs --to PEER"))?;
        let as_name = a.opt("as").unwrap_or(name);
        let hex = {
            let inbox = self.shared.inbox();
            let bytes = inbox
                .blobs
                .get(name)
                .ok_or_else(|| state(format!("no blob {name:?}")))?;
            grammar::to_hex(bytes)
        };
        let path = self.peer_path(to);
        let line = format!("recv-ipc {as_name} {hex}");
        let replies = wire::call(&path, &[&line], None, PEER_TIMEOUT);
        self.peer_reply("send-ipc", replies)
    }

    fn retain(&mut self, a: &Args) -> Outcome {
        a.check(2, &[])?;
        let name = a.pos(0, "name")?;
        self.new_handle_name(name)?;
        let (addr, _) = self.address(a.pos(1, "address")?)?;
        let h = self.driver.retain(addr)?;
        self.handles.insert(
            name.to_owned(),
            Handle {
                value: h,
                size: None,
                origin: "retained",
            },
        );
        Ok(Reply::ok("retain-from-address")
            .with("name", name)
            .with("handle", h))
    }

    fn get_props(&self, a: &Args) -> Outcome {
        a.check(1, &[])?;
        let h = self.handle(a.pos(0, "handle")?)?;
        let p = self.driver.properties(h)?;
        Ok(Reply::ok("get-props")
            .with("type", p.type_)
            .with("requested_handle_types", p.requestedHandleTypes)
            .with(
                "handle_types",
                driver::handle_types_name(p.requestedHandleTypes),
            )
            .with("location_type", p.location.type_)
            .with("device", p.location.id)
            .with("compression", p.allocFlags.compressionType)
            .with("gpu_direct_rdma", p.allocFlags.gpuDirectRDMACapable)
            .with("usage", p.allocFlags.usage))
    }

    /// The byte range a fill/memset/verify addresses: (address, length, pattern start).
    fn range(&self, a: &Args) -> Result<(u64, u64, u64), Fail> {
        let (addr, room) = self.address(a.pos(0, "region")?)?;
        let offset = a.num_opt("offset")?.unwrap_or(0);
        let len = match (a.num_opt("len")?, room) {
            (Some(l), _) => l,
            (None, Some(room)) => room
                .checked_sub(offset)
                .ok_or_else(|| Fail::Usage(format!("offset {offset} is beyond the region")))?,
            (None, None) => return Err(Fail::Usage("a literal address needs --len".into())),
        };
        if let Some(room) = room
            && offset.checked_add(len).is_none_or(|end| end > room)
        {
            return Err(Fail::Usage(format!(
                "range {offset}+{len} is beyond the region ({room} bytes)"
            )));
        }
        let pattern_start = a.num_opt("pattern-offset")?.unwrap_or(offset);
        Ok((addr + offset, len, pattern_start))
    }

    /// `cuPointerGetAttribute` of the attributes an application tells memory kinds apart by,
    /// one call each, checked against one `cuPointerGetAttributes` of them all.
    fn pointer_attrs(&mut self, a: &Args) -> Outcome {
        use cuda_abi::pointer_attribute as attr;
        a.check(1, &["offset"])?;
        let (addr, _) = self.address(a.pos(0, "region")?)?;
        let ptr = addr + a.num_opt("offset")?.unwrap_or(0);
        let api = self.driver.api();
        let single = [
            (
                "memory_type",
                attr::MEMORY_TYPE,
                u64::from(api.pointer_attribute::<u32>(attr::MEMORY_TYPE, ptr)?),
            ),
            (
                "device",
                attr::DEVICE_ORDINAL,
                u64::from(api.pointer_attribute::<u32>(attr::DEVICE_ORDINAL, ptr)?),
            ),
            (
                "legacy_ipc",
                attr::IS_LEGACY_CUDA_IPC_CAPABLE,
                u64::from(
                    api.pointer_attribute::<u32>(attr::IS_LEGACY_CUDA_IPC_CAPABLE, ptr)? != 0,
                ),
            ),
            (
                "range_start",
                attr::RANGE_START_ADDR,
                api.pointer_attribute::<u64>(attr::RANGE_START_ADDR, ptr)?,
            ),
            (
                "range_size",
                attr::RANGE_SIZE,
                api.pointer_attribute::<u64>(attr::RANGE_SIZE, ptr)?,
            ),
            (
                "mapped",
                attr::MAPPED,
                u64::from(api.pointer_attribute::<u32>(attr::MAPPED, ptr)? != 0),
            ),
        ];
        let attributes: Vec<u32> = single.iter().map(|(_, a, _)| *a).collect();
        let together = api.pointer_attributes(&attributes, ptr)?;
        let mut reply = Reply::ok("pointer-attrs");
        for ((name, a, value), got) in single.into_iter().zip(together) {
            // Booleans are compared as booleans: the driver's width for them is not documented.
            let boolean = matches!(a, attr::IS_LEGACY_CUDA_IPC_CAPABLE | attr::MAPPED);
            let got = if boolean {
                u64::from(got & 0xff != 0)
            } else {
                got
            };
            if got != value {
                return Err(state(format!(
                    "{name}: cuPointerGetAttribute says {value:#x}, cuPointerGetAttributes {got:#x}"
                )));
            }
            reply = reply.with(name, value);
        }
        Ok(reply)
    }

    fn fill(&mut self, a: &Args) -> Outcome {
        a.check(2, &["offset", "len", "pattern-offset"])?;
        let seed = parse_number(a.pos(1, "seed")?)?;
        let (addr, len, start) = self.range(a)?;
        let pattern = Pattern::new(seed);
        let mut buf = vec![0u8; CHUNK.min(len as usize)];
        let mut done = 0u64;
        while done < len {
            let n = (len - done).min(CHUNK as u64) as usize;
            let chunk = &mut buf[..n];
            pattern.fill(start + done, chunk);
            self.driver.copy_to_device(addr + done, chunk)?;
            done += n as u64;
        }
        self.driver.synchronize()?;
        Ok(Reply::ok("fill").with("base", addr).with("bytes", len))
    }

    fn memset(&mut self, a: &Args) -> Outcome {
        a.check(2, &["offset", "len"])?;
        let value = u8::try_from(parse_number(a.pos(1, "value")?)?)
            .map_err(|_| usage("memset value is one byte"))?;
        let (addr, len, _) = self.range(a)?;
        self.driver.memset(addr, value, len)?;
        self.driver.synchronize()?;
        Ok(Reply::ok("memset").with("base", addr).with("bytes", len))
    }

    fn verify(&mut self, a: &Args) -> Outcome {
        a.check(2, &["offset", "len", "pattern-offset", "byte"])?;
        let constant = match a.num_opt("byte")? {
            Some(b) => Some(u8::try_from(b).map_err(|_| usage("--byte is one byte"))?),
            None => None,
        };
        let pattern = match (constant, a.pos_opt(1)) {
            (None, Some(seed)) => Some(Pattern::new(parse_number(seed)?)),
            (Some(_), None) => None,
            _ => return Err(Fail::Usage("verify takes SEED or --byte V".into())),
        };
        let (addr, len, start) = self.range(a)?;
        let mut buf = vec![0u8; CHUNK.min(len as usize)];
        let mut done = 0u64;
        while done < len {
            let n = (len - done).min(CHUNK as u64) as usize;
            let chunk = &mut buf[..n];
            self.driver.copy_from_device(chunk, addr + done)?;
            let bad = match (pattern, constant) {
                (Some(p), _) => p.first_mismatch(start + done, chunk),
                (None, Some(c)) => chunk.iter().position(|&b| b != c),
                (None, None) => None,
            };
            if let Some(i) = bad {
                let at = done + i as u64;
                let expected = match (pattern, constant) {
                    (Some(p), _) => p.byte(start + at),
                    (None, c) => c.unwrap_or(0),
                };
                return Err(Fail::Reply(Box::new(
                    Reply::fail(
                        "verify",
                        kind::MISMATCH,
                        format!("first difference at offset {at} of the range"),
                    )
                    .with("offset", at)
                    .with("address", addr + at)
                    .with("expected", expected)
                    .with("actual", chunk.get(i).copied().unwrap_or(0)),
                )));
            }
            done += n as u64;
        }
        Ok(Reply::ok("verify").with("base", addr).with("bytes", len))
    }

    fn malloc(&mut self, a: &Args) -> Outcome {
        a.check(2, &["kind"])?;
        let name = a.pos(0, "name")?;
        self.new_region_name(name)?;
        let size = parse_number(a.pos(1, "size")?)?;
        // `pitch` is 4 rows of SIZE/4 bytes: SIZE contiguous bytes from the base fit in them.
        let base = match a.opt("kind").unwrap_or("plain") {
            "plain" => self.driver.malloc(size)?,
            "managed" => self.driver.malloc_managed(size)?,
            "async" => self.driver.malloc_async(size)?,
            "pitch" if size % 4 == 0 => self.driver.malloc_pitch(size)?,
            other => {
                return Err(usage(format!(
                    "malloc: --kind {other:?} is not plain, managed, async or pitch (a multiple of 4 bytes)"
                ))
                .into());
            }
        };
        self.regions.insert(
            name.to_owned(),
            Region {
                kind: RegionKind::Malloc,
                base,
                size,
            },
        );
        Ok(Reply::ok("malloc")
            .with("name", name)
            .with("base", base)
            .with("size", size))
    }

    fn free(&mut self, a: &Args) -> Outcome {
        a.check(1, &["async"])?;
        let name = a.pos(0, "name")?;
        let r = self
            .regions
            .get(name)
            .filter(|r| matches!(r.kind, RegionKind::Malloc))
            .ok_or_else(|| state(format!("no malloc region {name:?}")))?;
        if a.flag("async") {
            self.driver.free_async(r.base)?;
        } else {
            self.driver.free(r.base)?;
        }
        self.regions.remove(name);
        Ok(Reply::ok("free").with("name", name))
    }

    fn ipc_get(&mut self, a: &Args) -> Outcome {
        a.check(2, &[])?;
        let name = a.pos(0, "name")?;
        let (addr, _) = self.address(a.pos(1, "region")?)?;
        let bytes = self.driver.ipc_get(addr)?;
        self.shared
            .inbox()
            .blobs
            .insert(name.to_owned(), bytes.to_vec());
        Ok(Reply::ok("ipc-get")
            .with("name", name)
            .with("handle", grammar::to_hex(&bytes)))
    }

    fn ipc_open(&mut self, a: &Args) -> Outcome {
        a.check(1, &["blob", "size"])?;
        let name = a.pos(0, "name")?;
        self.new_region_name(name)?;
        let blob = a.opt("blob").unwrap_or(name);
        let bytes: [u8; 64] = {
            let inbox = self.shared.inbox();
            let b = inbox
                .blobs
                .get(blob)
                .ok_or_else(|| state(format!("no blob {blob:?}")))?;
            b.as_slice()
                .try_into()
                .map_err(|_| state(format!("blob {blob:?} is not a 64-byte IPC handle")))?
        };
        let base = self.driver.ipc_open(&bytes)?;
        let size = match a.num_opt("size")? {
            Some(s) => s,
            None => match self.driver.address_range(base) {
                Ok((_, s)) => s,
                Err(e) => {
                    let _ = self.driver.ipc_close(base);
                    return Err(e.into());
                }
            },
        };
        self.regions.insert(
            name.to_owned(),
            Region {
                kind: RegionKind::IpcOpen,
                base,
                size,
            },
        );
        Ok(Reply::ok("ipc-open")
            .with("name", name)
            .with("base", base)
            .with("size", size))
    }

    fn ipc_close(&mut self, a: &Args) -> Outcome {
        a.check(1, &[])?;
        let name = a.pos(0, "name")?;
        let r = self
            .regions
            .get(name)
            .filter(|r| matches!(r.kind, RegionKind::IpcOpen))
            .ok_or_else(|| state(format!("no ipc region {name:?}")))?;
        self.driver.ipc_close(r.base)?;
        self.regions.remove(name);
        Ok(Reply::ok("ipc-close").with("name", name))
    }

    fn wait(&mut self, a: &Args) -> Outcome {
        a.check(2, &["timeout"])?;
        let what = a.pos(0, "fd|ipc|file")?;
        let name = a.pos(1, "name")?;
        let timeout = Duration::from_millis(a.num_opt("timeout")?.unwrap_or(60_000));
        let deadline = Instant::now() + timeout;
        let arrived = match what {
            "fd" => self.shared.wait_for(deadline, |i| i.fds.contains_key(name)),
            "ipc" => self
                .shared
                .wait_for(deadline, |i| i.blobs.contains_key(name)),
            "file" => loop {
                if std::path::Path::new(name).exists() {
                    break true;
                }
                if Instant::now() >= deadline {
                    break false;
                }
                std::thread::sleep(Duration::from_millis(20));
            },
            other => return Err(Fail::Usage(format!("wait for {other:?}?"))),
        };
        if arrived {
            Ok(Reply::ok("wait").with("name", name))
        } else {
            Err(Fail::Timeout(format!("{what} {name} did not arrive")))
        }
    }

    fn addresses(&self) -> Reply {
        let regions: serde_json::Map<String, Value> = self
            .regions
            .iter()
            .map(|(name, r)| {
                let mut v = json!({"kind": r.kind_name(), "base": r.base, "size": r.size});
                if let RegionKind::Mapping {
                    handle,
                    alloc_offset,
                } = &r.kind
                    && let Some(obj) = v.as_object_mut()
                {
                    obj.insert("handle".into(), json!(handle));
                    obj.insert("alloc_offset".into(), json!(alloc_offset));
                }
                (name.clone(), v)
            })
            .collect();
        let handles: serde_json::Map<String, Value> = self
            .handles
            .iter()
            .map(|(name, h)| {
                (
                    name.clone(),
                    json!({"handle": h.value, "size": h.size, "origin": h.origin}),
                )
            })
            .collect();
        let inbox = self.shared.inbox();
        let fds: Vec<&String> = inbox.fds.keys().collect();
        let blobs: Vec<&String> = inbox.blobs.keys().collect();
        Reply::ok("addresses")
            .with("regions", Value::Object(regions))
            .with("handles", Value::Object(handles))
            .with("fds", json!(fds))
            .with("blobs", json!(blobs))
    }
}

fn handle_types_opt(a: &Args) -> Result<u32, Fail> {
    match a.opt("handle-types") {
        Some(t) => driver::parse_handle_types(t)
            .ok_or_else(|| Fail::Usage(format!("unknown handle types {t:?}"))),
        None => Ok(cuda_abi::handle_type::POSIX_FILE_DESCRIPTOR),
    }
}

/// This process's PID in its own PID namespace (the last `NSpid:` field).
pub fn ns_pid() -> u32 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("NSpid:"))
                .and_then(|v| v.split_whitespace().last().map(str::to_owned))
        })
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(std::process::id)
}

/// `sleep MS`: the workload's own pause, in milliseconds.
fn sleep(a: &Args) -> Outcome {
    a.check(1, &[])?;
    let ms = parse_number(a.pos(0, "milliseconds")?)?;
    std::thread::sleep(Duration::from_millis(ms));
    Ok(Reply::ok("sleep"))
}

/// The status `exit [CODE]` asks for (0 by default).
fn exit_code(a: &Args) -> Result<i32, Fail> {
    a.check(1, &[])?;
    match a.pos_opt(0) {
        Some(c) => Ok(i32::try_from(parse_int(c)?).map_err(|_| usage("exit code out of range"))?),
        None => Ok(0),
    }
}
