//! The workload's answer to one command: one JSON object on one line.
//!
//! ```json
//! {"ok":true,"cmd":"reserve","name":"r","base":140737488355328,"size":2097152}
//! {"ok":false,"cmd":"map","error":"CUDA_ERROR_INVALID_VALUE","code":1,"call":"cuMemMap"}
//! {"ok":false,"cmd":"verify","error":"mismatch","offset":4096,"expected":17,"actual":0}
//! ```
//!
//! `error` is the driver's name of the `CUresult` when a driver call failed (with `code` and `call`),
//! otherwise one of [`kind`]'s values.

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

/// Values of `error` that are not driver results.
pub mod kind {
    /// The command line does not follow the grammar.
    pub const USAGE: &str = "usage";
    /// The command names an object the workload does not hold, or holds under another kind.
    pub const STATE: &str = "state";
    /// `verify` found bytes that differ from the pattern.
    pub const MISMATCH: &str = "mismatch";
    /// A socket, descriptor or file operation failed.
    pub const IO: &str = "io";
    /// `wait` gave up.
    pub const TIMEOUT: &str = "timeout";
}

/// One command's result.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Reply {
    /// Whether the command did what it was asked.
    pub ok: bool,
    /// The command word.
    pub cmd: String,
    /// Why it failed: a `CUresult` name or a [`kind`] value.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// The numeric `CUresult`, when a driver call failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub code: Option<u32>,
    /// The driver entry point that failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub call: Option<String>,
    /// Human-readable detail.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// The command's results (addresses, handles, sizes...).
    #[serde(flatten)]
    pub data: Map<String, Value>,
}

impl Reply {
    /// A successful reply with no data yet.
    pub fn ok(cmd: &str) -> Reply {
        Reply {
            ok: true,
            cmd: cmd.to_owned(),
            error: None,
            code: None,
            call: None,
            message: None,
            data: Map::new(),
        }
    }

    /// A failed reply of one of the [`kind`]s.
    pub fn fail(cmd: &str, kind: &str, message: impl Into<String>) -> Reply {
        Reply {
            ok: false,
            cmd: cmd.to_owned(),
            error: Some(kind.to_owned()),
            code: None,
            call: None,
            message: Some(message.into()),
            data: Map::new(),
        }
    }

    /// A reply for a failed driver call.
    pub fn driver(cmd: &str, call: &str, name: String, code: u32) -> Reply {
        Reply {
            ok: false,
            cmd: cmd.to_owned(),
            error: Some(name),
            code: Some(code),
            call: Some(call.to_owned()),
            message: None,
            data: Map::new(),
        }
    }

    /// Adds one result field.
    pub fn with(mut self, key: &str, value: impl Into<Value>) -> Reply {
        self.data.insert(key.to_owned(), value.into());
        self
    }

    /// `ok`, or the error (`CUDA_ERROR_...`, `mismatch`...): the form scenario outcomes use.
    pub fn outcome(&self) -> String {
        if self.ok {
            "ok".to_owned()
        } else {
            self.error.clone().unwrap_or_else(|| "error".to_owned())
        }
    }

    /// An unsigned result field.
    pub fn u64(&self, key: &str) -> Option<u64> {
        self.data.get(key).and_then(Value::as_u64)
    }

    /// A string result field.
    pub fn str(&self, key: &str) -> Option<&str> {
        self.data.get(key).and_then(Value::as_str)
    }

    /// The reply as one JSON line (without the newline).
    pub fn to_line(&self) -> String {
        // A Map of JSON values with string keys always serialises.
        serde_json::to_string(self)
            .unwrap_or_else(|_| format!(r#"{{"ok":false,"cmd":"{}","error":"io"}}"#, self.cmd))
    }

    /// Parses one reply line.
    pub fn parse(line: &str) -> Result<Reply, serde_json::Error> {
        serde_json::from_str(line)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_with_flattened_data() {
        let r = Reply::ok("reserve").with("base", 4096u64).with("name", "r");
        let line = r.to_line();
        assert_eq!(
            line,
            r#"{"ok":true,"cmd":"reserve","base":4096,"name":"r"}"#
        );
        let back = Reply::parse(&line).unwrap();
        assert_eq!(back, r);
        assert_eq!(back.u64("base"), Some(4096));
        assert_eq!(back.outcome(), "ok");
    }

    #[test]
    fn driver_failure_names_the_call() {
        let r = Reply::driver("map", "cuMemMap", "CUDA_ERROR_INVALID_VALUE".into(), 1);
        let back = Reply::parse(&r.to_line()).unwrap();
        assert_eq!(back.outcome(), "CUDA_ERROR_INVALID_VALUE");
        assert_eq!(back.call.as_deref(), Some("cuMemMap"));
        assert_eq!(back.code, Some(1));
    }
}
