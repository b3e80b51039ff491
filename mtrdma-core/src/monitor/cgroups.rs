//! Cgroup ids, as the kernel's BPF helpers give them, back to paths.

use std::collections::HashMap;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// The cgroup v2 hierarchy's mount point on nearly every system.
const DEFAULT_ROOT: &str = "/sys/fs/cgroup";
/// A cgroup id not found is looked for again at most this often (a walk of
/// the hierarchy per unknown id would be costly where cgroups come and go).
const RESCAN_EVERY: Duration = Duration::from_secs(1);
/// The deepest hierarchy walked.
const MAX_DEPTH: usize = 32;

/// Names cgroup (v2) ids by their paths in the hierarchy, such as
/// `/system.slice/app.service`, the form `/proc/PID/cgroup` and the
/// policy's match rules use. A cgroup's id is its directory's inode
/// number in the cgroup2 file system.
///
/// ```no_run
/// let mut paths = mtrdma_core::monitor::CgroupPaths::new();
/// let root_id = std::os::unix::fs::MetadataExt::ino(&std::fs::metadata("/sys/fs/cgroup")?);
/// assert_eq!(paths.path_of(root_id).as_deref(), Some("/"));
/// # Ok::<(), std::io::Error>(())
/// ```
#[derive(Debug)]
pub struct CgroupPaths {
    root: PathBuf,
    by_id: HashMap<u64, String>,
    scanned: Option<Instant>,
}

impl Default for CgroupPaths {
    fn default() -> Self {
        CgroupPaths::new()
    }
}

impl CgroupPaths {
    /// Paths in the hierarchy mounted at `/sys/fs/cgroup`.
    pub fn new() -> CgroupPaths {
        CgroupPaths::at(DEFAULT_ROOT)
    }

    /// Paths in the cgroup2 hierarchy mounted at `root`.
    pub fn at(root: impl Into<PathBuf>) -> CgroupPaths {
        CgroupPaths {
            root: root.into(),
            by_id: HashMap::new(),
            scanned: None,
        }
    }

    /// The path of cgroup `id`, or `None` if no cgroup has it (it was
    /// removed, or the hierarchy is not mounted at this root).
    pub fn path_of(&mut self, id: u64) -> Option<String> {
        if let Some(p) = self.by_id.get(&id) {
            return Some(p.clone());
        }
        if self.scanned.is_some_and(|t| t.elapsed() < RESCAN_EVERY) {
            return None;
        }
        self.rescan();
        self.by_id.get(&id).cloned()
    }

    fn rescan(&mut self) {
        self.by_id.clear();
        self.scanned = Some(Instant::now());
        let root = self.root.clone();
        self.walk(&root, "/", 0);
    }

    fn walk(&mut self, dir: &Path, path: &str, depth: usize) {
        let Ok(meta) = std::fs::metadata(dir) else {
            return;
        };
        self.by_id.insert(meta.ino(), path.to_string());
        if depth >= MAX_DEPTH {
            return;
        }
        let Ok(entries) = std::fs::read_dir(dir) else {
            return;
        };
        for entry in entries.flatten() {
            if !entry.file_type().is_ok_and(|t| t.is_dir()) {
                continue;
            }
            let name = entry.file_name();
            let Some(name) = name.to_str() else {
                continue;
            };
            let child = if path == "/" {
                format!("/{name}")
            } else {
                format!("{path}/{name}")
            };
            self.walk(&entry.path(), &child, depth + 1);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_directories_by_their_inodes_and_forgets_removed_ones() {
        let dir = std::env::temp_dir().join(format!("mtrdma-cgroups-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(dir.join("a/b")).unwrap();
        std::fs::create_dir_all(dir.join("c")).unwrap();
        let ino = |p: &str| std::fs::metadata(dir.join(p)).unwrap().ino();
        let (b, c) = (ino("a/b"), ino("c"));
        let mut paths = CgroupPaths::at(&dir);
        assert_eq!(paths.path_of(ino("")).as_deref(), Some("/"));
        assert_eq!(paths.path_of(b).as_deref(), Some("/a/b"));
        assert_eq!(paths.path_of(c).as_deref(), Some("/c"));
        std::fs::remove_dir_all(&dir).unwrap();
        // Known ids stay known; an unknown one is not looked for again at
        // once, and once looked for is not found.
        assert_eq!(paths.path_of(b).as_deref(), Some("/a/b"));
        assert_eq!(paths.path_of(u64::MAX), None);
        paths.scanned = None;
        assert_eq!(paths.path_of(u64::MAX), None);
        assert_eq!(paths.path_of(b), None, "a rescan forgets what is gone");
    }
}
