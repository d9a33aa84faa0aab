//! What the tool reads out of CRIU's images: the link remaps of a dump.
//!
//! A file that a process holds open (or has mapped) under a name that was deleted, while the file
//! still has another name, is dumped by `criu dump --link-remap` as a hard link CRIU makes next to
//! the deleted name (`link_remap.<id>`); `criu restore` links the file back under its old name
//! through it and then removes it. glibc's `sem_open` creates every named POSIX semaphore this way
//! (a temporary name, linked to the final one, then unlinked), so every Python multiprocessing
//! lock of a PyTorch job is such a file. These links are not part of the images: a checkpoint is
//! only restorable while they exist, so the tool lists them in the manifest and keeps them through
//! a restore (control::disk).
//!
//! Image layout (CRIU's `images/*.proto`, `criu/include/magic.h`): two little-endian u32 magics
//! (CRIU's common magic, then the image's), then entries, each a little-endian u32 length and a
//! protobuf message of that length. Only the fields read here are declared; prost skips the rest.

use std::collections::BTreeMap;
use std::path::Path;

use super::CriuError;

/// The first magic of every image but the inventory.
const IMG_COMMON_MAGIC: u32 = 0x5456_4319;
/// `files.img`: one `FileEntry` per file object of the tree.
const FILES_MAGIC: u32 = 0x5630_3138;
/// `remap-fpath.img`: one `RemapFilePathEntry` per remapped file.
const REMAP_FPATH_MAGIC: u32 = 0x5913_3954;
/// Image files read here are small (a few entries per open file); anything bigger is not CRIU's.
const MAX_IMAGE_BYTES: u64 = 64 << 20;

/// `fd_types.REG` of `fdinfo.proto`.
const FD_TYPE_REG: i32 = 1;
/// `remap_type.LINKED` of `remap-file-path.proto`.
const REMAP_TYPE_LINKED: i32 = 0;

/// `file_entry` of `fdinfo.proto` (type, id, reg).
#[derive(Clone, PartialEq, prost::Message)]
struct FileEntry {
    #[prost(int32, required, tag = "1")]
    kind: i32,
    #[prost(uint32, required, tag = "2")]
    id: u32,
    #[prost(message, optional, tag = "3")]
    reg: Option<RegFileEntry>,
}

/// `reg_file_entry` of `regfile.proto`: only the path.
#[derive(Clone, PartialEq, prost::Message)]
struct RegFileEntry {
    #[prost(string, required, tag = "6")]
    name: String,
}

/// `remap_file_path_entry` of `remap-file-path.proto`.
#[derive(Clone, PartialEq, prost::Message)]
struct RemapFilePathEntry {
    #[prost(uint32, required, tag = "1")]
    orig_id: u32,
    #[prost(uint32, required, tag = "2")]
    remap_id: u32,
    /// Absent in images of CRIU before 1.6, which CRIU 4 no longer writes.
    #[prost(int32, optional, tag = "3")]
    remap_type: Option<i32>,
}

/// The link remaps of the dump in `images`: absolute paths in the dumped tree's mount namespace,
/// sorted. A dump without `remap-fpath.img` has none.
pub fn link_remaps(images: &Path) -> Result<Vec<String>, CriuError> {
    let remap_path = images.join("remap-fpath.img");
    if std::fs::symlink_metadata(&remap_path).is_err() {
        return Ok(Vec::new());
    }
    let remaps: Vec<RemapFilePathEntry> = read_entries(&remap_path, REMAP_FPATH_MAGIC)?;
    let linked: Vec<u32> = remaps
        .iter()
        .filter(|r| r.remap_type == Some(REMAP_TYPE_LINKED))
        .map(|r| r.remap_id)
        .collect();
    if linked.is_empty() {
        return Ok(Vec::new());
    }
    let files_path = images.join("files.img");
    let names: BTreeMap<u32, String> = read_entries::<FileEntry>(&files_path, FILES_MAGIC)?
        .into_iter()
        .filter(|f| f.kind == FD_TYPE_REG)
        .filter_map(|f| Some((f.id, f.reg?.name)))
        .collect();
    let mut paths = linked
        .iter()
        .map(|id| {
            let name = names.get(id).ok_or_else(|| CriuError::Image {
                path: files_path.clone(),
                message: format!("link remap {id:#x} names no regular file"),
            })?;
            // CRIU writes the path relative to the namespace root, with or without the slash.
            Ok(format!("/{}", name.trim_start_matches('/')))
        })
        .collect::<Result<Vec<String>, CriuError>>()?;
    paths.sort();
    paths.dedup();
    Ok(paths)
}

