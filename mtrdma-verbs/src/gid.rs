//! GIDs and the choice of the GID a queue pair is addressed by.
//!
//! On RoCE the GID table holds one entry per address of the port's network
//! device and RoCE version. Index 0 is usually the link-local (`fe80::`)
//! entry, which does not route between hosts and makes connections time out;
//! entries may also read as all zeros (for example inside a container that
//! does not own the address). [`GidSelection::Auto`] therefore prefers the
//! RoCE v2 IPv4-mapped entry, as `perftest -x` users pick by hand.

use std::fmt;
use std::net::{Ipv4Addr, Ipv6Addr};

/// A 128-bit global identifier of a port (an IPv6 address on RoCE).
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Gid(pub [u8; 16]);

impl Gid {
    /// True when every byte is zero: the entry is unused.
    pub fn is_zero(&self) -> bool {
        self.0 == [0; 16]
    }

    /// True for an IPv6 link-local address (`fe80::/10`).
    pub fn is_link_local(&self) -> bool {
        self.0[0] == 0xfe && self.0[1] & 0xc0 == 0x80
    }

    /// The IPv4 address of an IPv4-mapped GID (`::ffff:a.b.c.d`), as RoCE v2
    /// uses for an IPv4 address of the network device.
    pub fn ipv4_mapped(&self) -> Option<Ipv4Addr> {
        Ipv6Addr::from(self.0).to_ipv4_mapped()
    }
}

impl fmt::Display for Gid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.ipv4_mapped() {
            Some(v4) => write!(f, "::ffff:{v4}"),
            None => write!(f, "{}", Ipv6Addr::from(self.0)),
        }
    }
}

impl fmt::Debug for Gid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Gid({self})")
    }
}

/// The protocol a GID entry is used with.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum GidType {
    /// InfiniBand (or iWARP).
    Ib,
    /// RoCE v1 (Ethernet frames, not routable).
    RoceV1,
    /// RoCE v2 (UDP/IP, routable).
    RoceV2,
    /// A type this version of mtrdma does not know.
    Other(u32),
}

impl GidType {
    pub(crate) fn from_raw(raw: u32) -> Self {
        match raw {
            0 => GidType::Ib,
            1 => GidType::RoceV1,
            2 => GidType::RoceV2,
            other => GidType::Other(other),
        }
    }
}

impl fmt::Display for GidType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            GidType::Ib => f.write_str("IB"),
            GidType::RoceV1 => f.write_str("RoCE v1"),
            GidType::RoceV2 => f.write_str("RoCE v2"),
            GidType::Other(t) => write!(f, "type {t}"),
        }
    }
}

/// One entry of a port's GID table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GidEntry {
    /// The port (1-based).
    pub port: u8,
    /// The index in the port's GID table (what a QP's `sgid_index` names).
    pub index: u32,
    /// The GID itself.
    pub gid: Gid,
    /// The protocol it is used with.
    pub kind: GidType,
    /// The interface index of the network device it belongs to (0 on InfiniBand).
    pub netdev_ifindex: u32,
}

/// How to choose the GID of a port.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum GidSelection {
    /// RoCE v2 IPv4-mapped first, then other global RoCE v2, then global
    /// RoCE v1; on InfiniBand the first non-zero GID. Zero entries and, on
    /// RoCE, link-local entries are never chosen.
    #[default]
    Auto,
    /// Exactly this table index (it must exist and not be zero).
    Index(u32),
}

