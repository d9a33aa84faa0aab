//! The digest list of a checkpoint's CRIU images: written after the dump, checked before a
//! restore (CRIU itself does not notice a truncated or edited page image).

use super::{IMAGES_DIR, damaged};
use crate::ControlError;
use crate::criu;
use crate::progress::Progress;
use crate::state_error;
use std::path::Path;

/// Name of the image digest list in a checkpoint directory: `b3sum` format
/// (`<64 hex>  images/<file>` per image file, sorted, BLAKE3), so `b3sum -c` checks it too.
pub const IMAGE_DIGESTS: &str = "images.b3";

/// Files at least this large are hashed one at a time by BLAKE3's own parallel hashing over a
/// memory map (all cores on one file); smaller ones are hashed whole files per thread. A process's
/// page image holds its memory (gigabytes next to pinned host memory) while most other images are a
/// few KiB, so hashing files per thread alone leaves one thread on the big page image.
const PARALLEL_HASH_BYTES: u64 = 64 << 20;

/// The digest list of every CRIU image file in `images`; each file's bytes go to `progress` once
/// it is hashed.
pub(super) fn digest_images(
    images: &Path,
    progress: &dyn Progress,
) -> Result<String, ControlError> {
    let mut files: Vec<(String, u64)> = Vec::new();
    for entry in std::fs::read_dir(images).map_err(|e| state_error(images, e))? {
        let entry = entry.map_err(|e| state_error(images, e))?;
        let Ok(name) = entry.file_name().into_string() else {
            continue;
        };
        if !criu::is_image(&name) {
            continue;
        }
        let bytes = entry
            .metadata()
            .map_err(|e| state_error(&entry.path(), e))?
            .len();
        files.push((name, bytes));
    }
    files.sort();
    let mut digests: std::collections::BTreeMap<&str, String> = std::collections::BTreeMap::new();
    let (big, small): (Vec<_>, Vec<_>) = files
        .iter()
        .partition(|(_, bytes)| *bytes >= PARALLEL_HASH_BYTES);
    for (name, bytes) in big {
        let path = images.join(name);
        // Checked on the open descriptor, and hashed through it: blake3 opens the path it is
        // given, which /proc/self/fd/N makes this very file.
        let file = crate::safefs::open_regular(&path).map_err(|e| state_error(&path, e))?;
        let through = std::path::PathBuf::from(format!(
            "/proc/self/fd/{}",
            std::os::fd::AsRawFd::as_raw_fd(&file)
        ));
        let mut hasher = blake3::Hasher::new();
        hasher
            .update_mmap_rayon(&through)
            .map_err(|e| state_error(&path, e))?;
        drop(file);
        digests.insert(name, hasher.finalize().to_hex().to_string());
        progress.advance(*bytes);
    }
    let threads = std::thread::available_parallelism()
        .map_or(1, |n| n.get())
        .min(small.len().max(1));
    // Each worker hashes every `threads`-th file; the digests are taken in the files' order, so
    // the first error is the first file's.
    let workers: Vec<usize> = (0..threads).collect();
    let mut hashed = Vec::with_capacity(small.len());
    for worker in crate::parallel::for_each("digest", &workers, |&t| {
        Ok((t..small.len())
            .step_by(threads)
            .map(|i| {
                let (name, bytes) = small[i];
                let digest = file_blake3(&images.join(name));
                progress.advance(*bytes);
                (i, digest)
            })
            .collect::<Vec<_>>())
    }) {
        hashed.extend(worker?);
    }
    hashed.sort_by_key(|(i, _)| *i);
    for (i, digest) in hashed {
        digests.insert(small[i].0.as_str(), digest?);
    }
    let mut list = String::new();
    for (name, digest) in digests {
        list.push_str(&format!("{digest}  {IMAGES_DIR}/{name}\n"));
    }
    Ok(list)
}

/// BLAKE3 of a small file, read through in one thread.
fn file_blake3(path: &Path) -> Result<String, ControlError> {
    let mut file = crate::safefs::open_regular(path).map_err(|e| state_error(path, e))?;
    let mut hasher = blake3::Hasher::new();
    hasher
        .update_reader(&mut file)
        .map_err(|e| state_error(path, e))?;
    Ok(hasher.finalize().to_hex().to_string())
}

