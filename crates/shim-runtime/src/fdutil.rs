//! Descriptors the shim makes and reads: tickets (sealed memfds), the classification of a descriptor
//! an application hands to `cuMemImportFromShareableHandle`, allocation IDs.

use protocol::record::AllocationId;
use protocol::ticket::{TICKET_LEN, TICKET_MAGIC, Ticket};
use rustix::fs::{MemfdFlags, SealFlags};
use rustix::io::Errno;
use std::os::fd::{BorrowedFd, OwnedFd};

/// The seals every ticket carries: its bytes can never change.
const TICKET_SEALS: SealFlags = SealFlags::WRITE
    .union(SealFlags::GROW)
    .union(SealFlags::SHRINK)
    .union(SealFlags::SEAL);

/// A close-on-exec sealed memfd holding exactly the ticket's bytes.
pub fn make_ticket(ticket: &Ticket) -> Result<OwnedFd, Errno> {
    let fd = rustix::fs::memfd_create(
        "cuinterpose-ticket",
        MemfdFlags::CLOEXEC | MemfdFlags::ALLOW_SEALING,
    )?;
    let bytes = ticket.encode();
    let mut written = 0;
    while let Some(rest) = bytes.get(written..).filter(|r| !r.is_empty()) {
        match rustix::io::pwrite(&fd, rest, written as u64) {
            Ok(0) => return Err(Errno::IO),
            Ok(n) => written += n,
            Err(Errno::INTR) => {}
            Err(e) => return Err(e),
        }
    }
    rustix::fs::fcntl_add_seals(&fd, TICKET_SEALS)?;
    Ok(fd)
}

/// What a descriptor handed to an import is.
#[derive(Debug, PartialEq, Eq)]
pub enum Classified {
    /// A well-formed ticket.
    Ticket(Ticket),
    /// Starts like a ticket but is not a valid one (wrong size, missing seals, bad version,
    /// checksum, reserved bytes): refused, never passed to the driver.
    BadTicket(String),
    /// Anything else (a driver descriptor, the fake driver's memfd): imported natively.
    Foreign,
}

/// Classifies without closing, moving or reading past the application's descriptor: `F_GET_SEALS`
/// first (fails on anything but memfd/shmem, so a driver's character device is never read), then
/// `pread` (no file offset change) of the first bytes and `fstat`.
pub fn classify(fd: BorrowedFd<'_>) -> Classified {
    let Ok(seals) = rustix::fs::fcntl_get_seals(fd) else {
        return Classified::Foreign;
    };
    let mut buf = [0u8; TICKET_LEN];
    let mut got = 0;
    while let Some(rest) = buf.get_mut(got..).filter(|r| !r.is_empty()) {
        match rustix::io::pread(fd, rest, got as u64) {
            Ok(0) => break,
            Ok(n) => got += n,
            Err(Errno::INTR) => {}
            Err(_) => return Classified::Foreign,
        }
    }
    if buf.get(..TICKET_MAGIC.len()) != Some(&TICKET_MAGIC[..]) || got < TICKET_MAGIC.len() {
        return Classified::Foreign;
    }
    let size = match rustix::fs::fstat(fd) {
        Ok(st) => st.st_size,
        Err(e) => return Classified::BadTicket(format!("fstat failed: {e}")),
    };
    if size != TICKET_LEN as i64 {
        return Classified::BadTicket(format!(
            "descriptor holds {size} bytes, a ticket is {TICKET_LEN}"
        ));
    }
    if !seals.contains(TICKET_SEALS) {
        return Classified::BadTicket(format!("descriptor is not sealed ({seals:?})"));
    }
    match buf.get(..got).map(Ticket::decode) {
        Some(Ok(ticket)) => Classified::Ticket(ticket),
        Some(Err(e)) => Classified::BadTicket(e.to_string()),
        None => Classified::BadTicket("short read".into()),
    }
}