/// Chooses a GID among `entries` (the entries of one port).
///
/// Returns the reason when none qualifies, for [`crate::Error::NoUsableGid`].
pub(crate) fn select(entries: &[GidEntry], selection: GidSelection) -> Result<GidEntry, String> {
    match selection {
        GidSelection::Index(index) => match entries.iter().find(|e| e.index == index) {
            Some(e) if !e.gid.is_zero() => Ok(*e),
            Some(_) => Err(format!("GID index {index} is all zeros")),
            None => Err(format!(
                "GID index {index} is not in the table (valid indices: {:?})",
                entries.iter().map(|e| e.index).collect::<Vec<_>>()
            )),
        },
        GidSelection::Auto => {
            let rank = |e: &GidEntry| -> Option<u8> {
                if e.gid.is_zero() {
                    return None;
                }
                match e.kind {
                    GidType::Ib => Some(3),
                    _ if e.gid.is_link_local() => None,
                    GidType::RoceV2 if e.gid.ipv4_mapped().is_some() => Some(0),
                    GidType::RoceV2 => Some(1),
                    GidType::RoceV1 => Some(2),
                    GidType::Other(_) => None,
                }
            };
            entries
                .iter()
                .filter_map(|e| rank(e).map(|r| (r, e.index, *e)))
                .min_by_key(|&(r, index, _)| (r, index))
                .map(|(_, _, e)| e)
                .ok_or_else(|| {
                    if entries.is_empty() {
                        "the GID table is empty".to_string()
                    } else {
                        format!(
                            "only zero or link-local GIDs: {}",
                            entries
                                .iter()
                                .map(|e| format!("[{}] {} {}", e.index, e.gid, e.kind))
                                .collect::<Vec<_>>()
                                .join(", ")
                        )
                    }
                })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(index: u32, gid: Ipv6Addr, kind: GidType) -> GidEntry {
        GidEntry {
            port: 1,
            index,
            gid: Gid(gid.octets()),
            kind,
            netdev_ifindex: 2,
        }
    }

    fn rxe_table() -> Vec<GidEntry> {
        // What rxe0 on a netdev with 10.0.2.15 and a link-local address shows.
        vec![
            entry(
                0,
                "fe80::5054:ff:fe12:3456".parse().unwrap(),
                GidType::RoceV2,
            ),
            entry(
                1,
                Ipv4Addr::new(10, 0, 2, 15).to_ipv6_mapped(),
                GidType::RoceV2,
            ),
        ]
    }

    #[test]
    fn classifies_gids() {
        let t = rxe_table();
        assert!(t[0].gid.is_link_local());
        assert_eq!(t[0].gid.ipv4_mapped(), None);
        assert!(!t[1].gid.is_link_local());
        assert_eq!(t[1].gid.ipv4_mapped(), Some(Ipv4Addr::new(10, 0, 2, 15)));
        assert_eq!(t[1].gid.to_string(), "::ffff:10.0.2.15");
        assert!(Gid::default().is_zero());
    }

    #[test]
    fn auto_prefers_ipv4_mapped_roce_v2_over_link_local() {
        assert_eq!(select(&rxe_table(), GidSelection::Auto).unwrap().index, 1);
    }

    #[test]
    fn auto_ranks_v2_mapped_then_v2_then_v1() {
        let global: Ipv6Addr = "2001:db8::1".parse().unwrap();
        let mapped = Ipv4Addr::new(192, 0, 2, 1).to_ipv6_mapped();
        let table = vec![
            entry(0, global, GidType::RoceV1),
            entry(1, global, GidType::RoceV2),
            entry(2, mapped, GidType::RoceV1),
            entry(3, mapped, GidType::RoceV2),
        ];
        assert_eq!(select(&table, GidSelection::Auto).unwrap().index, 3);
        assert_eq!(select(&table[..3], GidSelection::Auto).unwrap().index, 1);
        assert_eq!(select(&table[..1], GidSelection::Auto).unwrap().index, 0);
    }

    #[test]
    fn auto_skips_zero_entries_as_in_containers() {
        let mut t = rxe_table();
        t[1].gid = Gid::default();
        let err = select(&t, GidSelection::Auto).unwrap_err();
        assert!(err.contains("only zero or link-local"), "{err}");
        assert!(select(&[], GidSelection::Auto)
            .unwrap_err()
            .contains("empty"));
    }

    #[test]
    fn infiniband_uses_its_link_local_port_gid() {
        let t = vec![entry(
            0,
            "fe80::248a:703:49:d4e0".parse().unwrap(),
            GidType::Ib,
        )];
        assert_eq!(select(&t, GidSelection::Auto).unwrap().index, 0);
    }

    #[test]
    fn explicit_index_must_exist_and_be_non_zero() {
        let mut t = rxe_table();
        assert_eq!(select(&t, GidSelection::Index(0)).unwrap().index, 0);
        assert!(select(&t, GidSelection::Index(5))
            .unwrap_err()
            .contains("not in the table"));
        t[1].gid = Gid::default();
        assert!(select(&t, GidSelection::Index(1))
            .unwrap_err()
            .contains("all zeros"));
    }
}
