//! The busy-mode commands (`busy-loop`, `busy-ring`, `busy-nccl`, `nccl-id`, `busy-status`,
//! `busy-hold`, `busy-release`, `busy-wait`, `busy-stop`): they start and steer the threads of
//! [`crate::busy`]. The kernels are loaded at the first busy command, NCCL at the first command
//! that needs it, so that a workload that never gets busy loads neither.

use std::sync::Arc;
use std::time::Duration;

use serde_json::Value;

use super::{Exec, Fail, Outcome, state};
use crate::busy::{self, Busy, Counters, LoopSpec, NcclSpec, RING_DATA, RingSpec};
use crate::grammar::{self, Args, parse_number, usage};
use crate::kernels::Kernels;
use crate::nccl::{Nccl, UNIQUE_ID_BYTES};
use crate::reply::{Reply, kind};

/// Elements of a ring's or an all-reduce's data, unless `--elements` says.
const DEFAULT_ELEMENTS: u64 = 1024;

/// The most elements a loop covers by default (its region may be larger).
const DEFAULT_LOOP_ELEMENTS: u64 = 64 << 10;

/// How long `busy-stop` and `busy-wait` wait, unless `--timeout MS` says.
const DEFAULT_WAIT: Duration = Duration::from_secs(60);

fn with_counters(mut reply: Reply, c: &Counters) -> Reply {
    if let Value::Object(fields) = c.to_json() {
        for (key, value) in fields {
            reply = reply.with(&key, value);
        }
    }
    reply
}

