//! The workload's TCP connections, before a checkpoint to disk.
//!
//! CRIU restores an established TCP connection only with `--tcp-established` (TCP repair mode, the
//! same addresses and ports), and only makes sense of one whose other end it restores as well: a
//! peer outside the tree would see its connection come back from nowhere, or never. Every
//! connection of the tree must therefore have its other end in the tree (NCCL's bootstrap and proxy
//! connections between ranks and threads of one job are); one with an outside peer is refused
//! before anything changes.
//!
//! Read from `/proc/<pid>/net/tcp{,6}` (the tables of the process's network namespace) joined with
//! the socket inodes of its descriptors.

use crate::ControlError;
use crate::Refusal;
use crate::discovery;
use std::collections::HashSet;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

/// `st` of `/proc/net/tcp` for a listening socket, and for a closed one (nothing to restore).
const TCP_LISTEN: u8 = 0x0a;
const TCP_CLOSE: u8 = 0x07;

/// One row of `/proc/net/tcp` or `/proc/net/tcp6`.
#[derive(Debug, Clone, PartialEq, Eq)]
struct TcpRow {
    local: SocketAddr,
    remote: SocketAddr,
    state: u8,
    inode: u64,
}

/// A socket of the tree: which process holds it, in which network namespace.
#[derive(Debug, Clone)]
struct TreeSocket {
    pid: u32,
    net_namespace: u64,
    row: TcpRow,
}

/// The TCP connections of a tree that CRIU can take.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TcpSurvey {
    /// Connected sockets (both ends counted) whose peer is in the tree: the dump and the restore
    /// need `--tcp-established`.
    pub connected_within: usize,
}

/// Surveys the tree's TCP sockets; refuses, naming each process, every connection whose other end
/// is not a socket of the tree in the same network namespace.
pub fn survey(tree: &[u32]) -> Result<TcpSurvey, ControlError> {
    let mut sockets = Vec::new();
    for &pid in tree {
        let inodes = discovery::socket_inodes(pid)?;
        if inodes.is_empty() {
            continue;
        }
        let net_namespace = discovery::net_namespace(pid)?;
        for (table, v6) in [("net/tcp", false), ("net/tcp6", true)] {
            // A kernel without IPv6 has no tcp6 table.
            let Ok(text) = crate::procfs::read(pid, table) else {
                continue;
            };
            sockets.extend(
                parse_table(&text, v6)
                    .filter(|row| inodes.contains(&row.inode))
                    .map(|row| TreeSocket {
                        pid,
                        net_namespace,
                        row,
                    }),
            );
        }
    }
    classify(&sockets)
}

fn classify(sockets: &[TreeSocket]) -> Result<TcpSurvey, ControlError> {
    // Connections by (namespace, local, remote): a connection's other end is the socket with the
    // two addresses swapped (not merely one bound to its remote address: a listener shares the
    // address of the connections it accepted).
    let ends: HashSet<(u64, SocketAddr, SocketAddr)> = sockets
        .iter()
        .map(|s| (s.net_namespace, s.row.local, s.row.remote))
        .collect();
    let mut survey = TcpSurvey::default();
    let mut refusals = Vec::new();
    for s in sockets {
        if matches!(s.row.state, TCP_LISTEN | TCP_CLOSE) {
            continue;
        }
        if ends.contains(&(s.net_namespace, s.row.remote, s.row.local)) {
            survey.connected_within += 1;
            continue;
        }
        let process = discovery::describe(s.pid)
            .map(|i| i.label())
            .unwrap_or_else(|_| format!("pid {}", s.pid));
        refusals.push(Refusal {
            process,
            reason: format!(
                "has a TCP connection {} -> {} whose other end is outside the workload; a \
                 restore could not bring that peer back (checkpoint it in the same tree, or \
                 close the connection first)",
                s.row.local, s.row.remote
            ),
        });
    }
    if refusals.is_empty() {
        Ok(survey)
    } else {
        Err(ControlError::Refused(refusals))
    }
}

/// Rows of a `/proc/net/tcp` (or, with `v6`, `tcp6`) table: `sl local_address rem_address st
/// tx_queue:rx_queue tr:tm->when retrnsmt uid timeout inode ...`. Unparsable rows are skipped.
fn parse_table(text: &str, v6: bool) -> impl Iterator<Item = TcpRow> + '_ {
    text.lines().skip(1).filter_map(move |line| {
        let fields: Vec<&str> = line.split_whitespace().collect();
        Some(TcpRow {
            local: parse_endpoint(fields.get(1)?, v6)?,
            remote: parse_endpoint(fields.get(2)?, v6)?,
            state: u8::from_str_radix(fields.get(3)?, 16).ok()?,
            inode: fields.get(9)?.parse().ok()?,
        })
    })
}

