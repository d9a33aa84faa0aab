//! Tokens of a command line: positional words and `--options`.
//!
//! A command line is whitespace-separated words; `#` starts a comment. Words starting with `--` are
//! options: each command declares which of its options are flags (no value); every other option
//! takes the next word as its value and may repeat. Numbers are decimal or `0x` hexadecimal, with an
//! optional binary suffix `K`, `M`, `G`, `T` (`2M` = 2097152).

use std::fmt;

/// Why a command line does not parse.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UsageError(pub String);

impl fmt::Display for UsageError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for UsageError {}

/// Builds a [`UsageError`].
pub fn usage(message: impl Into<String>) -> UsageError {
    UsageError(message.into())
}

/// A parsed command line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Args {
    /// The command word.
    pub command: String,
    positional: Vec<String>,
    options: Vec<(String, Option<String>)>,
}

/// Strips a comment and surrounding blanks; `None` for a line with no command.
pub fn significant(line: &str) -> Option<&str> {
    let line = match line.find('#') {
        Some(i) => &line[..i],
        None => line,
    };
    let line = line.trim();
    (!line.is_empty()).then_some(line)
}

impl Args {
    /// Splits `line`; `flags` lists the options of this command that take no value. The command
    /// word must already be known to pick `flags`, so callers use [`command_word`] first.
    pub fn parse(line: &str, flags: &[&str]) -> Result<Args, UsageError> {
        let mut words = line.split_whitespace();
        let command = words
            .next()
            .ok_or_else(|| usage("empty command"))?
            .to_owned();
        let mut positional = Vec::new();
        let mut options = Vec::new();
        while let Some(word) = words.next() {
            if let Some(name) = word.strip_prefix("--") {
                if flags.contains(&name) {
                    options.push((name.to_owned(), None));
                } else {
                    let value = words
                        .next()
                        .ok_or_else(|| usage(format!("--{name} needs a value")))?;
                    options.push((name.to_owned(), Some(value.to_owned())));
                }
            } else {
                positional.push(word.to_owned());
            }
        }
        Ok(Args {
            command,
            positional,
            options,
        })
    }

    /// The `index`th positional word, required.
    pub fn pos(&self, index: usize, what: &str) -> Result<&str, UsageError> {
        self.positional
            .get(index)
            .map(String::as_str)
            .ok_or_else(|| usage(format!("{}: missing {what}", self.command)))
    }

    /// The `index`th positional word, if given.
    pub fn pos_opt(&self, index: usize) -> Option<&str> {
        self.positional.get(index).map(String::as_str)
    }

    /// The number of positional words.
    pub fn positional_count(&self) -> usize {
        self.positional.len()
    }

    /// The last value of option `--name`.
    pub fn opt(&self, name: &str) -> Option<&str> {
        self.options
            .iter()
            .rev()
            .find(|(n, _)| n == name)
            .and_then(|(_, v)| v.as_deref())
    }

    /// Every value of a repeatable option, in order.
    pub fn all(&self, name: &str) -> Vec<&str> {
        self.options
            .iter()
            .filter(|(n, _)| n == name)
            .filter_map(|(_, v)| v.as_deref())
            .collect()
    }

    /// Whether flag `--name` is present.
    pub fn flag(&self, name: &str) -> bool {
        self.options.iter().any(|(n, v)| n == name && v.is_none())
    }

    /// Refuses options and positional words the command does not know.
    pub fn check(&self, max_positional: usize, known: &[&str]) -> Result<(), UsageError> {
        if self.positional.len() > max_positional {
            return Err(usage(format!(
                "{}: unexpected argument {:?}",
                self.command,
                self.positional
                    .get(max_positional)
                    .cloned()
                    .unwrap_or_default()
            )));
        }
        for (name, _) in &self.options {
            if !known.contains(&name.as_str()) {
                return Err(usage(format!("{}: unknown option --{name}", self.command)));
            }
        }
        Ok(())
    }

    /// Option `--name` as a number, if present.
    pub fn num_opt(&self, name: &str) -> Result<Option<u64>, UsageError> {
        self.opt(name).map(parse_number).transpose()
    }
}

