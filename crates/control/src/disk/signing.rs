//! Signed checkpoints: a checkpoint's digests (the manifest's of the state file and the data
//! files, `images.b3`'s of the CRIU images) are only as good as the files that hold them, which
//! anyone who can write the directory can edit together with what they describe. So a
//! checkpoint carries a MAC over the manifest and the image digest list ([`SIGNATURE_FILE`]):
//! keyed BLAKE3 with a 256-bit key of the node or of the cluster (the key file,
//! `CUINTERPOSE_SIGNING_KEY`). A restore checks it before it trusts anything else the directory
//! holds, and refuses a checkpoint that is unsigned or signed with another key, or whose manifest
//! or digest list changed since, unless told `--allow-unsigned`.
//!
//! The key file holds 64 hex digits; it must be a regular file owned by the tool's user that no
//! one else can read or write (as ssh requires of a private key). The first `checkpoint` that
//! finds none makes one with a random key, in a directory only its user can enter. Nodes that
//! restore each other's checkpoints share one key file.

use super::{IMAGE_DIGESTS, damaged};
use crate::ControlError;
use crate::safefs;
use crate::{refuse, state_error};
use protocol::manifest::MANIFEST_FILE_NAME;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

/// The signature of a checkpoint, beside its manifest: `<format> <key id> <mac>` on one line.
pub const SIGNATURE_FILE: &str = "manifest.sig";
const FORMAT: &str = "cuinterpose-checkpoint-mac-v1";
/// Largest key file, signature and signed file read.
const KEY_FILE_LIMIT: u64 = 256;
const SIGNATURE_LIMIT: u64 = 1024;
const SIGNED_LIMIT: u64 = 64 << 20;

/// A signing key, read from its file.
pub(crate) struct Key {
    bytes: [u8; 32],
    path: PathBuf,
}

impl Key {
    /// The key in the file `path`: a regular file (not a link), owned by the tool's user, that no
    /// one else may read or write, holding 64 hex digits.
    pub(crate) fn load(path: &Path) -> Result<Key, String> {
        let file = safefs::open_regular(path).map_err(|e| e.to_string())?;
        let meta = file.metadata().map_err(|e| e.to_string())?;
        let uid = rustix::process::geteuid().as_raw();
        if meta.uid() != uid {
            return Err(format!("belongs to uid {}, not to uid {uid}", meta.uid()));
        }
        if meta.mode() & 0o077 != 0 {
            return Err(format!(
                "can be read or written by other users (mode {:o}); chmod 600 it",
                meta.mode() & 0o7777
            ));
        }
        let mut text = String::new();
        std::io::Read::read_to_string(&mut std::io::Read::take(file, KEY_FILE_LIMIT), &mut text)
            .map_err(|e| e.to_string())?;
        let bytes = parse_hex32(text.trim())
            .ok_or_else(|| "does not hold a key (64 hex digits)".to_string())?;
        Ok(Key {
            bytes,
            path: path.to_path_buf(),
        })
    }

    /// [`Key::load`], or a new random key written to `path` when nothing is there (its
    /// directory made private if missing). Two runs making one at once agree on the first.
    pub(crate) fn load_or_create(path: &Path) -> Result<Key, String> {
        match std::fs::symlink_metadata(path) {
            Ok(_) => return Key::load(path),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(e.to_string()),
        }
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty())
            && !dir.exists()
        {
            std::fs::DirBuilder::new()
                .recursive(true)
                .mode(0o700)
                .create(dir)
                .map_err(|e| format!("making {}: {e}", dir.display()))?;
        }
        let mut bytes = [0u8; 32];
        rustix::rand::getrandom(&mut bytes, rustix::rand::GetRandomFlags::empty())
            .map_err(|e| format!("getrandom: {e}"))?;
        let text: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
        // Written whole under a temporary name, then linked: never a partial key at `path`, and
        // a key another run linked first wins.
        let temp = path.with_extension(format!("tmp-{}", std::process::id()));
        let written = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&temp)
            .and_then(|mut f| {
                std::io::Write::write_all(&mut f, format!("{text}\n").as_bytes())?;
                f.sync_all()
            })
            .and_then(|()| match std::fs::hard_link(&temp, path) {
                Err(e) if e.kind() != std::io::ErrorKind::AlreadyExists => Err(e),
                _ => Ok(()),
            });
        let _ = std::fs::remove_file(&temp);
        written.map_err(|e| format!("writing a new key: {e}"))?;
        tracing::warn!(key = %path.display(), "made a new checkpoint signing key");
        Key::load(path)
    }

    /// A short name of the key that says nothing of it: 8 bytes of its keyed hash of a constant.
    fn id(&self) -> String {
        blake3::keyed_hash(&self.bytes, b"cuinterpose key id")
            .as_bytes()
            .iter()
            .take(8)
            .map(|b| format!("{b:02x}"))
            .collect()
    }

    /// The MAC of a checkpoint's manifest and image digest list, each with its length.
    fn mac(&self, manifest: &[u8], digests: &[u8]) -> blake3::Hash {
        let mut hasher = blake3::Hasher::new_keyed(&self.bytes);
        hasher.update(FORMAT.as_bytes()).update(&[0]);
        for part in [manifest, digests] {
            hasher
                .update(&(part.len() as u64).to_le_bytes())
                .update(part);
        }
        hasher.finalize()
    }
}

fn parse_hex32(text: &str) -> Option<[u8; 32]> {
    let mut out = [0u8; 32];
    if text.len() != 64 {
        return None;
    }
    for (i, byte) in out.iter_mut().enumerate() {
        *byte = u8::from_str_radix(text.get(2 * i..2 * i + 2)?, 16).ok()?;
    }
    Some(out)
}