/// `0100007F:1F90` (127.0.0.1:8080): the address as the kernel's 32-bit words in host byte order
/// (little-endian on the machines this runs on), the port in hex. IPv4-mapped IPv6 addresses are
/// given as IPv4, so a v4 client of a dual-stack listener matches its accepted socket.
fn parse_endpoint(text: &str, v6: bool) -> Option<SocketAddr> {
    let (addr, port) = text.split_once(':')?;
    let port = u16::from_str_radix(port, 16).ok()?;
    let words: Vec<u32> = (0..addr.len() / 8)
        .map(|i| {
            addr.get(i * 8..i * 8 + 8)
                .and_then(|w| u32::from_str_radix(w, 16).ok())
        })
        .collect::<Option<_>>()?;
    let ip = match (v6, words.as_slice()) {
        (false, [w]) => IpAddr::V4(Ipv4Addr::from(w.to_le_bytes())),
        (true, [a, b, c, d]) => {
            let mut bytes = [0u8; 16];
            for (chunk, w) in bytes.chunks_exact_mut(4).zip([a, b, c, d]) {
                chunk.copy_from_slice(&w.to_le_bytes());
            }
            Ipv6Addr::from(bytes).to_canonical()
        }
        _ => return None,
    };
    Some(SocketAddr::new(ip, port))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};

    const TCP4: &str = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 0100007F:1F90 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 1001 1 0 100 0 0 10 0
   1: 0100007F:1F90 0100007F:A000 01 00000000:00000000 00:00000000 00000000     0        0 1002 1 0 20 4 30 10 -1
   2: 0100007F:A000 0100007F:1F90 01 00000000:00000000 00:00000000 00000000     0        0 1003 1 0 20 4 30 10 -1
   3: 0A00000A:C000 0B00000A:01BB 01 00000000:00000000 00:00000000 00000000     0        0 1004 1 0 20 4 30 10 -1
   4: garbage
";
    const TCP6: &str = "  sl  local_address                         remote_address                        st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 0000000000000000FFFF00000100007F:A001 0000000000000000FFFF00000100007F:1F90 01 00000000:00000000 00:00000000 00000000     0        0 2001 1 0 20 4 30 10 -1
   1: 00000000000000000000000001000000:1F91 00000000000000000000000001000000:A002 01 00000000:00000000 00:00000000 00000000     0        0 2002 1 0 20 4 30 10 -1
";

    fn socket(row: TcpRow) -> TreeSocket {
        TreeSocket {
            pid: std::process::id(),
            net_namespace: 1,
            row,
        }
    }

    #[test]
    fn tables_parse_to_addresses() {
        let rows: Vec<TcpRow> = parse_table(TCP4, false).collect();
        assert_eq!(rows.len(), 4, "the garbage row is skipped");
        assert_eq!(rows[0].local, "127.0.0.1:8080".parse().unwrap());
        assert_eq!(rows[0].state, TCP_LISTEN);
        assert_eq!(rows[3].local, "10.0.0.10:49152".parse().unwrap());
        assert_eq!(rows[3].remote, "10.0.0.11:443".parse().unwrap());
        assert_eq!(rows[3].inode, 1004);
        let rows6: Vec<TcpRow> = parse_table(TCP6, true).collect();
        assert_eq!(
            rows6[0].local,
            "127.0.0.1:40961".parse().unwrap(),
            "v4-mapped"
        );
        assert_eq!(rows6[1].local, "[::1]:8081".parse().unwrap());
        assert!(
            parse_table(TCP4, true).next().is_none(),
            "v4 rows are no v6 rows"
        );
    }

    #[test]
    fn connections_within_the_tree_pass_and_outside_peers_are_refused() {
        let rows: Vec<TcpRow> = parse_table(TCP4, false).collect();
        let within: Vec<TreeSocket> = rows[..3].iter().cloned().map(socket).collect();
        assert_eq!(
            classify(&within).expect("within"),
            TcpSurvey {
                connected_within: 2
            }
        );
        // The same pair seen from different network namespaces is not a pair.
        let mut split = within.clone();
        split[2].net_namespace = 2;
        assert!(classify(&split).is_err());
        let all: Vec<TreeSocket> = rows.into_iter().map(socket).collect();
        let err = classify(&all).expect_err("outside peer").to_string();
        assert!(
            err.contains("10.0.0.10:49152 -> 10.0.0.11:443")
                && err.contains("outside the workload"),
            "{err}"
        );
    }

    #[test]
    fn this_process_is_surveyed_from_proc() {
        let me = std::process::id();
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("listen");
        assert_eq!(survey(&[me]).expect("listening only").connected_within, 0);
        let mut client =
            std::net::TcpStream::connect(listener.local_addr().unwrap()).expect("connect");
        let (mut server, _) = listener.accept().expect("accept");
        client.write_all(b"x").expect("write");
        server.read_exact(&mut [0u8; 1]).expect("read");
        assert_eq!(survey(&[me]).expect("within").connected_within, 2);
        drop(server);
        let outside = std::net::TcpListener::bind("127.0.0.1:0").expect("listen");
        // A connection whose accepting end this process closes at once: its peer is gone.
        let _alone = std::net::TcpStream::connect(outside.local_addr().unwrap()).expect("connect");
        drop(outside.accept().expect("accept"));
        drop(outside);
        let err = survey(&[me]).expect_err("peerless").to_string();
        assert!(err.contains("outside the workload"), "{err}");
    }
}