/// A duplicate of `fd`, close-on-exec.
pub fn dup(fd: BorrowedFd<'_>) -> Result<OwnedFd, Errno> {
    rustix::io::fcntl_dupfd_cloexec(fd, 0)
}

/// A random 128-bit allocation ID (`getrandom`; the kernel's pool is initialised long before any
/// CUDA process runs, and a failure is reported rather than replaced by a weaker source).
pub fn random_id() -> Result<AllocationId, Errno> {
    let mut id = [0u8; 16];
    let mut got = 0;
    while let Some(rest) = id.get_mut(got..).filter(|r| !r.is_empty()) {
        match rustix::rand::getrandom(rest, rustix::rand::GetRandomFlags::empty()) {
            Ok(n) => got += n,
            Err(Errno::INTR) => {}
            Err(e) => return Err(e),
        }
    }
    Ok(AllocationId(id))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsFd;

    fn sample() -> Ticket {
        Ticket {
            creator_ns_pid: 1234,
            id: AllocationId([7; 16]),
            size: 2 << 20,
            multicast: false,
        }
    }

    fn memfd_with(bytes: &[u8], seals: SealFlags) -> OwnedFd {
        let fd =
            rustix::fs::memfd_create("t", MemfdFlags::CLOEXEC | MemfdFlags::ALLOW_SEALING).unwrap();
        rustix::io::pwrite(&fd, bytes, 0).unwrap();
        if !seals.is_empty() {
            rustix::fs::fcntl_add_seals(&fd, seals).unwrap();
        }
        fd
    }

    #[test]
    fn a_ticket_classifies_as_itself_and_is_sealed_and_cloexec() {
        let fd = make_ticket(&sample()).unwrap();
        assert_eq!(classify(fd.as_fd()), Classified::Ticket(sample()));
        assert!(
            rustix::fs::fcntl_get_seals(&fd)
                .unwrap()
                .contains(TICKET_SEALS)
        );
        assert!(
            rustix::io::fcntl_getfd(&fd)
                .unwrap()
                .contains(rustix::io::FdFlags::CLOEXEC)
        );
        assert!(rustix::io::pwrite(&fd, b"x", 0).is_err());
        // Classifying did not move the offset: a read from the start still sees the magic.
        let mut buf = [0u8; 8];
        rustix::io::read(&fd, &mut buf).unwrap();
        assert_eq!(buf, TICKET_MAGIC);
    }

    #[test]
    fn bad_tickets_are_refused_and_others_are_foreign() {
        let good = sample().encode();
        // Truncated: the magic, then nothing.
        assert!(matches!(
            classify(memfd_with(&good[..20], TICKET_SEALS).as_fd()),
            Classified::BadTicket(_)
        ));
        // Unsealed copy of a valid ticket (forged by something that is not a shim).
        assert!(matches!(
            classify(memfd_with(&good, SealFlags::empty()).as_fd()),
            Classified::BadTicket(_)
        ));
        // Wrong version and bad checksum.
        let mut other = good;
        other[8] = 9;
        assert!(matches!(
            classify(memfd_with(&other, TICKET_SEALS).as_fd()),
            Classified::BadTicket(_)
        ));
        let mut crc = good;
        crc[33] ^= 1;
        assert!(matches!(
            classify(memfd_with(&crc, TICKET_SEALS).as_fd()),
            Classified::BadTicket(_)
        ));
        // A memfd without the magic (the fake driver's export) and a pipe are foreign.
        assert_eq!(
            classify(memfd_with(b"FAKECUDA-and-more-bytes", SealFlags::empty()).as_fd()),
            Classified::Foreign
        );
        let (r, _w) = rustix::pipe::pipe().unwrap();
        assert_eq!(classify(r.as_fd()), Classified::Foreign);
    }

    #[test]
    fn ids_are_random() {
        assert_ne!(random_id().unwrap(), random_id().unwrap());
    }
}
