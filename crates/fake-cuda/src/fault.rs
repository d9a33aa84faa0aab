//! Fault injection: `FAKE_CUDA_FAIL=cuMemCreate:2,cuMemMap:1=CUDA_ERROR_INVALID_VALUE`.
//!
//! Each comma-separated item is `NAME:N` or `NAME:N=EFFECT`: the N-th call (counting from 1) in
//! this process of the entry point NAME does EFFECT before it does anything. EFFECT is a CUDA
//! error, as a number or a `CUDA_ERROR_*` name, that the call returns (default
//! `CUDA_ERROR_OUT_OF_MEMORY`), or `die`: the process kills itself with `SIGKILL` inside the call,
//! as a participant that dies at an exact step of a protocol (no timing, no lock to race). NAME is
//! the exported symbol (`cuMemAlloc_v2`) or its base name (`cuMemAlloc`). A malformed value makes
//! `cuInit` fail with `CUDA_ERROR_INVALID_VALUE`.

use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering};

use cuda_abi::CUresult;

/// What a rule does to the call it hits.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Effect {
    /// The call returns this error.
    Fail(CUresult),
    /// The process is killed inside the call.
    Die,
}

#[derive(Debug)]
struct Rule {
    name: String,
    nth: u64,
    effect: Effect,
    calls: AtomicU64,
}

#[derive(Debug)]
struct Rules {
    rules: Vec<Rule>,
    malformed: bool,
}

static RULES: OnceLock<Rules> = OnceLock::new();

fn parse_effect(text: &str) -> Option<Effect> {
    let text = text.trim();
    if text == "die" {
        return Some(Effect::Die);
    }
    if let Ok(n) = text.parse::<u32>() {
        return Some(Effect::Fail(CUresult(n)));
    }
    (0..1000u32)
        .map(CUresult)
        .find(|code| code.name() == Some(text))
        .map(Effect::Fail)
}

fn parse(spec: &str) -> Option<Vec<Rule>> {
    let mut rules = Vec::new();
    for item in spec.split(',').map(str::trim).filter(|s| !s.is_empty()) {
        let (head, effect) = match item.split_once('=') {
            Some((head, effect)) => (head, parse_effect(effect)?),
            None => (item, Effect::Fail(CUresult::ERROR_OUT_OF_MEMORY)),
        };
        let (name, nth) = head.split_once(':')?;
        let nth: u64 = nth.trim().parse().ok().filter(|&n| n > 0)?;
        let name = name.trim();
        if name.is_empty() {
            return None;
        }
        rules.push(Rule {
            name: name.to_owned(),
            nth,
            effect,
            calls: AtomicU64::new(0),
        });
    }
    Some(rules)
}

fn rules() -> &'static Rules {
    RULES.get_or_init(|| {
        let spec = std::env::var("FAKE_CUDA_FAIL").unwrap_or_default();
        match parse(&spec) {
            Some(rules) => Rules {
                rules,
                malformed: false,
            },
            None => {
                eprintln!(
                    "fake-cuda: FAKE_CUDA_FAIL={spec:?} is malformed (want NAME:N[=CODE],...)"
                );
                Rules {
                    rules: Vec::new(),
                    malformed: true,
                }
            }
        }
    })
}

/// Whether `FAKE_CUDA_FAIL` could not be parsed (cuInit then fails).
pub(crate) fn malformed() -> bool {
    rules().malformed
}

/// Counts a call of `symbol` (base name `base`) and returns the injected failure, if this is it;
/// a `die` rule ends the process here.
pub(crate) fn check(symbol: &str, base: &str) -> Option<CUresult> {
    let rules = rules();
    let mut hit = None;
    for rule in &rules.rules {
        if rule.name == symbol || rule.name == base {
            let n = rule.calls.fetch_add(1, Ordering::Relaxed) + 1;
            if n == rule.nth && hit.is_none() {
                hit = Some((rule.effect, n));
            }
        }
    }
    match hit? {
        (Effect::Fail(code), _) => Some(code),
        (Effect::Die, n) => {
            eprintln!("fake-cuda: FAKE_CUDA_FAIL: dying in call {n} of {symbol}");
            // SAFETY: raise has no memory-safety preconditions; SIGKILL cannot be caught, so the
            // process ends here, inside the call, as if killed from outside.
            unsafe { libc::raise(libc::SIGKILL) };
            unreachable!("SIGKILL is not delivered late to the thread that raised it")
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rules_parse_names_counts_and_codes() {
        let rules =
            parse("cuMemCreate:2, cuMemMap:1=CUDA_ERROR_INVALID_VALUE,cuInit:3=999").unwrap();
        assert_eq!(rules.len(), 3);
        assert_eq!(rules[0].name, "cuMemCreate");
        assert_eq!(rules[0].nth, 2);
        assert_eq!(rules[0].effect, Effect::Fail(CUresult::ERROR_OUT_OF_MEMORY));
        assert_eq!(rules[1].effect, Effect::Fail(CUresult::ERROR_INVALID_VALUE));
        assert_eq!(rules[2].effect, Effect::Fail(CUresult::ERROR_UNKNOWN));
        assert_eq!(
            parse("cuMulticastAddDevice:2=die").unwrap()[0].effect,
            Effect::Die
        );
        assert!(parse("").unwrap().is_empty());
    }

    #[test]
    fn malformed_rules_are_refused() {
        assert!(parse("cuMemCreate").is_none());
        assert!(parse("cuMemCreate:0").is_none());
        assert!(parse(":1").is_none());
        assert!(parse("cuMemCreate:1=CUDA_ERROR_NO_SUCH_THING").is_none());
        assert!(parse("cuMemCreate:1=dies").is_none());
    }
}