/// Checks the images against the digest list written at checkpoint: the same set of image files,
/// each with its recorded BLAKE3 digest. CRIU itself does not notice a truncated or edited page image.
/// `recorded`: the list's bytes, read (and checked against the signature) by the caller.
pub(super) fn verify_images(
    dir: &Path,
    recorded: &[u8],
    progress: &dyn Progress,
) -> Result<(), ControlError> {
    let list_path = dir.join(IMAGE_DIGESTS);
    let recorded = String::from_utf8(recorded.to_vec()).map_err(|e| damaged(&list_path, e))?;
    let images = dir.join(IMAGES_DIR);
    let found = digest_images(&images, progress).map_err(|e| damaged(&images, e))?;
    if found == recorded {
        return Ok(());
    }
    let parse = |text: &str| -> std::collections::BTreeMap<String, String> {
        text.lines()
            .filter_map(|l| l.split_once("  "))
            .map(|(digest, name)| (name.to_string(), digest.to_string()))
            .collect()
    };
    let (recorded, found) = (parse(&recorded), parse(&found));
    let mut problems = Vec::new();
    for (name, digest) in &recorded {
        match found.get(name) {
            None => problems.push(format!("{name} is missing")),
            Some(d) if d != digest => problems.push(format!("{name} differs from its digest")),
            Some(_) => {}
        }
    }
    for name in found.keys().filter(|n| !recorded.contains_key(*n)) {
        problems.push(format!("{name} was not part of the checkpoint"));
    }
    if problems.is_empty() {
        problems.push(format!("{IMAGE_DIGESTS} is malformed"));
    }
    Err(damaged(
        dir,
        format!(
            "CRIU images do not match {IMAGE_DIGESTS}: {}",
            problems.join(", ")
        ),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Seek, SeekFrom, Write};

    /// Counts the bytes reported as hashed.
    #[derive(Debug, Default)]
    struct Counted(std::sync::atomic::AtomicU64);
    impl Progress for Counted {
        fn advance(&self, bytes: u64) {
            self.0
                .fetch_add(bytes, std::sync::atomic::Ordering::Relaxed);
        }
    }

    /// A checkpoint directory with one page image above [`PARALLEL_HASH_BYTES`] (sparse, one byte
    /// written near its end) and two small images, plus a file that is not an image.
    fn checkpoint_dir() -> tempfile::TempDir {
        let dir = tempfile::tempdir().expect("tempdir");
        let images = dir.path().join(IMAGES_DIR);
        std::fs::create_dir(&images).expect("images dir");
        let mut big = std::fs::File::create(images.join("pages-1.img")).expect("big image");
        big.set_len(PARALLEL_HASH_BYTES + 4096 + 17).expect("size");
        big.seek(SeekFrom::Start(PARALLEL_HASH_BYTES + 100))
            .expect("seek");
        big.write_all(b"page bytes").expect("write");
        std::fs::write(images.join("core-1.img"), b"core").expect("small image");
        std::fs::write(images.join("mm-1.img"), b"").expect("empty image");
        std::fs::write(images.join("dump.log"), b"not an image").expect("log");
        dir
    }

    #[test]
    fn the_list_is_b3sum_format_with_every_image_digested_by_both_paths() {
        let dir = checkpoint_dir();
        let images = dir.path().join(IMAGES_DIR);
        let counted = Counted::default();
        let list = digest_images(&images, &counted).expect("digest");
        assert_eq!(
            counted.0.load(std::sync::atomic::Ordering::Relaxed),
            crate::criu::directory_bytes(&images),
            "every image's bytes reach the progress bar"
        );
        let expected: String = ["core-1.img", "mm-1.img", "pages-1.img"]
            .iter()
            .map(|name| {
                let bytes = std::fs::read(images.join(name)).expect("read");
                format!("{}  images/{name}\n", blake3::hash(&bytes).to_hex())
            })
            .collect();
        assert_eq!(list, expected);
    }

    #[test]
    fn a_changed_byte_in_the_big_image_is_refused_by_name() {
        let dir = checkpoint_dir();
        let images = dir.path().join(IMAGES_DIR);
        let list = digest_images(&images, &crate::progress::Quiet).expect("digest");
        verify_images(dir.path(), list.as_bytes(), &crate::progress::Quiet)
            .expect("intact checkpoint verifies");
        let mut big = std::fs::OpenOptions::new()
            .write(true)
            .open(images.join("pages-1.img"))
            .expect("open");
        big.seek(SeekFrom::Start(3)).expect("seek");
        big.write_all(b"x").expect("write");
        let refusal = verify_images(dir.path(), list.as_bytes(), &crate::progress::Quiet)
            .expect_err("damage refused")
            .to_string();
        assert!(
            refusal.contains("images/pages-1.img differs from its digest"),
            "{refusal}"
        );
    }
}