/// The first word of a line (the command), if any.
pub fn command_word(line: &str) -> Option<&str> {
    line.split_whitespace().next()
}

/// Parses `123`, `0x1f`, `2M`, `0x10K`.
pub fn parse_number(text: &str) -> Result<u64, UsageError> {
    let bad = || usage(format!("not a number: {text:?}"));
    let (body, shift) = match text.as_bytes().last() {
        Some(b'K' | b'k') => (&text[..text.len() - 1], 10),
        Some(b'M' | b'm') => (&text[..text.len() - 1], 20),
        Some(b'G' | b'g') => (&text[..text.len() - 1], 30),
        Some(b'T' | b't') => (&text[..text.len() - 1], 40),
        _ => (text, 0),
    };
    let value = match body.strip_prefix("0x").or_else(|| body.strip_prefix("0X")) {
        Some(hex) => u64::from_str_radix(hex, 16).map_err(|_| bad())?,
        None => body.parse::<u64>().map_err(|_| bad())?,
    };
    value.checked_mul(1u64 << shift).ok_or_else(bad)
}

/// Parses a signed decimal (device ordinals, descriptors, exit codes).
pub fn parse_int(text: &str) -> Result<i64, UsageError> {
    text.parse::<i64>()
        .map_err(|_| usage(format!("not an integer: {text:?}")))
}

/// Hexadecimal text of bytes (IPC handles, fabric handles travel this way).
pub fn to_hex(bytes: &[u8]) -> String {
    use std::fmt::Write as _;
    let mut s = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        let _ = write!(s, "{b:02x}");
    }
    s
}

/// Bytes from hexadecimal text.
pub fn from_hex(text: &str) -> Result<Vec<u8>, UsageError> {
    if !text.len().is_multiple_of(2) {
        return Err(usage("odd number of hex digits"));
    }
    (0..text.len())
        .step_by(2)
        .map(|i| {
            text.get(i..i + 2)
                .and_then(|d| u8::from_str_radix(d, 16).ok())
                .ok_or_else(|| usage("bad hex digit"))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers_take_hex_and_binary_suffixes() {
        assert_eq!(parse_number("123").unwrap(), 123);
        assert_eq!(parse_number("0x1f").unwrap(), 31);
        assert_eq!(parse_number("2M").unwrap(), 2 << 20);
        assert_eq!(parse_number("0x10K").unwrap(), 16 << 10);
        assert_eq!(parse_number("1T").unwrap(), 1 << 40);
        assert!(parse_number("").is_err());
        assert!(parse_number("M").is_err());
        assert!(parse_number("12x").is_err());
        assert!(parse_number("99999999999999T").is_err());
    }

    #[test]
    fn options_flags_and_positionals() {
        let a = Args::parse(
            "set-access m+4K 2M --device 0 --device 1:r --read-only",
            &["read-only"],
        )
        .unwrap();
        assert_eq!(a.command, "set-access");
        assert_eq!(a.pos(0, "address").unwrap(), "m+4K");
        assert_eq!(a.pos_opt(1), Some("2M"));
        assert_eq!(a.all("device"), vec!["0", "1:r"]);
        assert!(a.flag("read-only"));
        assert!(a.check(2, &["device", "read-only"]).is_ok());
        assert!(a.check(1, &["device", "read-only"]).is_err());
        assert!(a.check(2, &["device"]).is_err());
        assert!(Args::parse("map a --size", &[]).is_err());
    }

    #[test]
    fn comments_and_blank_lines_are_not_commands() {
        assert_eq!(significant("  # nothing"), None);
        assert_eq!(significant(""), None);
        assert_eq!(significant(" create a 2M # the first"), Some("create a 2M"));
    }

    #[test]
    fn hex_round_trips() {
        let bytes = [0u8, 1, 0xab, 0xff];
        assert_eq!(to_hex(&bytes), "0001abff");
        assert_eq!(from_hex("0001abff").unwrap(), bytes);
        assert!(from_hex("abc").is_err());
        assert!(from_hex("zz").is_err());
    }
}
