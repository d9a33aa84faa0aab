//! `cuInit`: reads the configuration, builds the driver state, publishes this process's device
//! usage and starts the checkpoint agent. The first result is final for the process, as on the
//! real driver; a child forked after initialisation is not initialised (CUDA forbids using the
//! parent's driver state in it).

use std::sync::atomic::{AtomicI32, Ordering};
use std::sync::{Mutex, PoisonError};

use cuda_abi::CUresult;

use crate::config::Config;
use crate::state::{self, Driver};
use crate::{Res, accounting, checkpoint, fault, os};

#[derive(Debug)]
enum InitState {
    NotYet,
    Done,
    Failed(CUresult),
}

static INIT: Mutex<InitState> = Mutex::new(InitState::NotYet);
/// The pid that initialised the driver (0: none). Compared with getpid() so a forked child is
/// not taken for initialised.
static INIT_PID: AtomicI32 = AtomicI32::new(0);

pub(crate) fn initialized() -> bool {
    let pid = INIT_PID.load(Ordering::Acquire);
    pid != 0 && pid == os::getpid()
}

pub(crate) fn cu_init(flags: u32) -> Res {
    if flags != 0 {
        return Err(CUresult::ERROR_INVALID_VALUE);
    }
    let mut init = INIT.lock().unwrap_or_else(PoisonError::into_inner);
    match *init {
        InitState::Done if initialized() => return Ok(()),
        InitState::Done => return Err(CUresult::ERROR_NOT_INITIALIZED),
        InitState::Failed(code) => return Err(code),
        InitState::NotYet => {}
    }
    match first_init() {
        Ok(()) => {
            *init = InitState::Done;
            INIT_PID.store(os::getpid(), Ordering::Release);
            Ok(())
        }
        Err(code) => {
            *init = InitState::Failed(code);
            Err(code)
        }
    }
}

fn first_init() -> Res {
    if fault::malformed() {
        return Err(CUresult::ERROR_INVALID_VALUE);
    }
    let config = Config::from_env()?;
    if config.devices == 0 {
        return Err(CUresult::ERROR_NO_DEVICE);
    }
    if let Err(err) = accounting::ensure_dir(&config.state_dir) {
        eprintln!(
            "fake-cuda: cannot use state directory {}: {err}",
            config.state_dir.display()
        );
        return Err(CUresult::ERROR_OPERATING_SYSTEM);
    }
    let pid = os::getpid();
    let start = os::start_token(pid).unwrap_or(0);
    let publisher = accounting::Publisher::create(&config.state_dir, pid, start, config.devices)
        .map_err(|err| {
            eprintln!("fake-cuda: cannot publish device usage: {err}");
            CUresult::ERROR_OPERATING_SYSTEM
        })?;
    // The start token at cuInit as well as the pid: processes of different PID namespaces (groups
    // run under `cuinterpose run --pid-namespace`) share pids, and may share the state directory.
    // The name is kept as it is through a checkpoint to disk and restore (CRIU restores the
    // socket), so clients match the pid and take the token as it is.
    let agent_path = config.state_dir.join(format!("agent-{pid}-{start}.sock"));
    let driver = Driver::new(config, pid, start, publisher);
    state::install(driver);
    checkpoint::agent::start(&agent_path).map_err(|err| {
        eprintln!(
            "fake-cuda: cannot start the checkpoint agent on {}: {err}",
            agent_path.display()
        );
        state::uninstall();
        CUresult::ERROR_OPERATING_SYSTEM
    })
}
