//! The digest list of a checkpoint's CRIU images: written after the dump, checked before a
//! restore (CRIU itself does not notice a truncated or edited page image).

use super::{IMAGES_DIR, damaged, state_error};
use crate::ControlError;
use crate::criu;
use std::path::Path;

/// Name of the image digest list in a checkpoint directory: `sha256sum` format
/// (`<64 hex>  images/<file>` per image file, sorted), so `sha256sum -c` checks it too.
pub const IMAGE_DIGESTS: &str = "images.sha256";

/// The digest list of every CRIU image file in `images`.
pub(super) fn digest_images(images: &Path) -> Result<String, ControlError> {
    let mut names: Vec<String> = std::fs::read_dir(images)
        .map_err(|e| state_error(images, e))?
        .flatten()
        .filter_map(|e| e.file_name().into_string().ok())
        .filter(|n| criu::is_image(n))
        .collect();
    names.sort();
    // The page images (one or more per process) hold gigabytes on a GPU: hash them on as many
    // threads as there are cores.
    let threads = std::thread::available_parallelism()
        .map_or(1, |n| n.get())
        .min(names.len().max(1));
    let mut digests: Vec<Option<Result<String, ControlError>>> =
        (0..names.len()).map(|_| None).collect();
    std::thread::scope(|scope| {
        // Round robin, so that the page images (adjacent once sorted) land on different threads.
        let handles: Vec<_> = (0..threads)
            .map(|t| {
                let names = &names;
                scope.spawn(move || {
                    (t..names.len())
                        .step_by(threads)
                        .map(|i| (i, file_sha256(&images.join(&names[i]))))
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        for handle in handles {
            for (i, digest) in handle.join().unwrap_or_default() {
                if let Some(slot) = digests.get_mut(i) {
                    *slot = Some(digest);
                }
            }
        }
    });
    let mut list = String::new();
    for (name, digest) in names.iter().zip(digests) {
        // A slot left empty is a thread that panicked.
        let digest = digest
            .unwrap_or_else(|| Err(state_error(images, crate::FileError::DigestThreadPanicked)))?;
        list.push_str(&format!("{digest}  {IMAGES_DIR}/{name}\n"));
    }
    Ok(list)
}

/// SHA-256 of a file, read in pieces (images hold the processes' memory: gigabytes on a GPU).
fn file_sha256(path: &Path) -> Result<String, ControlError> {
    use sha2::Digest;
    use std::io::Read;
    let mut file = std::fs::File::open(path).map_err(|e| state_error(path, e))?;
    let mut hasher = sha2::Sha256::new();
    let mut buffer = vec![0u8; 1 << 20];
    loop {
        let n = file.read(&mut buffer).map_err(|e| state_error(path, e))?;
        if n == 0 {
            break;
        }
        hasher.update(buffer.get(..n).unwrap_or_default());
    }
    Ok(hasher
        .finalize()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect())
}

/// Checks the images against the digest list written at checkpoint: the same set of image files,
/// each with its recorded SHA-256. CRIU itself does not notice a truncated or edited page image.
pub(super) fn verify_images(dir: &Path) -> Result<(), ControlError> {
    let list_path = dir.join(IMAGE_DIGESTS);
    let recorded =
        transport::files::read_bounded(&list_path, 16 << 20).map_err(|e| damaged(&list_path, e))?;
    let recorded = String::from_utf8(recorded).map_err(|e| damaged(&list_path, e))?;
    let images = dir.join(IMAGES_DIR);
    let found = digest_images(&images).map_err(|e| damaged(&images, e))?;
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