/// The signed files of the checkpoint in `dir`, as read once: what a restore goes on with.
pub(crate) struct Signed {
    pub manifest: Vec<u8>,
    pub digests: Vec<u8>,
}

fn read_signed(dir: &Path) -> Result<Signed, ControlError> {
    let read = |name: &str| {
        let path = dir.join(name);
        safefs::read_regular(&path, SIGNED_LIMIT).map_err(|e| damaged(&path, e))
    };
    Ok(Signed {
        manifest: read(MANIFEST_FILE_NAME)?,
        digests: read(IMAGE_DIGESTS)?,
    })
}

/// Signs the checkpoint in `dir` (its manifest and image digest list written) with the key at
/// `key_path`, made if there is none.
pub(super) fn sign(dir: &Path, key_path: &Path) -> Result<(), ControlError> {
    let key = Key::load_or_create(key_path).map_err(|e| {
        refuse(
            "checkpoint",
            format!(
                "cannot be signed: the key {} {e} (CUINTERPOSE_SIGNING_KEY names another)",
                key_path.display()
            ),
        )
    })?;
    let signed = read_signed(dir)?;
    let mac = key.mac(&signed.manifest, &signed.digests);
    let line = format!("{FORMAT} {} {}\n", key.id(), mac.to_hex());
    let path = dir.join(SIGNATURE_FILE);
    transport::files::write_atomically(&path, line.as_bytes()).map_err(|e| state_error(&path, e))
}

/// Reads the checkpoint in `dir`'s manifest and image digest list and checks them against its
/// signature with the key at `key_path`: a refusal when it is unsigned, signed with another key
/// or altered since, unless `allow_unsigned` (then only a warning).
pub(crate) fn verify(
    dir: &Path,
    key_path: &Path,
    allow_unsigned: bool,
) -> Result<Signed, ControlError> {
    let signed = read_signed(dir)?;
    match check(dir, key_path, &signed) {
        Ok(()) => Ok(signed),
        Err(problem) if allow_unsigned => {
            tracing::warn!(dir = %dir.display(), %problem, "restoring without a valid signature (--allow-unsigned)");
            Ok(signed)
        }
        Err(problem) => Err(refuse(
            &format!("checkpoint {}", dir.display()),
            format!(
                "{problem}; restore it with --allow-unsigned only if you trust where it comes \
                 from"
            ),
        )),
    }
}

fn check(dir: &Path, key_path: &Path, signed: &Signed) -> Result<(), String> {
    let path = dir.join(SIGNATURE_FILE);
    let text = match safefs::read_regular(&path, SIGNATURE_LIMIT) {
        Ok(bytes) => {
            String::from_utf8(bytes).map_err(|_| format!("{SIGNATURE_FILE} is not text"))?
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return Err(format!("is not signed (no {SIGNATURE_FILE})"));
        }
        Err(e) => return Err(format!("{SIGNATURE_FILE} {e}")),
    };
    let fields: Vec<&str> = text.split_whitespace().collect();
    let [format, id, mac] = fields.as_slice() else {
        return Err(format!("{SIGNATURE_FILE} is malformed"));
    };
    if *format != FORMAT {
        return Err(format!(
            "{SIGNATURE_FILE} is of format {format:?}, not {FORMAT}"
        ));
    }
    let key = Key::load(key_path).map_err(|e| {
        format!(
            "its signature cannot be checked: the key {} {e}",
            key_path.display()
        )
    })?;
    if *id != key.id() {
        return Err(format!(
            "is signed with key {id}, not with this machine's key {} ({})",
            key.id(),
            key.path.display()
        ));
    }
    let expected =
        blake3::Hash::from_hex(mac).map_err(|_| format!("{SIGNATURE_FILE} is malformed"))?;
    // blake3::Hash compares in constant time.
    if key.mac(&signed.manifest, &signed.digests) != expected {
        return Err(format!(
            "its {MANIFEST_FILE_NAME} or {IMAGE_DIGESTS} changed after it was signed (the \
             signature does not match)"
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn a_signed_checkpoint_verifies_and_any_change_or_other_key_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let keys = tempfile::tempdir().unwrap();
        let key = keys.path().join("node/checkpoint.key");
        std::fs::write(dir.path().join(MANIFEST_FILE_NAME), b"{\"m\":1}").unwrap();
        std::fs::write(dir.path().join(IMAGE_DIGESTS), b"abc  images/x.img\n").unwrap();
        let unsigned = verify(dir.path(), &key, false).err().unwrap().to_string();
        assert!(unsigned.contains("is not signed"), "{unsigned}");
        assert!(verify(dir.path(), &key, true).is_ok());

        sign(dir.path(), &key).unwrap();
        let mode = std::fs::metadata(&key).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
        let signed = verify(dir.path(), &key, false).unwrap();
        assert_eq!(signed.manifest, b"{\"m\":1}");

        std::fs::write(dir.path().join(IMAGE_DIGESTS), b"abd  images/x.img\n").unwrap();
        let altered = verify(dir.path(), &key, false).err().unwrap().to_string();
        assert!(altered.contains("changed after it was signed"), "{altered}");
        std::fs::write(dir.path().join(IMAGE_DIGESTS), b"abc  images/x.img\n").unwrap();
        verify(dir.path(), &key, false).unwrap();

        let other = keys.path().join("other.key");
        Key::load_or_create(&other).unwrap();
        let wrong = verify(dir.path(), &other, false).err().unwrap().to_string();
        assert!(wrong.contains("is signed with key"), "{wrong}");

        std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o644)).unwrap();
        let loose = verify(dir.path(), &key, false).err().unwrap().to_string();
        assert!(loose.contains("chmod 600"), "{loose}");
    }
}
