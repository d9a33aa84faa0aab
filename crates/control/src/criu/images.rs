//! What the tool reads out of CRIU's images: the link remaps of a dump, and the pipes on the
//! tree root's standard descriptors whose other end was outside the tree.
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
/// `pstree.img`: one `PstreeEntry` per process, the root first.
const PSTREE_MAGIC: u32 = 0x5027_3030;
/// `ids-<pid>.img`: the ids of a process's shared kernel objects.
const IDS_MAGIC: u32 = 0x5443_2030;
/// `fdinfo-<files id>.img`: one `FdinfoEntry` per descriptor of a descriptor table.
const FDINFO_MAGIC: u32 = 0x5621_3732;
/// `remap-fpath.img`: one `RemapFilePathEntry` per remapped file.
const REMAP_FPATH_MAGIC: u32 = 0x5913_3954;
/// Image files read here are small (a few entries per open file); anything bigger is not CRIU's.
const MAX_IMAGE_BYTES: u64 = 64 << 20;

/// `fd_types.REG` of `fdinfo.proto`.
const FD_TYPE_REG: i32 = 1;
/// `fd_types.PIPE` of `fdinfo.proto`.
const FD_TYPE_PIPE: i32 = 2;
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
    #[prost(message, optional, tag = "18")]
    pipe: Option<PipeEntry>,
}

/// `pipe_entry` of `pipe.proto`: the pipe's inode and this end's open flags.
#[derive(Clone, PartialEq, prost::Message)]
struct PipeEntry {
    #[prost(uint32, required, tag = "2")]
    pipe_id: u32,
    #[prost(uint32, required, tag = "3")]
    flags: u32,
}

/// `pstree_entry` of `pstree.proto`: only the PID.
#[derive(Clone, PartialEq, prost::Message)]
struct PstreeEntry {
    #[prost(uint32, required, tag = "1")]
    pid: u32,
}

/// `task_kobj_ids_entry` of `core.proto`: only the descriptor table's id.
#[derive(Clone, PartialEq, prost::Message)]
struct TaskIds {
    #[prost(uint32, required, tag = "2")]
    files_id: u32,
}

/// `fdinfo_entry` of `fdinfo.proto`: the file's id, its type and the descriptor's number.
#[derive(Clone, PartialEq, prost::Message)]
struct FdinfoEntry {
    #[prost(uint32, required, tag = "1")]
    id: u32,
    #[prost(int32, required, tag = "3")]
    kind: i32,
    #[prost(uint32, required, tag = "4")]
    fd: u32,
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

/// The standard descriptors (0, 1, 2) of the dumped tree's root that are one end of a pipe whose
/// other end no process of the tree held (a container runtime's pipes to its monitor): each
/// descriptor with the pipe's inode, as `criu restore --inherit-fd fd[N]:pipe:[INODE]` names it.
/// Left to CRIU, such a pipe comes back with no process at its other end: the tree's output
/// would go nowhere, and its first write after the reader's end is closed would kill it
/// (`SIGPIPE`). A pipe is external when every end of it in the images is open the same way
/// (only read ends, or only write ends).
pub fn external_stdio_pipes(images: &Path) -> Result<Vec<(u32, u32)>, CriuError> {
    let pstree = images.join("pstree.img");
    let root = read_entries::<PstreeEntry>(&pstree, PSTREE_MAGIC)?
        .first()
        .map(|e| e.pid)
        .ok_or_else(|| CriuError::Image {
            path: pstree.clone(),
            message: "no process".into(),
        })?;
    let ids_path = images.join(format!("ids-{root}.img"));
    let files_id = read_entries::<TaskIds>(&ids_path, IDS_MAGIC)?
        .first()
        .map(|e| e.files_id)
        .ok_or_else(|| CriuError::Image {
            path: ids_path.clone(),
            message: "no ids".into(),
        })?;
    let fdinfo = images.join(format!("fdinfo-{files_id}.img"));
    let stdio: Vec<FdinfoEntry> = read_entries::<FdinfoEntry>(&fdinfo, FDINFO_MAGIC)?
        .into_iter()
        .filter(|e| e.fd <= 2 && e.kind == FD_TYPE_PIPE)
        .collect();
    if stdio.is_empty() {
        return Ok(Vec::new());
    }
    let pipes: Vec<(u32, PipeEntry)> =
        read_entries::<FileEntry>(&images.join("files.img"), FILES_MAGIC)?
            .into_iter()
            .filter(|f| f.kind == FD_TYPE_PIPE)
            .filter_map(|f| Some((f.id, f.pipe?)))
            .collect();
    const ACCESS: u32 = 0o3;
    Ok(stdio
        .iter()
        .filter_map(|e| {
            let (_, end) = pipes.iter().find(|(id, _)| *id == e.id)?;
            let external = pipes
                .iter()
                .filter(|(_, p)| p.pipe_id == end.pipe_id)
                .all(|(_, p)| p.flags & ACCESS == end.flags & ACCESS);
            external.then_some((e.fd, end.pipe_id))
        })
        .collect())
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
            pipe: None,
        }
        .encode_to_vec()
    }

    fn pipe_end(id: u32, pipe_id: u32, flags: u32) -> Vec<u8> {
        FileEntry {
            kind: FD_TYPE_PIPE,
            id,
            reg: None,
            pipe: Some(PipeEntry { pipe_id, flags }),
        }
        .encode_to_vec()
    }

    /// The root (pid 7) holds: fd 0 a file, fd 1 the write end of a pipe nobody in the tree
    /// reads, fd 2 the write end of a pipe the tree also reads (a pipeline), fd 5 another
    /// external pipe (not stdio).
    #[test]
    fn external_stdio_pipes_are_found() {
        let dir = tempfile::tempdir().expect("tempdir");
        let write = |name: &str, bytes: Vec<u8>| {
            std::fs::write(dir.path().join(name), bytes).expect("image");
        };
        write(
            "pstree.img",
            image(PSTREE_MAGIC, &[PstreeEntry { pid: 7 }.encode_to_vec()]),
        );
        write(
            "ids-7.img",
            image(IDS_MAGIC, &[TaskIds { files_id: 3 }.encode_to_vec()]),
        );
        let fd = |id, kind, fd| FdinfoEntry { id, kind, fd }.encode_to_vec();
        write(
            "fdinfo-3.img",
            image(
                FDINFO_MAGIC,
                &[
                    fd(1, FD_TYPE_REG, 0),
                    fd(2, FD_TYPE_PIPE, 1),
                    fd(3, FD_TYPE_PIPE, 2),
                    fd(5, FD_TYPE_PIPE, 5),
                ],
            ),
        );
        let (o_wronly, o_rdonly) = (0o1, 0o0);
        write(
            "files.img",
            image(
                FILES_MAGIC,
                &[
                    file(1, "/dev/null"),
                    pipe_end(2, 100, o_wronly),
                    pipe_end(3, 200, o_wronly),
                    pipe_end(4, 200, o_rdonly),
                    pipe_end(5, 300, o_wronly),
                ],
            ),
        );
        assert_eq!(external_stdio_pipes(dir.path()).expect("pipes"), [(1, 100)]);
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
