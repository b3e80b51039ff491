//! A writer for the `newc` cpio format the kernel unpacks as an initramfs.

/// Builds a cpio archive in memory.
#[derive(Debug, Default)]
pub(crate) struct Writer {
    out: Vec<u8>,
    next_ino: u32,
}

const S_IFDIR: u32 = 0o040_000;
const S_IFREG: u32 = 0o100_000;
const S_IFCHR: u32 = 0o020_000;

impl Writer {
    pub(crate) fn new() -> Self {
        Writer {
            out: Vec::new(),
            next_ino: 1,
        }
    }

    /// Adds a directory (mode 0755).
    pub(crate) fn dir(&mut self, name: &str) {
        self.entry(name, S_IFDIR | 0o755, 2, (0, 0), &[]);
    }

    /// Adds a regular file.
    pub(crate) fn file(&mut self, name: &str, mode: u32, data: &[u8]) {
        self.entry(name, S_IFREG | (mode & 0o7777), 1, (0, 0), data);
    }

    /// Adds a character device node (mode 0600).
    pub(crate) fn char_device(&mut self, name: &str, major: u32, minor: u32) {
        self.entry(name, S_IFCHR | 0o600, 1, (major, minor), &[]);
    }

    /// Ends the archive and returns its bytes.
    pub(crate) fn finish(mut self) -> Vec<u8> {
        self.entry("TRAILER!!!", 0, 1, (0, 0), &[]);
        self.out
    }

    fn entry(&mut self, name: &str, mode: u32, nlink: u32, rdev: (u32, u32), data: &[u8]) {
        let ino = if mode == 0 { 0 } else { self.next_ino };
        self.next_ino += 1;
        let size = u32::try_from(data.len()).expect("initramfs files are smaller than 4 GiB");
        let namesize = u32::try_from(name.len() + 1).expect("short names");
        let fields = [
            ino, mode, 0, 0, nlink, 0, size, 0, 0, rdev.0, rdev.1, namesize, 0,
        ];
        self.out.extend_from_slice(b"070701");
        for f in fields {
            self.out.extend_from_slice(format!("{f:08x}").as_bytes());
        }
        self.out.extend_from_slice(name.as_bytes());
        self.out.push(0);
        self.pad();
        self.out.extend_from_slice(data);
        self.pad();
    }

    fn pad(&mut self) {
        while !self.out.len().is_multiple_of(4) {
            self.out.push(0);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Reads back (name, mode, data) entries: the layout the kernel parses.
    fn parse(mut b: &[u8]) -> Vec<(String, u32, Vec<u8>)> {
        let mut entries = Vec::new();
        let total = b.len();
        loop {
            assert_eq!(&b[..6], b"070701");
            let field = |i: usize| {
                u32::from_str_radix(std::str::from_utf8(&b[6 + 8 * i..14 + 8 * i]).unwrap(), 16)
                    .unwrap() as usize
            };
            let (mode, size, namesize) = (field(1), field(6), field(11));
            let name = String::from_utf8(b[110..110 + namesize - 1].to_vec()).unwrap();
            let data_start = (110 + namesize).div_ceil(4) * 4;
            let data = b[data_start..data_start + size].to_vec();
            let next = (data_start + size).div_ceil(4) * 4;
            assert_eq!((total - b.len() + next) % 4, 0);
            b = &b[next..];
            if name == "TRAILER!!!" {
                assert!(b.is_empty());
                return entries;
            }
            entries.push((name, mode as u32, data));
        }
    }

    #[test]
    fn round_trips_files_dirs_and_devices() {
        let mut w = Writer::new();
        w.dir("bin");
        w.file("init", 0o755, b"#!/bin/sh\n");
        w.file("odd", 0o644, b"12345");
        w.char_device("dev/console", 5, 1);
        let entries = parse(&w.finish());
        assert_eq!(entries.len(), 4);
        assert_eq!(entries[0], ("bin".into(), S_IFDIR | 0o755, vec![]));
        assert_eq!(
            entries[1],
            ("init".into(), S_IFREG | 0o755, b"#!/bin/sh\n".to_vec())
        );
        assert_eq!(entries[2].2, b"12345");
        assert_eq!(entries[3].1, S_IFCHR | 0o600);
    }
}
