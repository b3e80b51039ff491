//! The pager's placement of pages and its checks.

use super::*;

#[test]
fn with_clusters_of_one_page_placement_is_page_by_page() {
    for n in 1..=4 {
        for p in 0..100 {
            assert_eq!(place(p, 1, n), (p % n, p / n));
        }
        for i in 0..n {
            assert_eq!(pages_on(101, 1, n, i), (101 - i).div_ceil(n));
        }
    }
}

#[test]
fn a_clusters_pages_are_contiguous_on_one_node() {
    for k in [2, 8, 64] {
        for n in 1..=3 {
            for g in 0..20 {
                let (node, first) = place(g * k, k, n);
                assert_eq!(node, g % n);
                assert_eq!(first, (g / n) * k);
                for j in 0..k {
                    assert_eq!(place(g * k + j, k, n), (node, first + j));
                }
            }
        }
    }
}

#[test]
fn every_page_has_exactly_one_node_and_slot_within_the_capacity() {
    for k in [1, 4, 8] {
        for n in 1..=3 {
            let w = 24 * k;
            let mut seen = std::collections::HashSet::new();
            for p in 0..w {
                let (node, slot) = place(p, k, n);
                assert!(node < n);
                assert!(slot < pages_on(w, k, n, node), "k {k} n {n} page {p}");
                assert!(seen.insert((node, slot)), "k {k} n {n}: slot taken twice");
            }
            let total: u64 = (0..n).map(|i| pages_on(w, k, n, i)).sum();
            assert_eq!(total, w);
        }
    }
}

#[test]
fn capacity_is_checked_in_clusters() {
    let node = |port| NodeAddr {
        host: "h".into(),
        port,
    };
    // 3 clusters of 8 over 2 nodes: 16 pages on node 0, 8 on node 1.
    assert!(check_capacity(24, 8, &[(node(1), 16), (node(2), 8)]).is_ok());
    let e = check_capacity(24, 8, &[(node(1), 15), (node(2), 8)]).unwrap_err();
    assert!(e.contains("needs 16 pages on node h:1"), "{e}");
}