/// Every entry of one image file, after checking both magics.
fn read_entries<M: prost::Message + Default>(path: &Path, magic: u32) -> Result<Vec<M>, CriuError> {
    let bad = |message: String| CriuError::Image {
        path: path.to_path_buf(),
        message,
    };
    let bytes =
        crate::safefs::read_regular(path, MAX_IMAGE_BYTES).map_err(|e| bad(e.to_string()))?;
    let mut rest = bytes.as_slice();
    let take_u32 = |rest: &mut &[u8], what: &str| -> Result<u32, CriuError> {
        let (word, tail) = rest
            .split_first_chunk::<4>()
            .ok_or_else(|| bad(format!("truncated {what}")))?;
        *rest = tail;
        Ok(u32::from_le_bytes(*word))
    };
    let (common, own) = (take_u32(&mut rest, "magic")?, take_u32(&mut rest, "magic")?);
    if common != IMG_COMMON_MAGIC || own != magic {
        return Err(bad(format!(
            "magic {common:#010x} {own:#010x}, expected {IMG_COMMON_MAGIC:#010x} {magic:#010x}"
        )));
    }
    let mut entries = Vec::new();
    while !rest.is_empty() {
        let len = take_u32(&mut rest, "entry length")? as usize;
        if len > rest.len() {
            return Err(bad(format!(
                "entry of {len} bytes with {} left",
                rest.len()
            )));
        }
        let (body, tail) = rest.split_at(len);
        let entry = entries.len();
        entries.push(M::decode(body).map_err(|source| CriuError::ImageEntry {
            path: path.to_path_buf(),
            entry,
            source,
        })?);
        rest = tail;
    }
    Ok(entries)
}

#[cfg(test)]
mod tests {
    use super::*;
    use prost::Message;

    fn image(magic: u32, entries: &[Vec<u8>]) -> Vec<u8> {
        let mut bytes = [IMG_COMMON_MAGIC.to_le_bytes(), magic.to_le_bytes()].concat();
        for e in entries {
            bytes.extend_from_slice(&(e.len() as u32).to_le_bytes());
            bytes.extend_from_slice(e);
        }
        bytes
    }

    fn file(id: u32, name: &str) -> Vec<u8> {
        FileEntry {
            kind: FD_TYPE_REG,
            id,
            reg: Some(RegFileEntry { name: name.into() }),
        }
        .encode_to_vec()
    }

    fn remap(orig_id: u32, remap_id: u32, kind: i32) -> Vec<u8> {
        RemapFilePathEntry {
            orig_id,
            remap_id,
            remap_type: Some(kind),
        }
        .encode_to_vec()
    }

    fn dump(files: &[Vec<u8>], remaps: Option<&[Vec<u8>]>) -> tempfile::TempDir {
        let dir = tempfile::tempdir().expect("tempdir");
        std::fs::write(dir.path().join("files.img"), image(FILES_MAGIC, files)).expect("files");
        if let Some(remaps) = remaps {
            std::fs::write(
                dir.path().join("remap-fpath.img"),
                image(REMAP_FPATH_MAGIC, remaps),
            )
            .expect("remaps");
        }
        dir
    }

    #[test]
    fn linked_remaps_are_found_and_ghosts_are_not() {
        let files = [
            file(0x16, "/dev/shm/sem.AbCdEf"),
            file(0x17, "/dev/shm/link_remap.23"),
            file(0x18, "tmp/link_remap.24"),
        ];
        let remaps = [
            remap(0x16, 0x17, 0),
            remap(0x19, 0x18, 0),
            remap(0x20, 7, 1),
        ];
        let dir = dump(&files, Some(&remaps));
        assert_eq!(
            link_remaps(dir.path()).expect("remaps"),
            ["/dev/shm/link_remap.23", "/tmp/link_remap.24"]
        );
    }

    #[test]
    fn a_dump_without_remaps_has_none() {
        let dir = dump(&[file(1, "/bin/sleep")], None);
        assert!(link_remaps(dir.path()).expect("remaps").is_empty());
    }

    #[test]
    fn damaged_images_are_errors() {
        let files = [file(0x17, "/dev/shm/link_remap.23")];
        // A remap naming a file that is not in files.img.
        let dir = dump(&files, Some(&[remap(1, 0x99, 0)]));
        assert!(link_remaps(dir.path()).is_err());
        // Wrong magic, truncated entry, garbage entry.
        let dir = dump(&files, Some(&[remap(1, 0x17, 0)]));
        let path = dir.path().join("remap-fpath.img");
        let good = std::fs::read(&path).expect("read");
        let mut wrong_magic = good.clone();
        wrong_magic[4] ^= 1;
        let truncated = good[..good.len() - 1].to_vec();
        let garbage = image(REMAP_FPATH_MAGIC, &[vec![0xff; 5]]);
        for bytes in [wrong_magic, truncated, garbage, good[..6].to_vec()] {
            std::fs::write(&path, &bytes).expect("write");
            assert!(link_remaps(dir.path()).is_err(), "{bytes:?}");
        }
    }
}