impl Exec<'_> {
    fn kernels(&mut self) -> Result<Arc<Kernels>, Fail> {
        if let Some(k) = &self.kernels {
            return Ok(Arc::clone(k));
        }
        let k = Arc::new(Kernels::load(self.driver.api())?);
        self.kernels = Some(Arc::clone(&k));
        Ok(k)
    }

    fn nccl(&mut self) -> Result<Arc<Nccl>, Fail> {
        if let Some(n) = &self.nccl {
            return Ok(Arc::clone(n));
        }
        let n = Arc::new(Nccl::load().map_err(|e| Fail::State(e.to_string()))?);
        self.nccl = Some(Arc::clone(&n));
        Ok(n)
    }

    fn new_busy_name(&self, name: &str) -> Result<(), Fail> {
        if self.busy.contains_key(name) {
            return Err(state(format!("busy {name:?} is running")));
        }
        Ok(())
    }

    fn busy(&self, a: &Args) -> Result<&Busy, Fail> {
        let name = a.pos(0, "name")?;
        self.busy
            .get(name)
            .ok_or_else(|| state(format!("no busy {name:?}")))
    }

    fn timeout_opt(a: &Args) -> Result<Duration, Fail> {
        Ok(a.num_opt("timeout")?
            .map_or(DEFAULT_WAIT, Duration::from_millis))
    }

    /// An address option with room for `bytes` from it.
    fn room_for(&self, spec: &str, bytes: u64) -> Result<u64, Fail> {
        let (addr, room) = self.address(spec)?;
        if room.is_some_and(|r| r < bytes) {
            return Err(Fail::Usage(format!(
                "{spec} has room for {} bytes, {bytes} needed",
                room.unwrap_or(0)
            )));
        }
        Ok(addr)
    }

    fn insert_busy(&mut self, name: &str, started: std::io::Result<Busy>, reply: Reply) -> Outcome {
        let b = started.map_err(|e| Fail::Io(format!("cannot start the busy thread: {e}")))?;
        self.busy.insert(name.to_owned(), b);
        Ok(reply.with("name", name))
    }

    pub(super) fn busy_loop(&mut self, a: &Args) -> Outcome {
        a.check(2, &["elements"])?;
        let name = a.pos(0, "name")?;
        self.new_busy_name(name)?;
        let spec_text = a.pos(1, "region")?;
        let (_, room) = self.address(spec_text)?;
        let elements = match (a.num_opt("elements")?, room) {
            (Some(n), _) => n,
            (None, Some(room)) => (room / 4).min(DEFAULT_LOOP_ELEMENTS),
            (None, None) => return Err(usage("a literal address needs --elements").into()),
        };
        if elements == 0 {
            return Err(usage("busy-loop needs at least one element").into());
        }
        let base = self.room_for(spec_text, elements * 4)?;
        let kernels = self.kernels()?;
        let api = *self.driver.api();
        let ctx = api.ctx_current()?;
        let spec = LoopSpec { base, elements };
        let reply = Reply::ok("busy-loop")
            .with("base", base)
            .with("elements", elements);
        self.insert_busy(name, busy::start_loop(api, kernels, ctx, spec), reply)
    }

    pub(super) fn busy_ring(&mut self, a: &Args) -> Outcome {
        a.check(
            1,
            &[
                "mine",
                "prev",
                "mine-read",
                "prev-write",
                "rank",
                "prev-rank",
                "elements",
            ],
        )?;
        let name = a.pos(0, "name")?;
        self.new_busy_name(name)?;
        let elements = a.num_opt("elements")?.unwrap_or(DEFAULT_ELEMENTS).max(1);
        let bytes = RING_DATA + elements * 4;
        let need = |option: &str| {
            a.opt(option)
                .ok_or_else(|| Fail::Usage(format!("busy-ring needs --{option}")))
        };
        let mine_text = need("mine")?;
        let prev_text = need("prev")?;
        let mine = self.room_for(mine_text, bytes)?;
        let prev = self.room_for(prev_text, bytes)?;
        let mine_read = self.room_for(a.opt("mine-read").unwrap_or(mine_text), bytes)?;
        let prev_write = self.room_for(a.opt("prev-write").unwrap_or(prev_text), bytes)?;
        let number = |option: &str| -> Result<u32, Fail> {
            u32::try_from(parse_number(need(option)?)?)
                .map_err(|_| Fail::Usage(format!("--{option} is out of range")))
        };
        let spec = RingSpec {
            mine,
            mine_read,
            prev,
            prev_write,
            rank: number("rank")?,
            prev_rank: number("prev-rank")?,
            elements,
        };
        let kernels = self.kernels()?;
        let api = *self.driver.api();
        let ctx = api.ctx_current()?;
        let reply = Reply::ok("busy-ring")
            .with("mine", mine)
            .with("prev", prev)
            .with("elements", elements);
        self.insert_busy(name, busy::start_ring(api, kernels, ctx, spec), reply)
    }

    pub(super) fn nccl_id(&mut self, a: &Args) -> Outcome {
        a.check(1, &[])?;
        let name = a.pos(0, "blob")?;
        let nccl = self.nccl()?;
        let id = nccl.unique_id().map_err(|e| Fail::State(e.to_string()))?;
        self.shared
            .inbox()
            .blobs
            .insert(name.to_owned(), id.to_vec());
        Ok(Reply::ok("nccl-id")
            .with("name", name)
            .with("id", grammar::to_hex(&id)))
    }

    pub(super) fn busy_nccl(&mut self, a: &Args) -> Outcome {
        a.check(1, &["id", "ranks", "rank", "elements"])?;
        let name = a.pos(0, "name")?;
        self.new_busy_name(name)?;
        let blob = a
            .opt("id")
            .ok_or_else(|| usage("busy-nccl needs --id BLOB"))?;
        let id: [u8; UNIQUE_ID_BYTES] = {
            let inbox = self.shared.inbox();
            let bytes = inbox
                .blobs
                .get(blob)
                .ok_or_else(|| state(format!("no blob {blob:?}")))?;
            bytes
                .as_slice()
                .try_into()
                .map_err(|_| state(format!("blob {blob:?} is not a 128-byte NCCL id")))?
        };
        let number = |option: &str| -> Result<u32, Fail> {
            let text = a
                .opt(option)
                .ok_or_else(|| Fail::Usage(format!("busy-nccl needs --{option}")))?;
            u32::try_from(parse_number(text)?)
                .map_err(|_| Fail::Usage(format!("--{option} is out of range")))
        };
        let (ranks, rank) = (number("ranks")?, number("rank")?);
        if rank >= ranks {
            return Err(usage(format!("rank {rank} of {ranks}?")).into());
        }
        let elements = a.num_opt("elements")?.unwrap_or(DEFAULT_ELEMENTS).max(1);
        let spec = NcclSpec {
            id,
            ranks,
            rank,
            elements,
        };
        let kernels = self.kernels()?;
        let nccl = self.nccl()?;
        let api = *self.driver.api();
        let ctx = api.ctx_current()?;
        let reply = Reply::ok("busy-nccl")
            .with("ranks", ranks)
            .with("rank", rank);
        self.insert_busy(name, busy::start_nccl(api, kernels, nccl, ctx, spec), reply)
    }

    pub(super) fn busy_status(&mut self, a: &Args) -> Outcome {
        a.check(1, &[])?;
        let b = self.busy(a)?;
        Ok(with_counters(Reply::ok("busy-status"), &b.counters()).with("kind", b.kind()))
    }

    pub(super) fn busy_hold(&mut self, a: &Args) -> Outcome {
        a.check(2, &[])?;
        let round = parse_number(a.pos(1, "round")?)?;
        let b = self.busy(a)?;
        let hold = b.hold(round);
        Ok(with_counters(Reply::ok("busy-hold"), &b.counters()).with("hold", hold))
    }

    pub(super) fn busy_release(&mut self, a: &Args) -> Outcome {
        a.check(1, &[])?;
        let b = self.busy(a)?;
        b.release();
        Ok(with_counters(Reply::ok("busy-release"), &b.counters()))
    }

    pub(super) fn busy_wait(&mut self, a: &Args) -> Outcome {
        a.check(2, &["timeout"])?;
        let round = parse_number(a.pos(1, "round")?)?;
        let timeout = Self::timeout_opt(a)?;
        let b = self.busy(a)?;
        let c = b.wait_round(round, timeout);
        if c.passed + c.failures < round {
            return Err(Fail::Reply(Box::new(with_counters(
                Reply::fail(
                    "busy-wait",
                    kind::TIMEOUT,
                    format!("round {round} not completed"),
                ),
                &c,
            ))));
        }
        Ok(with_counters(Reply::ok("busy-wait"), &c))
    }

    pub(super) fn busy_stop(&mut self, a: &Args) -> Outcome {
        a.check(1, &["timeout"])?;
        let name = a.pos(0, "name")?.to_owned();
        let timeout = Self::timeout_opt(a)?;
        let b = self
            .busy
            .get_mut(&name)
            .ok_or_else(|| state(format!("no busy {name:?}")))?;
        match b.stop(timeout) {
            Ok(c) => {
                let kind = b.kind();
                self.busy.remove(&name);
                Ok(with_counters(Reply::ok("busy-stop"), &c)
                    .with("name", name)
                    .with("kind", kind))
            }
            Err(c) => Err(Fail::Reply(Box::new(with_counters(
                Reply::fail(
                    "busy-stop",
                    kind::TIMEOUT,
                    format!("{name} did not stop (a round waits for a peer)"),
                ),
                &c,
            )))),
        }
    }
}
