//! The common prologue of every exported entry point: fault injection, the initialisation check,
//! the sticky fault, the checkpoint gate, and the translation of `Res` into a `CUresult`.

use cuda_abi::CUresult;

use crate::checkpoint::gate;
use crate::{Res, exec, fault, init, procaddress};

/// How an entry point relates to initialisation and the checkpoint gate.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Kind {
    /// Works before `cuInit` and is never blocked: error strings, versions, `cuGetProcAddress`.
    Free,
    /// `cuInit`: blocked by the gate like any call, but needs no earlier initialisation.
    Init,
    /// Needs `cuInit` and passes the gate.
    Gated,
    /// Needs `cuInit` but is never blocked: the checkpoint calls, which act on another process.
    Control,
}

/// Runs the body of entry point `symbol`.
pub(crate) fn call(symbol: &'static str, kind: Kind, body: impl FnOnce() -> Res) -> CUresult {
    if let Some(code) = fault::check(symbol, procaddress::base_name(symbol)) {
        return code;
    }
    let result = match kind {
        Kind::Free => body(),
        // A process whose queued work faulted answers every other call with the sticky error
        // (r580's CUDA_ERROR_ILLEGAL_ADDRESS), before the gate: nothing it could do would work.
        _ if exec::poisoned() && init::initialized() => Err(exec::FAULT),
        Kind::Init => gate::enter().and_then(|_in_flight| body()),
        Kind::Control if !init::initialized() => Err(CUresult::ERROR_NOT_INITIALIZED),
        Kind::Control => body(),
        Kind::Gated => {
            if init::initialized() {
                gate::enter().and_then(|_in_flight| body())
            } else {
                Err(CUresult::ERROR_NOT_INITIALIZED)
            }
        }
    };
    match result {
        Ok(()) => CUresult::SUCCESS,
        Err(code) => code,
    }
}
